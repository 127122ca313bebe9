"""Upload slots (issue #34, finding 1): a squatter that asks and never reads cannot take a provider's
every upload slot. Shares per peer, members before strangers and write deadlines, first sans-IO,
then between real libp2p hosts on loopback (libp2p streams and the data plane)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trio
from multiaddr import Multiaddr

from locomesh.node.replication.service import CrdtService
from locomesh.node.transfer import slots as slots
from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.dataplane import open_sealed_stream
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.transfer.slots import UploadSlots, write_deadline
from locomesh.node.transfer.states import RUNNING_STATES
from locomesh.node.transfer.store import write_checkpoint
from locomesh.node.runtime import Node
from locomesh.node.streams import read_frame, write_frame
from locomesh.protocol import encode, peer_id_from_public_key
from locomesh.protocol.kinds import CKPT_GET_CHUNK, CKPT_REPLY

from .test_crdt_support import certify, joined_replica, keys

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
MiB = 1024 * 1024
# An answer a reader holds up by not reading: larger than what a loopback socket pair buffers, and
# several times the Yamux window a stream has grown to once its protocol is negotiated (1-2 MiB).
SQUATTED_CHUNK = 8 * MiB


# --- sans-IO ---------------------------------------------------------------------------------


def test_one_peer_holds_at_most_its_share_and_gets_slots_back_as_it_releases_them():
    uploads = UploadSlots(16, per_peer=4)
    taken = [uploads.take("squatter") for _ in range(16)]
    assert sum(slot is not None for slot in taken) == 4 and uploads.held_by("squatter") == 4
    assert uploads.take("honest") is not None
    taken[0].release()
    taken[0].release()  # a second release gives nothing back twice
    assert uploads.held_by("squatter") == 3 and uploads.in_use == 4
    assert uploads.take("squatter") is not None and uploads.take("squatter") is None


def test_strangers_share_part_of_the_slots_and_members_may_use_them_all():
    members = {"member"}
    uploads = UploadSlots(16, per_peer=16, strangers=8, is_member=members.__contains__)
    assert sum(uploads.take(f"stranger-{i % 3}") is not None for i in range(16)) == 8
    assert uploads.take("another stranger") is None and uploads.strangers_in_use == 8
    assert sum(uploads.take("member") is not None for _ in range(16)) == 8 and uploads.in_use == 16
    assert UploadSlots(16, strangers=8).strangers == 16  # nobody to tell apart: nothing kept back


def test_slots_are_kept_for_members_with_standing_not_for_any_key_that_joined():
    """A join is free in an open run, so a Sybil that joined is still a stranger to the slots; the
    creator (a say from genesis), a key admitted at genesis once a certified round admitted its
    join, and a fresh key once its counted work earned it a say (crdt/membership.py) are not."""
    members, sybil = keys(3), keys(1, offset=50)[0]
    creator, admitted, fresh = members
    replica = joined_replica(members, admitted=[admitted.public_key], earn_rounds=1)
    crdt = CrdtService()
    crdt.replicas[replica.run_id] = replica

    def standing() -> list[bool]:
        return [crdt.has_standing(peer_id_from_public_key(m.public_key)) for m in (*members, sybil)]

    assert standing() == [True, False, False, False]  # no round certified: only the creator has a say
    certify(replica, members)  # round 1 admits the joins: the admitted key has a say, the fresh one must earn it
    replica.create(sybil, "join", round=2)
    assert standing() == [True, True, False, False]
    assert fresh.public_key in replica.contributors(2), "the fresh key is drawn to commit in round 2"
    certify(replica, members)  # its payload counts in round 2: its one round of work earns it a say
    assert replica.state.round == 2 and fresh.public_key in replica.chain.tip.electorate
    assert standing() == [True, True, True, False], "the Sybil joined and did no work: still a stranger"
    assert sybil.public_key in replica.state.members
    assert not crdt.has_standing("not a peer id")


def test_the_write_deadline_grows_with_the_answer_and_with_the_nodes_own_cap():
    assert write_deadline(0) == slots.WRITE_BASE
    assert write_deadline(4 * MiB) == pytest.approx(slots.WRITE_BASE + 4 * MiB / slots.MIN_UPLOAD_RATE)
    capped = write_deadline(4 * MiB, upload_cap=16 * 16 * 1024, slots=16)  # 16 KiB/s per slot
    assert capped == pytest.approx(slots.WRITE_BASE + 4 * MiB / (16 * 1024))


# --- over real hosts -------------------------------------------------------------------------


def large_checkpoint(directory, *, chunk_size: int, chunks: int = 1) -> bytes:
    """A checkpoint of `chunks` chunks of about `chunk_size` bytes each, too large for a stream's
    window or a socket's buffers, so an answer that is not read holds its slot."""
    values = np.random.default_rng(3).standard_normal(chunks * chunk_size // 4).astype(np.float32)
    return write_checkpoint(directory, {"w": torch.from_numpy(values)}, {"round": 1, "run": b""},
                            chunk_size=chunk_size).id


def small_checkpoint(directory) -> bytes:
    values = np.random.default_rng(5).standard_normal(5000).astype(np.float32)
    return write_checkpoint(directory, {"w": torch.from_numpy(values)}, {"round": 2, "run": b""}, chunk_size=4096).id


async def squat(node: Node, provider: Node, checkpoint_id: bytes, streams: int, *, dataplane: bool = False) -> list:
    """Open `streams` streams to `provider` and ask on each for chunk 0, never reading an answer;
    the streams, held open."""
    request = encode(node.identity, CKPT_GET_CHUNK.name, {"id": checkpoint_id, "index": 0})
    held = []
    for _ in range(streams):
        if dataplane:
            stream = await open_sealed_stream(node, provider.peer_id)
        else:
            stream = await node.open_stream(provider.peer_id, [wire.PROTOCOL_ID])
        await write_frame(stream, request, timeout=5)
        held.append(stream)
    return held


async def answered(provider: Node, requests: int) -> dict[str, int]:
    """Once `provider` has taken up `requests` chunk requests (begun an answer, or answered busy):
    how many of each. An answer begun to a reader that does not read holds its slot."""
    served = provider.metrics["locomesh_checkpoint_served_total"]
    with trio.fail_after(10):
        while (counts := {answer: int(served.get(answer=answer)) for answer in ("chunk-ok", "busy")}) \
                and sum(counts.values()) < requests:
            await trio.sleep(0.01)
    return counts


async def download(service: CheckpointService, provider: Node, checkpoint_id: bytes, transport: str) -> dict:
    service.start_download(checkpoint_id, [provider.listen_addresses()[0]], transport=transport)
    with trio.fail_after(30):
        while service.downloads[checkpoint_id].state in RUNNING_STATES:
            await trio.sleep(0.02)
    return service.downloads[checkpoint_id].to_json()


async def test_a_squatter_with_16_unread_streams_does_not_stop_an_honest_download(tmp_path, identity_factory):
    squatted_id = large_checkpoint(tmp_path / "provider", chunk_size=SQUATTED_CHUNK)
    wanted_id = small_checkpoint(tmp_path / "provider")
    service, asker = CheckpointService(tmp_path / "provider", dataplane=False), CheckpointService(tmp_path / "asker")
    provider = Node.create(identity_factory(41), listen_addrs=LOOPBACK, services=[service])
    squatter = Node.create(identity_factory(42), listen_addrs=LOOPBACK)
    honest = Node.create(identity_factory(43), listen_addrs=LOOPBACK, services=[asker])
    async with trio.open_nursery() as nursery:
        for node in (provider, squatter, honest):
            await nursery.start(node.run)
        await squatter.connect(Multiaddr(provider.listen_addresses()[0]))
        held = await squat(squatter, provider, squatted_id, 16)
        await answered(provider, 16)
        progress = await download(asker, provider, wanted_id, "libp2p")
        nursery.cancel_scope.cancel()
    assert progress["state"] == "done", progress["error"]
    assert len(held) == 16


async def test_one_peer_is_answered_busy_past_its_share_and_holds_no_more(tmp_path, identity_factory):
    squatted_id = large_checkpoint(tmp_path / "provider", chunk_size=SQUATTED_CHUNK)
    service = CheckpointService(tmp_path / "provider", dataplane=False)
    provider = Node.create(identity_factory(44), listen_addrs=LOOPBACK, services=[service])
    squatter = Node.create(identity_factory(45), listen_addrs=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(squatter.run)
        await squatter.connect(Multiaddr(provider.listen_addresses()[0]))
        held = await squat(squatter, provider, squatted_id, 16)
        counts = await answered(provider, 16)
        await trio.sleep(0.2)  # nothing more is answered: the share's answers are stuck, unread
        again = await answered(provider, 16)
        nursery.cancel_scope.cancel()
    share = slots.MAX_UPLOADS_PER_PEER
    assert len(held) == 16 and counts == again == {"chunk-ok": share, "busy": 16 - share}


async def test_members_are_served_when_strangers_hold_every_slot_strangers_may(tmp_path, identity_factory):
    """Four stranger keys squat 4 streams each: they get the strangers' slots and no more, and a
    member of a run here still downloads."""
    squatted_id = large_checkpoint(tmp_path / "provider", chunk_size=SQUATTED_CHUNK)
    wanted_id = small_checkpoint(tmp_path / "provider")
    asker = CheckpointService(tmp_path / "member")
    member = Node.create(identity_factory(50), listen_addrs=LOOPBACK, services=[asker])
    service = CheckpointService(tmp_path / "provider", dataplane=False, is_member=lambda peer: peer == member.peer_id)
    provider = Node.create(identity_factory(51), listen_addrs=LOOPBACK, services=[service])
    strangers = [Node.create(identity_factory(52 + i), listen_addrs=LOOPBACK) for i in range(4)]
    async with trio.open_nursery() as nursery:
        for node in (provider, member, *strangers):
            await nursery.start(node.run)
        held = []
        for stranger in strangers:
            await stranger.connect(Multiaddr(provider.listen_addresses()[0]))
            held += await squat(stranger, provider, squatted_id, 4)
        counts = await answered(provider, 16)
        progress = await download(asker, provider, wanted_id, "libp2p")
        nursery.cancel_scope.cancel()
    assert progress["state"] == "done", progress["error"]
    assert len(held) == 16 and counts == {"chunk-ok": slots.MAX_STRANGER_UPLOADS, "busy": 16 - slots.MAX_STRANGER_UPLOADS}


async def test_a_reader_that_does_not_read_loses_its_slot_at_the_write_deadline(tmp_path, identity_factory, monkeypatch):
    """One slot in all; the squatter's answer (unread) is given up on at its deadline (made
    short here), its stream reset, well before Yamux's own 5 s stall timeout, and the slot serves
    an honest download."""
    monkeypatch.setattr(slots, "WRITE_BASE", 0.3)
    monkeypatch.setattr(slots, "MIN_UPLOAD_RATE", 1024 * MiB)
    squatted_id = large_checkpoint(tmp_path / "provider", chunk_size=SQUATTED_CHUNK)
    wanted_id = small_checkpoint(tmp_path / "provider")
    service = CheckpointService(tmp_path / "provider", dataplane=False, max_uploads=1)
    asker = CheckpointService(tmp_path / "asker")
    provider = Node.create(identity_factory(46), listen_addrs=LOOPBACK, services=[service])
    squatter = Node.create(identity_factory(47), listen_addrs=LOOPBACK)
    honest = Node.create(identity_factory(48), listen_addrs=LOOPBACK, services=[asker])
    async with trio.open_nursery() as nursery:
        for node in (provider, squatter, honest):
            await nursery.start(node.run)
        await squatter.connect(Multiaddr(provider.listen_addresses()[0]))
        (stream,) = await squat(squatter, provider, squatted_id, 1)
        assert await answered(provider, 1) == {"chunk-ok": 1, "busy": 0}
        await trio.sleep(1.0)
        progress = await download(asker, provider, wanted_id, "libp2p")
        with pytest.raises(Exception):  # reset: the header, part of the payload, then the end of a torn frame
            await wire.read_signed(stream, CKPT_REPLY, provider.peer_id, timeout=5)
            await read_frame(stream, max_size=4 * MiB, timeout=5)
        too_slow = provider.metrics["locomesh_checkpoint_served_total"].get(answer="too-slow")
        nursery.cancel_scope.cancel()
    assert progress["state"] == "done", progress["error"]
    assert too_slow == 1


async def test_a_squatter_on_the_data_plane_does_not_stop_an_honest_download(tmp_path, identity_factory):
    squatted_id = large_checkpoint(tmp_path / "provider", chunk_size=SQUATTED_CHUNK)
    wanted_id = small_checkpoint(tmp_path / "provider")
    service, asker = CheckpointService(tmp_path / "provider"), CheckpointService(tmp_path / "asker")
    provider = Node.create(identity_factory(56), listen_addrs=LOOPBACK, services=[service])
    squatter = Node.create(identity_factory(57), listen_addrs=LOOPBACK)
    honest = Node.create(identity_factory(58), listen_addrs=LOOPBACK, services=[asker])
    async with trio.open_nursery() as nursery:
        for node in (provider, squatter, honest):
            await nursery.start(node.run)
        await squatter.connect(Multiaddr(provider.listen_addresses()[0]))
        held = await squat(squatter, provider, squatted_id, 16, dataplane=True)  # kept: a lost one closes its socket
        counts = await answered(provider, 16)
        progress = await download(asker, provider, wanted_id, "dataplane")
        sessions = service.dataplane_server.sessions_served
        nursery.cancel_scope.cancel()
    assert progress["state"] == "done", progress["error"]
    assert len(held) == 16 and counts["chunk-ok"] == slots.MAX_UPLOADS_PER_PEER and sessions > 16  # the honest asker's came after
