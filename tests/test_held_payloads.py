"""A round's payloads fetched into memory, served on from there, never written to disk
(node/transfer/held.py, issue #20)."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.peer_scores import PeerScores
from locomesh.node.runtime import Node
from locomesh.node.transfer.download import DownloadProgress, download_checkpoint
from locomesh.node.transfer.held import HeldCheckpoint, HeldCheckpoints
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.transfer.store import write_checkpoint
from locomesh.training.checkpoint_manifest import CheckpointError, LimitError, TensorSpec
from locomesh.training.state_chunks import checkpoint_limits, chunk_state

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
RUN = bytes(range(32))
SIZE = 20_000  # five chunks of 4 KiB
CHUNK = 4096


def payload_bytes(seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def payload_chunks(payload: bytes, round_number: int = 3):
    """(manifest, frames) of `payload` as the round writes one (`PayloadExchange.store`)."""
    chunks = chunk_state({"payload": np.frombuffer(payload, dtype=np.uint8)},
                         {"round": round_number, "run": RUN, "kind": "payload"}, chunk_size=CHUNK)
    frames = [frame for _, frame in chunks]
    return chunks.manifest(), frames


def limits(size: int = SIZE, round_number: int = 3):
    """`payload_limits` for our small chunks."""
    return checkpoint_limits({"payload": TensorSpec("uint8", (size,))}, {"run": RUN, "round": round_number, "kind": "payload"},
                             chunk_size=CHUNK)


def test_a_held_payload_inflates_once_to_its_bytes():
    payload = payload_bytes()
    manifest, frames = payload_chunks(payload)
    held = HeldCheckpoint(manifest)
    for index in reversed(range(len(frames))):
        assert not held.complete
        held.store(index, frames[index])
    arrays, metadata = held.arrays(limits())
    assert bytes(arrays["payload"]) == payload
    assert metadata == {"round": 3, "run": RUN, "kind": "payload"}


def test_a_chunk_that_does_not_hash_to_the_manifest_is_refused():
    manifest, frames = payload_chunks(payload_bytes())
    held = HeldCheckpoint(manifest)
    with pytest.raises(CheckpointError) as refused:
        held.store(0, frames[1])
    assert refused.value.code == "bad-chunk" and held.missing() == list(range(len(frames)))


def test_an_incomplete_or_foreign_payload_gives_no_bytes():
    manifest, frames = payload_chunks(payload_bytes())
    held = HeldCheckpoint(manifest)
    held.store(0, frames[0])
    with pytest.raises(CheckpointError) as incomplete:
        held.arrays(limits())
    assert incomplete.value.code == "missing-chunk"
    for index, frame in enumerate(frames):
        held.store(index, frame)
    with pytest.raises(LimitError):  # a payload of another size than the commit named
        held.arrays(limits(size=SIZE - 1))
    with pytest.raises(LimitError):  # of another round
        held.arrays(limits(round_number=4))


def test_held_payloads_are_released_by_round():
    registry = HeldCheckpoints()
    for round_number in (3, 4, 5):
        manifest, frames = payload_chunks(payload_bytes(round_number), round_number)
        for index, frame in enumerate(frames):
            registry.hold(manifest).store(index, frame)
    assert len(registry) == 3 and registry.bytes_held > 3 * SIZE
    assert registry.release(lambda manifest: manifest.round < 5) == 2
    assert len(registry) == 1


async def test_a_fetched_payload_is_kept_in_memory_and_served_on_from_there(tmp_path, identity_factory):
    """The author stores its payload; a peer fetches it into memory (nothing of it on its disk) and
    a third peer fetches it from that peer alone."""
    payload = payload_bytes(7)
    manifest = write_checkpoint(tmp_path / "author", {"payload": np.frombuffer(payload, dtype=np.uint8)},
                                {"round": 3, "run": RUN, "kind": "payload"}, chunk_size=CHUNK)
    relay_service = CheckpointService(tmp_path / "relay")
    author = Node.create(identity_factory(31), listen_addrs=LOOPBACK, services=[CheckpointService(tmp_path / "author")])
    relay = Node.create(identity_factory(32), listen_addrs=LOOPBACK, services=[relay_service])
    late = Node.create(identity_factory(33), listen_addrs=LOOPBACK)
    late_held = HeldCheckpoints()
    async with trio.open_nursery() as nursery:
        for node in (author, relay, late):
            await nursery.start(node.run)
        with trio.fail_after(30):
            await download_checkpoint(relay, tmp_path / "relay", manifest.id, [author.listen_addresses()[0]],
                                      scores=PeerScores(), progress=DownloadProgress(manifest.id),
                                      limits=limits(), held=relay_service.held)
            await download_checkpoint(late, tmp_path / "late", manifest.id, [relay.listen_addresses()[0]],
                                      scores=PeerScores(), progress=DownloadProgress(manifest.id),
                                      limits=limits(), held=late_held)
        nursery.cancel_scope.cancel()
    assert not any(path.is_file() for path in (tmp_path / "relay").rglob("*"))  # nothing written
    assert bytes(late_held.complete(manifest.id).arrays(limits())[0]["payload"]) == payload
    assert relay_service.bytes_served >= SIZE
