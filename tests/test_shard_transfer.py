"""Shards and shard results on `/locomesh/shard/1` between two real libp2p hosts on loopback:
what is fetched is checked before it is returned, what is too large is refused before it is read,
and bad requests are refused, charged to the asker, and never take the holder down."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.exchange import shard_transfer
from locomesh.node.exchange.shard_transfer import (
    HELD, MAX_HELD_AUTHORS, REFUSED, SHARD_PROTOCOL, ShardFetchError, ShardHoldings, ShardRequest, ShardService,
    decode_answer, fetch_held, fetch_input, fetch_result,
)
from locomesh.node.runtime import Node
from locomesh.node.streams import read_frame, write_frame
from locomesh.node.transfer.slots import UploadSlots
from locomesh.protocol import pack
from locomesh.protocol.merkle import MAX_LEAVES
from locomesh.training.shards import ShardedPayload

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
RUN, ROUND = b"\x07" * 32, 3
AUTHOR, OTHER = b"\x0a" * 32, b"\x0b" * 32


def payload(count: int = 5, size: int = 3000, seed: int = 1) -> ShardedPayload:
    rng = random.Random(seed)
    return ShardedPayload([rng.randbytes(size + index) for index in range(count)])


@asynccontextmanager
async def two_nodes(identity_factory, *, slots: UploadSlots | None = None):
    """(holder, asker, holder's holdings, holder's service): two connected nodes, the holder serving
    `/locomesh/shard/1`."""
    holdings = ShardHoldings()
    holder = Node.create(identity_factory(31), listen_addrs=LOOPBACK)
    asker = Node.create(identity_factory(32), listen_addrs=LOOPBACK)
    service = ShardService(holder, holdings, slots=slots)
    service.register()
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.run)
        await nursery.start(asker.run)
        await asker.connect(Multiaddr(holder.listen_addresses()[0]))
        yield holder, asker, holdings, service
        nursery.cancel_scope.cancel()


async def ask_raw(asker: Node, holder: Node, frame: bytes) -> str:
    """Send `frame` as a request on a stream of its own; the status of the answer."""
    stream = await asker.open_stream(holder.peer_id, [SHARD_PROTOCOL])
    await write_frame(stream, frame, timeout=5)
    status, _, _ = decode_answer(await read_frame(stream, max_size=2048, timeout=5))
    await stream.close()
    return status


def errors(node: Node) -> dict[str, int]:
    return node.status()["protocol_errors_by_code"]


async def test_an_input_shard_is_fetched_with_its_audit_path_and_checked(identity_factory):
    mine, theirs = payload(seed=1), payload(count=4, seed=2)
    async with two_nodes(identity_factory) as (holder, asker, holdings, _):
        holdings.hold_payload(RUN, ROUND, AUTHOR, mine)
        holdings.hold_shard(RUN, ROUND, OTHER, 2, theirs.shards[2], theirs.proof(2))  # one it fetched
        own = await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 3, root=mine.root, count=5, limit=4096)
        relayed = await fetch_input(asker, holder.peer_id, RUN, ROUND, OTHER, 2, root=theirs.root, count=4,
                                    limit=4096)
    assert own == (mine.shards[3], mine.proof(3))
    assert relayed == (theirs.shards[2], theirs.proof(2))


async def test_held_says_which_payloads_have_a_shard_here_without_sending_it(identity_factory):
    """A `held` request names authors; the bitmap answer says whose shard `index` is held (a whole
    payload of ours, or a shard fetched), and nothing else: no bytes of a shard, no upload slot."""
    authors = [bytes([i]) * 32 for i in range(1, 12)]
    theirs = payload(count=4, seed=2)
    async with two_nodes(identity_factory, slots=UploadSlots(total=1, per_peer=1)) as (holder, asker, holdings, service):
        holdings.hold_payload(RUN, ROUND, authors[0], payload(seed=1))
        holdings.hold_shard(RUN, ROUND, authors[9], 2, theirs.shards[2], theirs.proof(2))
        holdings.hold_shard(RUN, ROUND, authors[10], 1, theirs.shards[1], theirs.proof(1))
        slot = service.slots.take(asker.peer_id)  # every upload slot taken: held needs none
        held = await fetch_held(asker, holder.peer_id, RUN, ROUND, 2, authors)
        other_round = await fetch_held(asker, holder.peer_id, RUN, ROUND + 1, 2, authors)
        slot.release()
    assert held == {authors[0], authors[9]} and other_round == set()
    assert service.bytes_served == 2 * 2  # two bitmaps of 11 bits: no shard bytes


async def test_a_held_request_naming_too_many_authors_is_refused_and_charged(identity_factory):
    too_many = [i.to_bytes(32, "big") for i in range(MAX_HELD_AUTHORS + 1)]
    frame = pack({"what": HELD, "run": RUN, "round": ROUND, "index": 0, "authors": too_many})
    with pytest.raises(ValueError):
        ShardRequest(HELD, RUN, ROUND, 0, authors=tuple(too_many)).encode()
    async with two_nodes(identity_factory) as (holder, asker, _, _):
        assert await ask_raw(asker, holder, frame) == REFUSED
        assert await ask_raw(asker, holder, pack({"what": HELD, "run": RUN, "round": ROUND, "index": 0})) == REFUSED
        assert sum(errors(holder).values()) == 2


async def test_a_wrong_audit_path_or_a_shard_not_under_the_root_is_refused_before_it_is_returned(identity_factory):
    committed = payload()
    async with two_nodes(identity_factory) as (holder, asker, holdings, _):
        holdings.hold_shard(RUN, ROUND, AUTHOR, 1, committed.shards[1], committed.proof(2))  # another shard's path
        holdings.hold_shard(RUN, ROUND, AUTHOR, 0, b"not what was committed", committed.proof(0))
        reasons = []
        for index in (1, 0):
            with pytest.raises(ShardFetchError) as caught:
                await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, index, root=committed.root, count=5,
                                  limit=4096)
            reasons.append(caught.value.reason)
    assert reasons == ["bad-proof", "bad-proof"]
    assert asker.scores.get(holder.peer_id).strikes == 2  # the holder served what its author did not commit to


async def test_an_answer_larger_than_the_limit_is_refused_before_it_is_read(identity_factory):
    committed = payload()
    big = bytes(8 * 1024 * 1024)  # a malicious holder: far more than a shard of the run can be
    async with two_nodes(identity_factory) as (holder, asker, holdings, service):
        holdings.hold_shard(RUN, ROUND, AUTHOR, 1, big, committed.proof(1))
        before = asker.meter.bytes_in
        with pytest.raises(ShardFetchError) as caught:
            await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 1, root=committed.root, count=5, limit=4096)
        received = asker.meter.bytes_in - before
        with trio.fail_after(5):  # the holder's write ends (the stream was reset), its slot is back
            while service.slots.in_use:
                await trio.sleep(0.02)
        # The holder is still up and serving.
        holdings.hold_payload(RUN, ROUND, OTHER, committed)
        fetched = await fetch_input(asker, holder.peer_id, RUN, ROUND, OTHER, 1, root=committed.root, count=5,
                                    limit=4096)
    assert caught.value.reason == "too-large" and "8388608" in str(caught.value)
    assert received < len(big) // 4  # only what the Yamux window let through before the reset
    assert fetched[0] == committed.shards[1]
    assert "internal" not in errors(holder)


async def test_garbage_and_out_of_range_requests_are_refused_and_charged_to_the_asker(identity_factory):
    committed = payload()
    async with two_nodes(identity_factory) as (holder, asker, holdings, _):
        holdings.hold_payload(RUN, ROUND, AUTHOR, committed)
        past_the_count = ShardRequest("input", RUN, ROUND, 7, AUTHOR).encode()  # the payload has 5 shards
        past_any_tree = pack({"what": "result", "run": RUN, "round": ROUND, "index": MAX_LEAVES})
        result_with_author = pack({"what": "result", "run": RUN, "round": ROUND, "index": 0, "author": AUTHOR})
        short_run = pack({"what": "input", "run": b"\x07", "round": ROUND, "index": 0, "author": AUTHOR})
        answers = [await ask_raw(asker, holder, frame) for frame in (
            b"\xc1 not msgpack", pack([1, 2, 3]), past_the_count, past_any_tree, result_with_author, short_run,
        )]
        with pytest.raises(ShardFetchError) as caught:  # the same through the client: the holder's answer
            await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 7, root=committed.root, count=9, limit=4096)
        with pytest.raises(ValueError):  # a request the client cannot send
            await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 5, root=committed.root, count=5, limit=4096)
        fetched = await fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 4, root=committed.root, count=5,
                                    limit=4096)
    assert answers == [REFUSED] * 6 and caught.value.reason == "refused"
    assert fetched[0] == committed.shards[4]
    assert holder.scores.get(asker.peer_id).strikes == 7
    counted = errors(holder)
    assert "internal" not in counted and counted["bad-index"] == 2 and counted["malformed"] == 1
    assert asker.scores.get(holder.peer_id).strikes == 0  # refusing is no fault of the holder


async def test_a_request_frame_over_its_bound_is_refused_unread(identity_factory):
    async with two_nodes(identity_factory) as (holder, asker, _, _):
        stream = await asker.open_stream(holder.peer_id, [SHARD_PROTOCOL])
        await stream.write((10**6).to_bytes(4, "big"))  # announces a megabyte; none of it follows
        status, _, _ = decode_answer(await read_frame(stream, max_size=2048, timeout=5))
    assert status == REFUSED and errors(holder)["too-large"] == 1


async def test_a_result_is_fetched_at_its_exact_size_and_any_other_size_is_refused(identity_factory):
    values = random.Random(3).randbytes(4000)
    async with two_nodes(identity_factory) as (holder, asker, holdings, _):
        holdings.hold_result(RUN, ROUND, 2, values)
        fetched = await fetch_result(asker, holder.peer_id, RUN, ROUND, 2, size=4000)
        reasons = []
        for size in (3996, 8000):
            with pytest.raises(ShardFetchError) as caught:
                await fetch_result(asker, holder.peer_id, RUN, ROUND, 2, size=size)
            reasons.append(caught.value.reason)
    assert fetched == values and reasons == ["wrong-size", "wrong-size"]


async def test_what_is_not_held_is_missing_and_no_fault(identity_factory):
    committed = payload()
    async with two_nodes(identity_factory) as (holder, asker, holdings, _):
        holdings.hold_result(RUN, ROUND, 1, b"\x00" * 8)
        reasons = []
        for fetch in (
            fetch_input(asker, holder.peer_id, RUN, ROUND, AUTHOR, 0, root=committed.root, count=5, limit=4096),
            fetch_result(asker, holder.peer_id, RUN, ROUND, 0, size=8),  # another shard's result
            fetch_result(asker, holder.peer_id, RUN, ROUND + 1, 1, size=8),  # another round's
        ):
            with pytest.raises(ShardFetchError) as caught:
                await fetch
            reasons.append(caught.value.reason)
    assert reasons == ["missing"] * 3
    assert asker.scores.get(holder.peer_id).strikes == 0 and holder.scores.get(asker.peer_id).strikes == 0


async def test_a_holder_with_no_free_upload_slot_answers_busy(identity_factory):
    async with two_nodes(identity_factory, slots=UploadSlots(0)) as (holder, asker, holdings, _):
        holdings.hold_result(RUN, ROUND, 0, b"\x01" * 16)
        with pytest.raises(ShardFetchError) as caught:
            await fetch_result(asker, holder.peer_id, RUN, ROUND, 0, size=16)
        served = holder.metrics["locomesh_shard_served_total"].get(answer="busy")
    assert caught.value.reason == "busy" and served == 1


async def test_a_reader_that_does_not_read_loses_its_slot_at_the_write_deadline(identity_factory, monkeypatch):
    monkeypatch.setattr(shard_transfer, "write_deadline", lambda size, **_: 0.5)
    async with two_nodes(identity_factory) as (holder, asker, holdings, service):
        holdings.hold_result(RUN, ROUND, 0, bytes(4 * 1024 * 1024))  # far more than a Yamux window
        stream = await asker.open_stream(holder.peer_id, [SHARD_PROTOCOL])
        await write_frame(stream, ShardRequest("result", RUN, ROUND, 0).encode(), timeout=5)
        with trio.fail_after(5):  # and never read: the holder resets the stream and frees the slot
            while not holder.metrics["locomesh_shard_served_total"].get(answer="too-slow"):
                await trio.sleep(0.05)
            while service.slots.in_use:
                await trio.sleep(0.02)
    assert errors(holder)["timeout"] == 1 and service.bytes_served == 0


def test_holdings_serve_by_round_and_are_released_by_round():
    held, other_run = ShardHoldings(), b"\x08" * 32
    committed = payload(count=3, size=100)
    held.hold_payload(RUN, 1, AUTHOR, committed)
    held.hold_shard(RUN, 2, OTHER, 1, b"shard", [b"\x00" * 32])
    held.hold_result(RUN, 2, 0, b"values")
    held.hold_result(other_run, 1, 0, b"kept")
    assert held.input(RUN, 1, AUTHOR, 2) == (committed.shards[2], committed.proof(2))
    assert held.input(RUN, 1, AUTHOR, 3) is None and held.shard_count(RUN, 1, AUTHOR) == 3
    assert held.input(RUN, 2, OTHER, 1) == (b"shard", [b"\x00" * 32]) and held.shard_count(RUN, 2, OTHER) is None
    assert held.bytes_held == committed.nbytes + len(b"shard") + len(b"values") + len(b"kept")
    held.release_before(RUN, 2)
    assert held.input(RUN, 1, AUTHOR, 0) is None and held.result(RUN, 2, 0) == b"values"
    held.release_before(RUN, None)
    assert held.rounds() == [(other_run, 1)] and held.result(other_run, 1, 0) == b"kept"
    with pytest.raises(ValueError):
        held.hold_result(b"short", 1, 0, b"")
