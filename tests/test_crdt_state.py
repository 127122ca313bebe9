"""The replica and the state it derives: rounds, bans, checkpoints, hyperparameters, pending ops."""

from __future__ import annotations

import pytest

from locomesh.crdt import InvalidValue, Replica, Value, decode_op, encode_op, evidence_fields, op_id
from locomesh.node.agreement.proposing import own_value
from locomesh.protocol import ProtocolError

from .test_crdt_support import CKPT, H1, H2, attempt_proposed_by, certify, in_causal_order, joined_replica, keys

MEMBERS = keys(4)
A, B, C, D = MEMBERS
COMMIT = {"round": 1, "hash": H1, "size": 1}


def precommit(replica: Replica, who, round_: int, value: bytes = H1, state: bytes = H1, attempt: int = 0) -> bytes:
    return replica.create(who, "precommit", round=round_, epoch=0, attempt=attempt, value=value, state=state)


def commit_all(replica: Replica, members) -> Value:
    """`members` commit for the round under way; the value of their payloads a proposer would propose."""
    round_ = replica.chain.tip.round
    for member in members:
        replica.create(member, "commit", round=round_, hash=bytes([round_]) * 32, size=10)
    return own_value(replica.chain, replica.facts, {member.public_key for member in members})


def propose(replica: Replica, value: Value, who=None) -> bytes:
    """The proposal of `value` in attempt 0 of the round under way, by `who` (default: its proposer)."""
    proposer = replica.chain.proposer(0)
    who = who or next(member for member in MEMBERS if member.public_key == proposer)
    return replica.create(who, "proposal", round=value.round, epoch=0, attempt=0, valid=0, **value.fields())


def test_a_round_needs_precommits_of_more_than_two_thirds_of_its_electorate():
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)  # round 1: the creator alone decides, and admits the others
    value = commit_all(replica, MEMBERS)
    propose(replica, value)
    precommit(replica, A, 2, value.id)
    precommit(replica, B, 2, value.id)
    assert replica.state.round == 1  # 2 of 4 is not > 2/3
    precommit(replica, C, 2, value.id, H2)
    assert replica.state.round == 1  # 3 precommits, split over two states
    precommit(replica, D, 2, value.id)
    assert replica.state.rounds[1:] == ((2, H1),)  # 3 of 4 on H1
    certificate = replica.chain.certificates[2]
    assert len(certificate.electorate) == 4 and certificate.voters == {m.public_key for m in (A, B, D)}


def test_precommits_certify_only_the_value_the_attempts_proposer_proposed():
    """Tendermint's decide rule: a quorum of precommits for a value certifies it only with the
    proposal of that value by the proposer of that attempt."""
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    value = commit_all(replica, MEMBERS)
    proposer = replica.chain.proposer(0)
    propose(replica, value, who=next(m for m in MEMBERS if m.public_key != proposer))
    for member in MEMBERS:
        precommit(replica, member, 2, value.id)
    assert replica.state.round == 1
    propose(replica, value)
    assert replica.state.round == 2 and replica.chain.certificates[2].proposer == proposer


def test_one_peer_cannot_inflate_the_round_number():
    """An op may name a round only a little past the rounds precommitted in its causal past
    (crdt/limits.py), and a quorum for round 2, its proposal included, counts only once round 1
    is certified: rounds are certified in order."""
    replica = joined_replica(MEMBERS)
    for far in (3, 6):
        precommit(replica, A, far)
    with pytest.raises(ProtocolError, match="too-far-ahead"):  # more than limits.AHEAD past round 6
        precommit(replica, A, 2**40)
    for member in MEMBERS:
        replica.create(member, "commit", round=2, hash=H2, size=10)
    ahead = Value(2, tuple(sorted(replica.commit_ops(2).values())))
    for member in MEMBERS:  # whoever round 2's proposer turns out to be
        replica.create(member, "proposal", round=2, epoch=0, attempt=0, valid=0, **ahead.fields())
        precommit(replica, member, 2, ahead.id, H2)
    assert replica.state.round == 0
    value = commit_all(replica, [A])
    propose(replica, value)
    precommit(replica, A, 1, value.id)
    assert replica.state.rounds == ((1, H1), (2, H2))


def test_precommits_of_keys_without_a_say_count_for_nothing():
    """A key that never joined writes no precommit at all; one that joined an open run without
    being admitted writes valid precommits that count for nothing until it earns a say."""
    replica = joined_replica(MEMBERS[:1])
    for outsider in (B, C):
        with pytest.raises(ProtocolError, match="not-member"):
            precommit(replica, outsider, 1)
        replica.create(outsider, "join", round=1)
    value = commit_all(replica, [A])
    propose(replica, value)
    for fresh in (B, C):
        precommit(replica, fresh, 1, value.id)
    assert replica.state.round == 0
    precommit(replica, A, 1, value.id)
    assert replica.state.round == 1 and replica.chain.certificates[1].voters == {A.public_key}
    assert set(replica.state.members) == {m.public_key for m in (A, B, C)}
    assert replica.state.electorate == (A.public_key,)


def test_a_leave_takes_effect_once_a_value_names_it_and_a_commit_brings_the_key_back():
    """A key that left votes until a value names its leave, and is out of the electorate from the
    next round on, still on the roster with its say; a certified set that counts its payload
    brings it back, with no join again (a node stopped gracefully comes back by committing)."""
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    leave = replica.create(D, "leave", round=2)
    assert D.public_key in replica.state.electorate
    others = [A, B, C]
    assert op_id(leave) in certify(replica, others, attempt=attempt_proposed_by(replica, others)).members
    assert replica.state.electorate == tuple(sorted(m.public_key for m in others))
    assert D.public_key in replica.state.members
    certify(replica, MEMBERS)
    assert D.public_key in replica.chain.certificates[3].accepted
    assert D.public_key in replica.state.electorate


def test_canonical_checkpoint_is_the_most_attested_then_the_smallest_id():
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    certify(replica, MEMBERS, H2)
    other = b"\x01" * 32
    replica.create(B, "checkpoint", round=1, id=other, size=100)
    assert replica.state.checkpoint is None  # only the creator precommitted round 1: B did not compute it
    replica.create(A, "checkpoint", round=2, id=CKPT, size=100)
    replica.create(B, "checkpoint", round=2, id=other, size=100)
    assert replica.state.checkpoint.id == other  # one each: the smaller ID wins
    replica.create(C, "attest", round=2, id=CKPT, size=100)
    assert replica.state.checkpoint.id == CKPT and replica.state.checkpoint.attestations == 2
    replica.create(D, "checkpoint", round=3, id=H2, size=1)
    assert replica.state.checkpoint.round == 2  # round 3 is not certified: its checkpoints wait


def test_hyperparameter_changes_take_effect_at_their_round():
    replica = joined_replica(MEMBERS, hparam_writers=[A.public_key, B.public_key])
    replica.create(A, "hparams", round=2, changes={"outer_lr": 0.5})
    replica.create(B, "hparams", round=5, changes={"inner_steps": 50})
    assert replica.state.hparams == {"outer_lr": 0.7, "inner_steps": 100}  # training round 1
    certify(replica, MEMBERS)
    assert replica.state.hparams == {"outer_lr": 0.5, "inner_steps": 100}  # training round 2


def _fork(replica: Replica, who, seq: int, parents: list[bytes] | None = None) -> tuple[bytes, bytes]:
    """Two different ops by `who` at one seq, both on top of `parents` (default: the heads):
    attestations, or joins when they start a chain (only members attest)."""
    parents = replica.heads if parents is None else parents
    if seq == 1:
        return tuple(encode_op(who, replica.run_id, "crdt.join", parents, seq, round=r) for r in (1, 2))
    a = encode_op(who, replica.run_id, "crdt.attest", parents, seq, round=1, id=H1, size=1)
    b = encode_op(who, replica.run_id, "crdt.attest", parents, seq, round=1, id=H2, size=1)
    return a, b


def test_a_fork_bans_its_author_and_drops_its_effects_once_a_value_names_the_proof():
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    a, b = _fork(replica, D, 1, parents=[])  # two roots at seq 1, where D's join already is
    replica.add(a)
    receipt = replica.add(b)
    assert [pair[0].author for pair in receipt.equivocations] == [D.public_key]
    assert replica.state.banned == (D.public_key,)  # proven at once
    evidence = replica.create(A, "evidence", **evidence_fields(*receipt.equivocations[0]))
    others = [A, B, C]
    assert op_id(evidence) in certify(replica, others, attempt=attempt_proposed_by(replica, others)).members
    state = replica.state
    assert state.banned == (D.public_key,) and D.public_key not in state.members + state.electorate
    value = commit_all(replica, [A, B, D])
    assert set(replica.commits(3)) == {A.public_key, B.public_key}
    with pytest.raises(InvalidValue, match="may not contribute"):
        replica.chain.read(Value(3, tuple(sorted(replica.commit_ops(3).values())), (), value.last))
    propose(replica, value)
    for member in (A, B, D):
        precommit(replica, member, 3, value.id)
    assert replica.state.round == 2  # 3 would be a quorum of 4, but of the 3 members left 2 is not
    precommit(replica, C, 3, value.id)
    assert replica.state.round == 3 and len(replica.chain.certificates[3].electorate) == 3


def test_a_double_precommit_is_a_ban_even_across_different_seqs():
    replica = joined_replica(MEMBERS)
    first = precommit(replica, A, 1, H1, H1)
    second = precommit(replica, A, 1, H1, H2)
    assert replica.state.banned == (A.public_key,)
    pair = (decode_op(data, replica.run_id) for data in (first, second))
    assert evidence_fields(*pair)["reason"] == "double-precommit"


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
    no_conflict = encode_op(D, run, "crdt.attest", [], 9, round=1, id=H1, size=1)
    bogus = {"reason": "fork", "a": a, "b": no_conflict}
    with pytest.raises(ProtocolError, match="bad-evidence"):
        seen_one.create(B, "evidence", **bogus)
    assert seen_one.state.banned == (D.public_key,)


def test_ops_wait_for_their_parents_then_apply_in_a_cascade():
    source = joined_replica(MEMBERS)
    certify(source, MEMBERS)
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
    bad = encode_op(A, run, "crdt.commit", replica.heads, 7, **COMMIT)  # wrong seq
    child = encode_op(B, run, "crdt.commit", [decode_op(bad, run).id], 1, **COMMIT)
    grandchild = encode_op(C, run, "crdt.commit", [decode_op(child, run).id], 1, **COMMIT)
    assert replica.add(grandchild).waiting and replica.add(child).waiting
    with pytest.raises(ProtocolError, match="bad-seq"):
        replica.add(bad)
    assert len(replica.pending) == 0
    assert all(replica.is_rejected(decode_op(data, run).id) for data in (bad, child, grandchild))
    late = encode_op(D, run, "crdt.commit", [decode_op(child, run).id], 1, **COMMIT)
    with pytest.raises(ProtocolError, match="invalid-parent"):
        replica.add(late)  # known bad past: refused at once, not parked
    with pytest.raises(ProtocolError, match="bad-seq"):
        replica.add(bad)  # remembered: no second verification


def test_a_rejected_parent_releases_its_waiting_children_as_rejections():
    replica = joined_replica(MEMBERS)
    run = replica.run_id
    join_a = min(replica.op_ids(), key=lambda i: replica.facts.ops[i][2])
    hidden = encode_op(A, run, "crdt.join", replica.heads, 1, round=2)  # fork of A's join: valid op
    bad = encode_op(B, run, "crdt.commit", [decode_op(hidden, run).id], 5, **COMMIT)  # wrong seq
    child = encode_op(C, run, "crdt.commit", [decode_op(bad, run).id], 1, **COMMIT)
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
