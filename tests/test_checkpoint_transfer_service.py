"""The checkpoint service in-process (two real libp2p hosts in one trio loop): backpressure and strict input."""

from __future__ import annotations

import numpy as np
import torch
import trio
from multiaddr import Multiaddr

from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.runtime import Node
from locomesh.node.streams import read_frame_or_eof, write_frame
from locomesh.protocol import encode
from locomesh.protocol.kinds import PING
from locomesh.node.transfer.states import RUNNING_STATES
from locomesh.node.transfer.store import write_checkpoint

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def small_checkpoint(directory, seed: int = 5) -> bytes:
    values = np.random.default_rng(seed).standard_normal(5000).astype(np.float32)
    return write_checkpoint(directory, {"w": torch.from_numpy(values)}, {"round": 1, "run": b""}, chunk_size=4096).id


async def wait_finished(service: CheckpointService, checkpoint_id: bytes) -> dict:
    with trio.fail_after(30):
        while service.downloads[checkpoint_id].state in RUNNING_STATES:
            await trio.sleep(0.02)
    return service.downloads[checkpoint_id].to_json()


async def test_a_provider_at_its_upload_limit_answers_busy_and_is_given_up_on(tmp_path, identity_factory):
    checkpoint_id = small_checkpoint(tmp_path / "provider")
    full = CheckpointService(tmp_path / "provider", max_uploads=0)  # every request finds the limit reached
    asker = CheckpointService(tmp_path / "asker")
    provider = Node.create(identity_factory(11), listen_addrs=LOOPBACK, services=[full])
    downloader = Node.create(identity_factory(12), listen_addrs=LOOPBACK, services=[asker])
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(downloader.run)
        asker.start_download(checkpoint_id, [provider.listen_addresses()[0]], transport="libp2p")
        progress = await wait_finished(asker, checkpoint_id)
        busy = provider.metrics["locomesh_checkpoint_served_total"].get(answer="busy")
        nursery.cancel_scope.cancel()
    assert progress["state"] == "failed" and "no provider gave the manifest" in progress["error"]
    assert "busy" in progress["error"] and busy >= 1


async def test_a_malformed_request_resets_the_stream_and_is_counted(tmp_path, identity_factory):
    service = CheckpointService(tmp_path / "provider", dataplane=False)
    provider = Node.create(identity_factory(13), listen_addrs=LOOPBACK, services=[service])
    client = Node.create(identity_factory(14), listen_addrs=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(client.run)
        await client.connect(Multiaddr(provider.listen_addresses()[0]))
        stream = await client.open_stream(provider.peer_id, [wire.PROTOCOL_ID])
        # A valid envelope of the wrong kind: refused by kind before anything else is looked at.
        await write_frame(stream, encode(client.identity, PING.name, {"nonce": bytes(16)}), timeout=5)
        try:
            answer = await read_frame_or_eof(stream, max_size=1024, timeout=10)
        except Exception:  # noqa: BLE001 - a reset stream shows as one of several errors
            answer = None
        errors = provider.metrics["locomesh_protocol_errors_total"]
        with trio.fail_after(5):
            while errors.get(code="unexpected-kind") == 0:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert answer is None


async def test_a_manifest_that_does_not_hash_to_the_id_is_a_strike(tmp_path, identity_factory):
    wanted_id = small_checkpoint(tmp_path / "wanted", seed=1)
    other_id = small_checkpoint(tmp_path / "other", seed=2)
    other_manifest = (tmp_path / "other" / "manifests" / f"{other_id.hex()}.msgpack").read_bytes()
    liar = Node.create(identity_factory(15), listen_addrs=LOOPBACK)

    async def answer_with_another_manifest(stream) -> None:
        while await wire.next_request(stream, wire.remote_peer(stream), idle_timeout=10) is not None:
            await wire.answer(stream, liar.identity, wire.OK, other_manifest, timeout=10)

    liar.set_stream_handler(wire.PROTOCOL_ID, answer_with_another_manifest, timeout=None)
    asker = CheckpointService(tmp_path / "asker")
    downloader = Node.create(identity_factory(16), listen_addrs=LOOPBACK, services=[asker])
    async with trio.open_nursery() as nursery:
        await nursery.start(liar.run)
        await nursery.start(downloader.run)
        asker.start_download(wanted_id, [liar.listen_addresses()[0]])
        progress = await wait_finished(asker, wanted_id)
        nursery.cancel_scope.cancel()
    assert progress["state"] == "failed" and "wrong-id" in progress["error"]
    score = asker.scores.get(liar.peer_id)
    assert score.strikes == 1 and score.score < 0 and "hash" in score.last_strike


async def test_a_download_made_elsewhere_is_listed_with_the_services_own_and_how_it_ended(tmp_path):
    """`tracked` (a run's dataset downloads, node/datasets/): shown by `checkpoint.progress` and
    ``node.status``; an exception before the end marks it failed, a cancellation cancelled."""
    service = CheckpointService(tmp_path)
    failing, cancelled, done = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    try:
        with service.tracked(failing) as progress:
            progress.state = "chunks"
            raise OSError("disk full")
    except OSError:
        pass
    with trio.CancelScope() as scope:
        with service.tracked(cancelled):
            scope.cancel()
            await trio.sleep(1)
    with service.tracked(done) as progress:
        progress.state = "done"
    shown = {progress.checkpoint_id: progress.to_json() for progress in service.downloads.values()}
    assert [shown[key]["state"] for key in (failing, cancelled, done)] == ["failed", "cancelled", "done"]
    assert shown[failing]["error"] == "disk full" and shown[cancelled]["error"] is None
    assert await service._rpc_progress(done.hex()) == shown[done]


async def test_a_download_made_elsewhere_does_not_hide_a_running_one_of_the_same_checkpoint(tmp_path):
    """While a download of a checkpoint runs, another one of it (a run's dataset) leaves it listed:
    its progress does not disappear from `checkpoint.progress`."""
    service = CheckpointService(tmp_path)
    checkpoint_id = b"\x04" * 32
    with service.tracked(checkpoint_id) as running:
        running.state = "chunks"
        with service.tracked(checkpoint_id) as second:
            second.state = "done"
            assert service.downloads[checkpoint_id] is running
        running.state = "done"
    with service.tracked(checkpoint_id) as after:  # the first has ended: a new one is listed
        assert service.downloads[checkpoint_id] is after
