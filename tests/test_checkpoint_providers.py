"""Checkpoint providers in the DHT: nodes in one process (real libp2p hosts on loopback, real Kademlia).

Every node runs the daemon's `RunRegistryService` (which owns its `Discovery`) and a `CheckpointService`
wired to it, as `default_services` does.
"""

from __future__ import annotations

import numpy as np
import torch
import trio
from multiaddr import Multiaddr

from locomesh.dht import records
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.runs.registry import RunRegistryService
from locomesh.node.runtime import Node
from locomesh.node.transfer.store import load_checkpoint, write_checkpoint

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def small_checkpoint(directory, seed: int = 5) -> bytes:
    values = np.random.default_rng(seed).standard_normal(6000).astype(np.float32)
    return write_checkpoint(directory, {"w": torch.from_numpy(values)}, {"round": 3, "run": b""}, chunk_size=4096).id


class _Member:
    """One node: a DHT (through the run registry) and a checkpoint service that announces to it."""

    def __init__(self, tmp_path, identity, bootstrap: list[Multiaddr]) -> None:
        self.registry = RunRegistryService(tmp_path / identity.peer_id[-8:])
        self.checkpoints = CheckpointService(
            tmp_path / identity.peer_id[-8:] / "checkpoints", dataplane=False, discovery=lambda: self.registry.discovery
        )
        self.node = Node.create(identity, listen_addrs=LOOPBACK, services=[self.registry, self.checkpoints], bootstrap=bootstrap)

    @property
    def address(self) -> Multiaddr:
        return Multiaddr(self.node.listen_addresses()[0])


async def _until(predicate, *, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_installed_checkpoints_are_announced_and_a_download_without_providers_finds_them(tmp_path, identity_factory):
    seed_member = _Member(tmp_path, identity_factory(40), [])
    async with trio.open_nursery() as nursery:
        await nursery.start(seed_member.node.run)
        members = [_Member(tmp_path, identity_factory(41 + i), [seed_member.address]) for i in range(4)]
        # Two providers hold the same checkpoint (same bytes: same ID), written before they start.
        checkpoint_id = small_checkpoint(members[0].checkpoints.directory)
        assert small_checkpoint(members[1].checkpoints.directory) == checkpoint_id
        for member in members:
            await nursery.start(member.node.run)
        await _until(lambda: all(checkpoint_id in m.checkpoints.announced for m in members[:2]))

        downloader = members[2].checkpoints
        progress = downloader.start_download(checkpoint_id, [], transport="libp2p")
        await _until(lambda: progress.state not in ("manifest", "chunks"))
        assert progress.state == "done", progress.error
        assert set(progress.providers) == {members[0].node.peer_id, members[1].node.peer_id}
        assert load_checkpoint(downloader.directory, checkpoint_id)[1]["round"] == 3

        # The downloader announces what it now holds; a lookup finds each provider once, itself included.
        await _until(lambda: checkpoint_id in downloader.announced)
        found = await members[3].registry.discovery.find_providers(records.checkpoint_key(checkpoint_id))
        holders = {m.node.peer_id for m in members[:3]}
        assert len(found) == len({str(info.peer_id) for info in found})
        assert {str(info.peer_id) for info in found} == holders
        nursery.cancel_scope.cancel()


async def test_a_download_of_a_checkpoint_nobody_provides_fails_clearly(tmp_path, identity_factory):
    seed_member = _Member(tmp_path, identity_factory(50), [])
    async with trio.open_nursery() as nursery:
        await nursery.start(seed_member.node.run)
        member = _Member(tmp_path, identity_factory(51), [seed_member.address])
        await nursery.start(member.node.run)
        await member.registry.discovery.wait_seeded()
        progress = member.checkpoints.start_download(b"\x07" * 32, [])
        await _until(lambda: progress.state not in ("manifest", "chunks"))
        nursery.cancel_scope.cancel()
    assert progress.state == "failed" and "no provider" in progress.error


async def test_without_a_dht_a_download_needs_its_providers(tmp_path, identity_factory):
    service = CheckpointService(tmp_path / "alone", dataplane=False)
    node = Node.create(identity_factory(52), listen_addrs=LOOPBACK, services=[service])
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        progress = service.start_download(b"\x07" * 32, [])
        await _until(lambda: progress.state not in ("manifest", "chunks"))
        nursery.cancel_scope.cancel()
    assert progress.state == "failed" and "no DHT" in progress.error
