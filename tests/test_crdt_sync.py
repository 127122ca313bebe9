"""The anti-entropy state machine, driven by hand: heads, want, ops, in bounded batches."""

from __future__ import annotations

import pytest

from locomesh.crdt import Replica, encode_op
from locomesh.crdt.sync import State, SyncPuller, SyncServer
from locomesh.protocol import ProtocolError, decode, encode

from .test_crdt_support import H1, in_causal_order, joined_replica, keys

MEMBERS = keys(3)
A, B, C = MEMBERS


def run_sync(puller: SyncPuller, server: SyncServer) -> list[str]:
    """Carry requests and replies between the two until the puller is done; return the kinds sent."""
    sent = []
    request = puller.start()
    while request is not None:
        sent.append(decode(request).kind)
        request = puller.receive(server.answer(request).reply)
    return sent


def _grown(replica: Replica, author, n: int) -> Replica:
    """`n` small ops by `author`: a nil prevote for one attempt of round 1 after another (one per
    attempt is what an honest member writes)."""
    for attempt in range(n):
        replica.create(author, "prevote", round=1, epoch=0, attempt=attempt, value=b"")
    return replica


def test_a_fresh_replica_catches_up_in_bounded_batches():
    source = _grown(joined_replica(MEMBERS), A, 600)
    fresh = Replica(source.genesis)
    server = SyncServer(source, B, batch_bytes=64 * 1024)  # ~200 small ops per batch
    puller = SyncPuller(fresh, C, peer=B.public_key)
    kinds = run_sync(puller, server)
    assert kinds[0] == "crdt.heads" and kinds.count("crdt.want") == puller.progress.batches >= 3
    assert puller.state is State.DONE and puller.progress.complete
    assert fresh.op_ids() == source.op_ids() and fresh.state == source.state


def test_sync_stops_at_its_batch_budget_and_the_next_one_carries_on():
    source = _grown(joined_replica(MEMBERS), A, 300)
    fresh = Replica(source.genesis)
    server = SyncServer(source, B, batch_bytes=16 * 1024)
    puller = SyncPuller(fresh, C, max_batches=2)
    run_sync(puller, server)
    assert puller.progress.batches == 2 and not puller.progress.complete
    while not puller.progress.complete:
        run_sync(puller, server)
    assert fresh.op_ids() == source.op_ids()


def test_both_sides_learn_the_others_ops():
    left = joined_replica(MEMBERS)
    right = Replica(left.genesis)
    for data in in_causal_order(left):
        right.add(data)
    _grown(left, A, 20)
    _grown(right, B, 30)
    answer = SyncServer(right, B).answer(SyncPuller(left, A).start())
    assert answer.peer_ahead  # left has ops right lacks: right should pull too
    run_sync(SyncPuller(left, A), SyncServer(right, B))
    run_sync(SyncPuller(right, B), SyncServer(left, A))
    assert left.op_ids() == right.op_ids() and left.facts.encode() == right.facts.encode()
    assert not SyncServer(right, B).answer(SyncPuller(left, A).start()).peer_ahead


def test_invalid_ops_in_a_batch_are_skipped_and_counted():
    source = joined_replica(MEMBERS)
    forged = encode_op(A, source.run_id, "crdt.commit", source.heads, 9, round=1, hash=H1, size=1)  # bad seq
    fresh = Replica(source.genesis)
    puller = SyncPuller(fresh, C)
    puller.start()
    puller.receive(encode(B, "crdt.heads", {"heads": source.heads, "reply": True}, run=source.run_id))
    ops = in_causal_order(source) + [forged]
    assert puller.receive(encode(B, "crdt.ops", {"ops": ops, "more": False}, run=source.run_id)) is None
    assert [error.code for _id, error in puller.progress.rejected] == ["bad-seq"]
    assert fresh.op_ids() == source.op_ids()


def test_unexpected_or_foreign_messages_fail_the_sync():
    replica = joined_replica(MEMBERS)
    run = replica.run_id
    ops_reply = encode(B, "crdt.ops", {"ops": [], "more": False}, run=run)
    puller = SyncPuller(replica, A)
    with pytest.raises(ProtocolError, match="unexpected-message"):
        puller.receive(ops_reply)  # nothing was asked yet
    assert puller.state is State.FAILED
    puller = SyncPuller(replica, A, peer=B.public_key)
    puller.start()
    with pytest.raises(ProtocolError, match="wrong-author"):
        puller.receive(encode(C, "crdt.heads", {"heads": [], "reply": True}, run=run))
    with pytest.raises(ProtocolError, match="unexpected-message"):
        SyncServer(replica, B).answer(ops_reply)
    with pytest.raises(ProtocolError, match="wrong-run"):
        SyncServer(replica, B).answer(encode(A, "crdt.heads", {"heads": [], "reply": False}, run=b"\x07" * 32))


def test_a_peer_that_cannot_deliver_ends_the_sync_without_looping():
    source = joined_replica(MEMBERS)
    invented = encode_op(A, source.run_id, "crdt.commit", [b"\x42" * 32], 1, round=1, hash=H1, size=1)
    fresh = Replica(source.genesis)
    assert fresh.add(invented).waiting  # its parent exists nowhere
    puller = SyncPuller(fresh, C)
    run_sync(puller, SyncServer(source, B))
    assert puller.state is State.DONE and not puller.progress.complete
    assert fresh.op_ids() == source.op_ids() and fresh.wanted() == [b"\x42" * 32]


def test_diverged_replicas_sync_even_when_the_server_cannot_see_the_pullers_heads():
    common = _grown(joined_replica(MEMBERS), A, 200)
    puller_side, server_side = Replica(common.genesis), Replica(common.genesis)
    for data in in_causal_order(common):
        puller_side.add(data)
        server_side.add(data)
    _grown(puller_side, B, 5)  # the server knows none of the puller's heads: it resends old ops
    _grown(server_side, C, 5)
    puller = SyncPuller(puller_side, B)
    run_sync(puller, SyncServer(server_side, C, batch_bytes=8 * 1024))
    assert puller.progress.complete and server_side.op_ids() <= puller_side.op_ids()
