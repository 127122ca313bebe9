"""The replica and the state it derives: rounds, bans, checkpoints, hyperparameters, pending ops."""

from __future__ import annotations

import pytest

from locomesh.crdt import Replica, decode_op, encode_op, evidence_fields
from locomesh.protocol import ProtocolError

from .test_crdt_support import CKPT, H1, H2, in_causal_order, joined_replica, keys

MEMBERS = keys(4)
A, B, C, D = MEMBERS


def vote(replica: Replica, who, round_: int, hash_: bytes = H1) -> bytes:
    return replica.create(who, "vote", round=round_, hash=hash_)


def test_a_round_needs_more_than_two_thirds_of_the_members():
    replica = joined_replica(MEMBERS)
    vote(replica, A, 1)
    vote(replica, B, 1)
    assert replica.state.round == 0  # 2 of 4 is not > 2/3
    vote(replica, C, 1, H2)
    assert replica.state.round == 0  # 3 votes, split over two hashes
    vote(replica, D, 1)
    assert replica.state.rounds == ((1, H1),)  # 3 of 4 on H1
    assert replica.state.eligible[1] == 4


def test_one_peer_cannot_inflate_the_round_number():
    replica = joined_replica(MEMBERS)
    for far in (2, 5):
        vote(replica, A, far)
    with pytest.raises(ProtocolError, match="too-far-ahead"):  # more than limits.AHEAD past round 5
        vote(replica, A, 2**40)
    assert replica.state.round == 0
    for member in MEMBERS[:3]:
        vote(replica, member, 2)  # a full quorum for round 2 is useless while round 1 is not certified
    assert replica.state.round == 0
    for member in MEMBERS[1:]:
        vote(replica, member, 1)
    assert replica.state.round == 2


def test_votes_of_non_members_count_for_nothing():
    replica = joined_replica(MEMBERS[:1])
    for outsider in (B, C):  # they never joined: their votes are not even valid ops
        with pytest.raises(ProtocolError, match="not-member"):
            vote(replica, outsider, 1)
        replica.add(encode_op(outsider, replica.run_id, "crdt.join", replica.heads, 1, round=2))  # late joiners
        vote(replica, outsider, 1)
    assert replica.state.round == 0
    vote(replica, A, 1)
    assert replica.state.round == 1


def test_join_and_leave_follow_the_authors_newest_op():
    replica = joined_replica(MEMBERS)
    replica.create(D, "leave", round=3)
    assert D.public_key not in replica.state.members
    assert replica.state.members == tuple(sorted(m.public_key for m in MEMBERS[:3]))
    replica.create(D, "join", round=4)
    assert D.public_key in replica.state.members


def test_a_member_that_left_is_not_counted_after_its_last_round():
    replica = joined_replica(MEMBERS)
    replica.create(D, "leave", round=1)
    for member in (A, B, C):
        vote(replica, member, 1)
        vote(replica, member, 2)
    assert replica.state.eligible == {1: 4, 2: 3}
    assert replica.state.round == 2


def test_canonical_checkpoint_is_the_most_attested_then_the_smallest_id():
    replica = joined_replica(MEMBERS)
    for member in MEMBERS:
        vote(replica, member, 1)
    other = b"\x01" * 32
    replica.create(A, "checkpoint", round=1, id=CKPT, size=100)
    replica.create(B, "checkpoint", round=1, id=other, size=100)
    assert replica.state.checkpoint.id == other  # one each: the smaller ID wins
    replica.create(C, "attest", round=1, id=CKPT, size=100)
    assert replica.state.checkpoint.id == CKPT and replica.state.checkpoint.attestations == 2
    replica.create(D, "checkpoint", round=2, id=H2, size=1)
    assert replica.state.checkpoint.round == 1  # round 2 is not certified: its checkpoints wait


def test_hyperparameter_changes_take_effect_at_their_round():
    replica = joined_replica(MEMBERS, hparam_writers=[A.public_key, B.public_key])
    replica.create(A, "hparams", round=2, changes={"outer_lr": 0.5})
    replica.create(B, "hparams", round=5, changes={"inner_steps": 50})
    assert replica.state.hparams == {"outer_lr": 0.7, "inner_steps": 100}  # training round 1
    for member in MEMBERS:
        vote(replica, member, 1)
    assert replica.state.hparams == {"outer_lr": 0.5, "inner_steps": 100}  # training round 2


def _fork(replica: Replica, who, seq: int, parents: list[bytes] | None = None) -> tuple[bytes, bytes]:
    """Two different ops by `who` at one seq, both on top of `parents` (default: the heads): votes,
    or joins when they start a chain (only members vote)."""
    parents = replica.heads if parents is None else parents
    if seq == 1:
        return tuple(encode_op(who, replica.run_id, "crdt.join", parents, seq, round=r) for r in (1, 2))
    a = encode_op(who, replica.run_id, "crdt.vote", parents, seq, round=1, hash=H1)
    b = encode_op(who, replica.run_id, "crdt.vote", parents, seq, round=1, hash=H2)
    return a, b


def test_a_fork_bans_its_author_and_drops_its_effects():
    replica = joined_replica(MEMBERS)
    a, b = _fork(replica, D, 1, parents=[])  # two roots at seq 1, where D's join already is
    replica.add(a)
    receipt = replica.add(b)
    assert [pair[0].author for pair in receipt.equivocations] == [D.public_key]
    state = replica.state
    assert state.banned == (D.public_key,)
    assert D.public_key not in state.members
    for member in (A, B):
        vote(replica, member, 1)
    assert replica.state.round == 0  # 3 would be a quorum of 4, but of the 3 unbanned members 2 is not
    vote(replica, C, 1)
    assert replica.state.round == 1 and replica.state.eligible[1] == 3


def test_double_vote_is_a_ban_even_across_different_seqs():
    replica = joined_replica(MEMBERS)
    vote(replica, A, 1, H1)
    vote(replica, A, 1, H2)
    assert replica.state.banned == (A.public_key,)


def test_evidence_convicts_an_author_a_replica_has_seen_only_one_side_of():
    seen_both = joined_replica(MEMBERS)
    ops = in_causal_order(seen_both)
    a, b = _fork(seen_both, D, 2)
    seen_both.add(a)
    receipt = seen_both.add(b)
    first, second = receipt.equivocations[0]
    fields = evidence_fields(first, second)
    assert fields["reason"] == "fork"

    seen_one = Replica(seen_both.genesis)
    for data in ops + [a]:
        seen_one.add(data)
    assert seen_one.state.banned == ()
    seen_one.create(A, "evidence", **fields)
    assert seen_one.state.banned == (D.public_key,)

    assert evidence_fields(first, first) is None
    run = seen_one.run_id
    no_conflict = encode_op(D, run, "crdt.vote", [], 9, round=1, hash=H1)
    bogus = {"reason": "fork", "a": a, "b": no_conflict}
    with pytest.raises(ProtocolError, match="bad-evidence"):
        seen_one.create(B, "evidence", **bogus)
    assert seen_one.state.banned == (D.public_key,)


def test_ops_wait_for_their_parents_then_apply_in_a_cascade():
    source = joined_replica(MEMBERS)
    for member in MEMBERS:
        vote(source, member, 1)
    ops = in_causal_order(source)
    replica = Replica(source.genesis)
    for data in reversed(ops[1:]):
        receipt = replica.add(data)
        assert receipt.waiting and not receipt.applied
    assert replica.wanted() == [decode_op(ops[0], replica.run_id).id]
    receipt = replica.add(ops[0])
    assert len(receipt.applied) == len(ops)
    assert replica.state == source.state and replica.heads == source.heads
    assert replica.add(ops[3]).duplicate


def test_the_pending_buffer_is_bounded_and_evicts_the_oldest_first():
    source = joined_replica(MEMBERS)
    ops = in_causal_order(source)
    replica = Replica(source.genesis, max_pending_ops=2)
    evicted = []
    for data in ops[1:]:
        evicted += replica.add(data).evicted
    assert len(replica.pending) == 2
    assert evicted == [decode_op(ops[1], replica.run_id).id]


def test_ops_on_an_invalid_parent_are_rejected_with_it():
    replica = joined_replica(MEMBERS)
    run = replica.run_id
    bad = encode_op(A, run, "crdt.vote", replica.heads, 7, round=1, hash=H1)  # wrong seq
    child = encode_op(B, run, "crdt.vote", [decode_op(bad, run).id], 1, round=1, hash=H1)
    grandchild = encode_op(C, run, "crdt.vote", [decode_op(child, run).id], 1, round=1, hash=H1)
    assert replica.add(grandchild).waiting and replica.add(child).waiting
    with pytest.raises(ProtocolError, match="bad-seq"):
        replica.add(bad)
    assert len(replica.pending) == 0
    assert all(replica.is_rejected(decode_op(data, run).id) for data in (bad, child, grandchild))
    late = encode_op(D, run, "crdt.vote", [decode_op(child, run).id], 1, round=1, hash=H1)
    with pytest.raises(ProtocolError, match="invalid-parent"):
        replica.add(late)  # known bad past: refused at once, not parked
    with pytest.raises(ProtocolError, match="bad-seq"):
        replica.add(bad)  # remembered: no second verification


def test_a_rejected_parent_releases_its_waiting_children_as_rejections():
    replica = joined_replica(MEMBERS)
    run = replica.run_id
    join_a = min(replica.op_ids(), key=lambda i: replica.facts.ops[i][2])
    hidden = encode_op(A, run, "crdt.join", replica.heads, 1, round=2)  # fork of A's join: valid op
    bad = encode_op(B, run, "crdt.vote", [decode_op(hidden, run).id], 5, round=1, hash=H1)  # wrong seq
    child = encode_op(C, run, "crdt.vote", [decode_op(bad, run).id], 1, round=1, hash=H1)
    assert replica.add(child).waiting and replica.add(bad).waiting
    receipt = replica.add(hidden)
    assert receipt.applied == [decode_op(hidden, run).id]
    assert [code.code for _id, code in receipt.rejected] == ["bad-seq", "invalid-parent"]
    assert len(replica.pending) == 0 and join_a in replica


def test_replays_change_nothing_and_other_runs_ops_are_refused():
    replica = joined_replica(MEMBERS)
    before = replica.facts.encode()
    for data in in_causal_order(replica):
        assert replica.add(data).duplicate
    assert replica.facts.encode() == before
    elsewhere = joined_replica(MEMBERS, name="another run")
    with pytest.raises(ProtocolError, match="wrong-run"):
        replica.add(in_causal_order(elsewhere)[0])


def test_the_pending_buffer_is_bounded_in_bytes_too():
    source = joined_replica(MEMBERS)
    ops = in_causal_order(source)
    replica = Replica(source.genesis, max_pending_bytes=len(ops[1]) + len(ops[2]))
    for data in ops[1:]:
        replica.add(data)
    assert replica.pending.bytes <= len(ops[1]) + len(ops[2]) and len(replica.pending) == 2
