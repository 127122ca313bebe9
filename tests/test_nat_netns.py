"""NAT traversal across real NATs: Linux network namespaces, nftables masquerade, real daemons.

Three real daemons: a public bootstrap + relay node, and two nodes each behind
its own NAT. They find each other through the DHT, connect through the
relay, and DCUtR upgrades the connection to a direct one. Behind NATs that
map every connection to a random port no direct path exists, and the relayed
connection still carries traffic. The tests skip only where the lab cannot
be built (not root, namespaces refused, `ip` or `nft` missing), and say so.

The lab is `locomesh.node.nat.netns_lab.NatLab` (a relay host on the "internet", two hosts each
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
from locomesh.node.nat.netns_lab import (
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

    from locomesh.training.checkpoint import write_checkpoint

    values = np.random.default_rng(7).standard_normal(1 << 20).astype(np.float32)
    tensors = {"w": torch.from_numpy(values)}
    manifest = write_checkpoint(directory, tensors, {"round": 1, "run": b""}, chunk_size=256 * 1024)
    return tensors, manifest.id


@pytest.mark.slow
def test_behind_symmetric_nats_the_relay_carries_a_whole_checkpoint_download(lab_factory, tmp_path):
    import torch

    from locomesh.training.checkpoint import load_checkpoint

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
