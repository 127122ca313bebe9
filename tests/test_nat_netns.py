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

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from locomesh.cli.daemon_process import DaemonProcess
from .netns_lab import (
    LabUnavailable,
    NatLab,
    missing_tools,
    peer_connection,
    rpc,
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
            return daemon

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
