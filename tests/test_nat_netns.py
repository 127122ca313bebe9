"""NAT traversal across real NATs: Linux network namespaces, nftables masquerade, real daemons.

Three real daemons: a public bootstrap + relay node, and two nodes each behind
its own NAT. They find each other through the DHT, connect through the
relay, and DCUtR upgrades the connection to a direct one. Behind NATs that
map every connection to a random port no direct path exists, and the relayed
connection still carries traffic. Behind a router that speaks NAT-PMP (a
responder in the NAT namespace that adds nftables DNAT rules), a node maps
its port and the dial-back check proves the mapped address. The tests skip
only where the lab cannot be built (not root, namespaces refused, `ip` or
`nft` missing), and say so.

The lab is `tests/netns_lab.py`'s `NatLab` (a relay host on the "internet", two hosts each
behind its own nftables masquerade).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from locomesh.cli.daemon_process import DaemonProcess
from .netns_lab import (
    CgnatLab,
    LabUnavailable,
    NatLab,
    missing_tools,
    peer_connection,
    rpc,
    start_cgnat,
    start_daemon,
    start_three,
    wait_private_with_reservation,
    wait_until,
)


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture
def lab_factory(tmp_path):
    """Build labs (skipping with the reason when this machine cannot); stop daemons, then remove namespaces."""
    reason = missing_tools()
    if reason is not None:
        pytest.skip(reason)
    labs: list[NatLab] = []
    daemons: list[DaemonProcess] = []

    def make(symmetric: bool) -> tuple[NatLab, Callable[..., DaemonProcess]]:
        lab = NatLab(f"{os.getpid() % 10000}{len(labs)}", symmetric=symmetric)
        labs.append(lab)
        try:
            lab.build()
        except LabUnavailable as error:
            pytest.skip(str(error))

        def start(ns: str, name: str, **options: Any) -> DaemonProcess:
            daemon = start_daemon(lab, ns, tmp_path / name, **options)
            daemons.append(daemon)
            start.by_name[name] = daemon  # type: ignore[attr-defined]
            return daemon

        start.by_name = {}  # type: ignore[attr-defined]  # the latest daemon started under each name
        return lab, start

    yield make
    for daemon in daemons:
        daemon.stop()
    for lab in labs:
        lab.close()


@pytest.mark.slow
def test_two_nodes_behind_nats_meet_through_the_relay_and_punch_a_hole(lab_factory, tmp_path):
    lab, start = lab_factory(symmetric=False)
    relay_id, first, second = start_three(lab, start, tmp_path)
    relay_status = rpc(lab.relay_ns, tmp_path / "relay", "node.status")
    assert relay_status["relay"]["offering"] is True
    wait_private_with_reservation(lab, tmp_path, relay_id)
    # The bootstrap node is public: the NATed hosts, strangers to it, dialled it (no probe needed).
    reachability = rpc(lab.relay_ns, tmp_path / "relay", "node.status")["reachability"]
    assert reachability["verdict"] == "public" and {e["dialer"] for e in reachability["evidence"]} & {first, second}

    # host2 looks host1 up in the DHT by peer ID: its direct address (behind NAT) fails, its relay address works.
    def connect() -> dict:
        return rpc(lab.host_ns[1], tmp_path / "host2", "nat.connect", {"peer_id": first})

    assert wait_until("host2 connects to host1", connect, 60)["connection"] == "relayed"
    # DCUtR then punches through both NATs, and the peers table says so on both sides.
    wait_until(
        "hole-punched on host2",
        lambda: peer_connection(lab.host_ns[1], tmp_path / "host2", first) == "hole-punched",
        40,
    )
    assert peer_connection(lab.host_ns[0], tmp_path / "host1", second) == "hole-punched"
    ping = rpc(lab.host_ns[1], tmp_path / "host2", "node.ping", {"peer_id": first})
    assert ping["rtt_ms"] > 0


def write_test_checkpoint(directory: Path) -> tuple[Any, bytes]:
    """About 4 MiB of incompressible float32 in 16 chunks; returns (tensors, checkpoint ID)."""
    import numpy as np
    import torch

    from locomesh.node.transfer.store import write_checkpoint

    values = np.random.default_rng(7).standard_normal(1 << 20).astype(np.float32)
    tensors = {"w": torch.from_numpy(values)}
    manifest = write_checkpoint(directory, tensors, {"round": 1, "run": b""}, chunk_size=256 * 1024)
    return tensors, manifest.id


@pytest.mark.slow
def test_behind_symmetric_nats_the_relay_carries_a_whole_checkpoint_download(lab_factory, tmp_path):
    import torch

    from locomesh.node.transfer.store import load_checkpoint

    tensors, checkpoint_id = write_test_checkpoint(tmp_path / "host1" / "checkpoints")
    lab, start = lab_factory(symmetric=True)
    relay_id, first, second = start_three(lab, start, tmp_path)
    wait_private_with_reservation(lab, tmp_path, relay_id)
    host2 = (lab.host_ns[1], tmp_path / "host2")
    connect = lambda: rpc(*host2, "nat.connect", {"peer_id": first})  # noqa: E731
    assert wait_until("host2 connects to host1", connect, 60)["connection"] == "relayed"

    # Over libp2p streams (the data plane is a direct TCP path, which these NATs do not allow).
    rpc(*host2, "checkpoint.fetch", {"id": checkpoint_id.hex(), "providers": [first], "transport": "libp2p"})

    def finished() -> dict | None:
        progress = rpc(*host2, "checkpoint.progress", {"id": checkpoint_id.hex()})
        return None if progress["state"] in ("manifest", "chunks") else progress

    progress = wait_until("the download through the relay", finished, 120)
    assert progress["state"] == "done", progress
    loaded, _ = load_checkpoint(tmp_path / "host2" / "checkpoints", checkpoint_id)
    assert torch.equal(loaded["w"], tensors["w"])
    # DCUtR tried meanwhile and could not: each connection gets a random port at both NATs.
    assert peer_connection(*host2, first) == "relayed"
    assert rpc(lab.relay_ns, tmp_path / "relay", "node.status")["relay"]["offering"] is True


# A NAT-PMP gateway for the NAT router of the lab: it answers RFC 6886 requests on the LAN side and
# forwards each mapped port with an nftables DNAT rule, as a home router does.
_NATPMP_GATEWAY = r"""
import socket, struct, subprocess, sys
lan_ip, public_ip = sys.argv[1], sys.argv[2]
def nft(script):
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)
nft("table ip portmap {\n  chain pre { type nat hook prerouting priority -100; }\n}\n")
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((lan_ip, 5351))
print("ready", flush=True)
mapped = {}  # (client ip, internal port) -> external port
while True:
    data, (client, port) = sock.recvfrom(64)
    if data == b"\0\0":
        reply = struct.pack("!BBHI", 0, 128, 0, 0) + socket.inet_aton(public_ip)
    elif len(data) == 12 and data[:2] == b"\0\x02":
        _, _, _, internal, suggested, lifetime = struct.unpack("!BBHHHI", data)
        key = (client, internal)
        if lifetime == 0:
            mapped.pop(key, None)
        elif key not in mapped:
            mapped[key] = suggested or 40000 + len(mapped)
        rules = "".join(
            f'add rule ip portmap pre iifname "pub" tcp dport {external} dnat to {ip}:{inner}\n'
            for (ip, inner), external in mapped.items()
        )
        nft("flush chain ip portmap pre\n" + rules)
        reply = struct.pack("!BBHIHHI", 0, 130, 0, 0, internal, mapped.get(key, 0), lifetime)
    else:
        reply = struct.pack("!BBHI", 0, 128 + data[1] if len(data) > 1 else 128, 5, 0)
    sock.sendto(reply, (client, port))
"""


@pytest.mark.slow
def test_a_node_behind_a_nat_pmp_router_maps_its_port_and_becomes_public(lab_factory, tmp_path):
    """host1's router speaks NAT-PMP: host1 finds itself private, maps its port, and the dial-back proves it."""
    import subprocess
    import sys

    from .netns_lab import HOST_IPS, NAT_PUBLIC_IPS, PORT

    lab, start = lab_factory(symmetric=False)
    gateway = subprocess.Popen(
        [*lab.exec_prefix(lab.nat_ns[0]), sys.executable, "-c", _NATPMP_GATEWAY, "10.1.0.1", NAT_PUBLIC_IPS[0]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert gateway.stdout.readline().strip() == "ready", "the NAT-PMP responder did not start"
        relay_id, first, _ = start_three(lab, start, tmp_path)

        def mapping() -> dict:
            return rpc(lab.host_ns[0], tmp_path / "host1", "node.status")["port_mapping"]

        mapped = wait_until("host1 maps its port", lambda: mapping().get("external_addr"), 90)
        assert mapped == f"/ip4/{NAT_PUBLIC_IPS[0]}/tcp/{PORT}" and mapping()["protocol"] == "nat-pmp"
        status = wait_until(
            "host1 is dialled back at the mapped address",
            lambda: (lambda s: s if s["reachability"]["verdict"] == "public" else None)(
                rpc(lab.host_ns[0], tmp_path / "host1", "node.status")
            ),
            60,
        )
        assert mapped in status["reachability"]["confirmed_addrs"] and status["port_mapping"]["confirmed"]
        # host2's router has no NAT-PMP: it stays private and says why.
        other = rpc(lab.host_ns[1], tmp_path / "host2", "node.status")
        assert other["reachability"]["verdict"] == "private" and "external_addr" not in other["port_mapping"]
        assert HOST_IPS[0] not in mapped
    finally:
        gateway.kill()
        gateway.wait(timeout=10)


# --- behind a carrier-grade NAT, and a relay that restarts --------------------------------------


@pytest.fixture
def cgnat_lab(tmp_path):
    """A `CgnatLab` with a relay, a port-restricted host and the two hosts behind the carrier, all private."""
    reason = missing_tools()
    if reason is not None:
        pytest.skip(reason)
    lab = CgnatLab(f"{os.getpid() % 10000}c")
    daemons: list[DaemonProcess] = []

    def start(ns: str, name: str, **options: Any) -> None:
        daemons.append(start_daemon(lab, ns, tmp_path / name, **options))

    try:
        try:
            lab.build()
        except LabUnavailable as error:
            pytest.skip(str(error))
        yield lab, start_cgnat(lab, start, tmp_path)
    finally:
        for daemon in daemons:
            daemon.stop()
        lab.close()


@pytest.mark.slow
def test_two_hosts_behind_one_cgnat_on_the_same_port_both_punch_through_to_a_port_restricted_peer(cgnat_lab):
    """Both homes listen at 192.168.30.2:4001; the carrier gave home2's port 4001 the outside port 3192.
    Each host advertises where peers saw it, so the port-restricted host punches to both, each at its
    own mapping, and nobody dials an address that is its own."""
    from .netns_lab import CGNAT_PUBLIC_IP, PORT, REMAPPED_PORT

    lab, hosts = cgnat_lab
    pr_ns, pr_dir, _ = hosts["pr"]
    connected_at = {}
    for name in ("host1", "host2"):  # what `locomesh peers connect PEER_ID` does, run inside pr's namespace
        command = [*lab.exec_prefix(pr_ns), sys.executable, "-m", "locomesh.cli.main", "peers", "connect",
                   hosts[name][2], "--data-dir", str(pr_dir), "--json"]
        answer = wait_until(
            f"pr connects to {name}",
            lambda: _json_if_ok(subprocess.run(command, capture_output=True, text=True, timeout=120)), 60,
        )
        assert answer == {"peer_id": hosts[name][2], "connection": "relayed"}
        connected_at[name] = time.monotonic()
    for name, expected_port in (("host1", PORT), ("host2", REMAPPED_PORT)):
        peer_id = hosts[name][2]
        deadline = 60 - (time.monotonic() - connected_at[name])
        wait_until(f"pr and {name} hole-punched", lambda: peer_connection(pr_ns, pr_dir, peer_id) == "hole-punched", deadline)
        [entry] = [peer for peer in rpc(pr_ns, pr_dir, "node.peers") if peer["peer_id"] == peer_id]
        assert any(f"/ip4/{CGNAT_PUBLIC_IP}/tcp/{expected_port}" in address for address in entry["connection_addrs"]), entry
    for name in ("host1", "host2"):
        ns, data_dir, _ = hosts[name]
        assert peer_connection(ns, data_dir, hosts["pr"][2]) == "hole-punched"


def _json_if_ok(result: subprocess.CompletedProcess) -> Any:
    return json.loads(result.stdout) if result.returncode == 0 else None


@pytest.mark.slow
def test_relayed_links_come_back_by_themselves_after_the_relay_restarts(lab_factory, tmp_path):
    """Behind symmetric NATs only the relay connects the two hosts. host2 asks to keep its link to host1;
    the relay dies and returns 20 s later; the link comes back with nobody asking again."""
    from .netns_lab import PORT, PUBLIC_IP

    lab, start = lab_factory(symmetric=True)
    relay_id, first, second = start_three(lab, start, tmp_path)
    wait_private_with_reservation(lab, tmp_path, relay_id)
    host2 = (lab.host_ns[1], tmp_path / "host2")
    keep = lambda: rpc(*host2, "nat.connect", {"peer_id": first, "keep": True})  # noqa: E731
    assert wait_until("host2 connects to host1", keep, 60)["connection"] == "relayed"

    start.by_name["relay"].stop()
    wait_until("the link drops with the relay", lambda: peer_connection(*host2, first) is None, 30)
    time.sleep(20)
    start(lab.relay_ns, "relay", listen=f"/ip4/{PUBLIC_IP}/tcp/{PORT}", env={"LOCOMESH_RELAY": "on"})
    wait_until("the relayed link is back", lambda: peer_connection(*host2, first) == "relayed", 120)
    assert peer_connection(lab.host_ns[0], tmp_path / "host1", second) == "relayed"
