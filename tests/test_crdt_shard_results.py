"""The ops of sharded exchange in the CRDT: `shard_result` (a committee member's signed hash of a
shard's aggregate) and `dispute` (a member's word that its exact recomputation differs): their
shape and limits, the replica's per-round indexes, the ban for two different results (with its
evidence), the ban by disputes from more than a third of the electorate once a certified value
names the result with them (crdt/value.py), and the facts of a run without them kept byte for
byte."""

from __future__ import annotations

import hashlib
import random

import pytest

from locomesh.crdt import Facts, InvalidValue, Replica, Value, decode_op, evidence_fields, guilty_author, op_id
from locomesh.crdt.evidence import ban_reason
from locomesh.crdt.limits import earlier_statement
from locomesh.crdt.ops import seal_ops
from locomesh.crdt.ops.shard_result import MAX_SHARDS
from locomesh.node.agreement.proposing import own_value
from locomesh.protocol import ProtocolError, canonical, unpack

from .test_crdt_support import CKPT, H1, H2, certify, in_causal_order, joined_replica, keys

MEMBERS = keys(6, offset=30)  # admitted at genesis: round 2's electorate, once round 1 admits their joins
LATE = keys(3, offset=40)  # fresh keys (an open run, not admitted): on the roster from round 2, without a say
A, B, C, D, E, F = MEMBERS
R1, R2, R3 = b"\x31" * 32, b"\x32" * 32, b"\x33" * 32  # shard result hashes
# Two contributor sets of one round (a new attempt, another proposal), named as the driver names them.
S1 = hashlib.sha256(b"locomesh set" + b"".join(sorted(m.public_key for m in MEMBERS))).digest()
S2 = hashlib.sha256(b"locomesh set" + b"".join(sorted(m.public_key for m in MEMBERS[:5]))).digest()
DISPUTED_REASON = ("disputed: more than a third of a round's electorate recomputed a shard it signed the result of "
                   "and found the result wrong")


def run() -> Replica:
    """Every member and LATE joined; nothing certified (round 1's electorate is A alone)."""
    replica = joined_replica(MEMBERS)
    for late in LATE:
        replica.create(late, "join", round=3)
    return replica


def seated() -> Replica:
    """Round 1 certified by A (the creator, its electorate), its value admitting every join: round
    2's electorate is the six members; LATE are on the roster without a say."""
    replica = run()
    certify(replica, MEMBERS)
    assert replica.electorate(2) == {m.public_key for m in MEMBERS}
    assert {late.public_key for late in LATE} <= set(replica.state.members)
    return replica


def forged(identity, run_id: bytes, kind: str, body: dict) -> bytes:
    """A sealed op whose body skips every check a writer runs (what a hostile peer can send)."""
    content = canonical.pack({"author": identity.public_key, "body": {"parents": [], "seq": 1, **body},
                              "kind": f"crdt.{kind}", "run": run_id, "v": 1})
    return seal_ops(identity, run_id, [content])[0]


def dispute(replica: Replica, author, member, hash_: bytes = R1, round_: int = 2, shard: int = 7,
            set_: bytes = S1) -> bytes:
    return replica.create(author, "dispute", round=round_, set=set_, shard=shard, member=member.public_key,
                          hash=hash_)


def result(replica: Replica, author, hash_: bytes = R1, round_: int = 2, shard: int = 7, set_: bytes = S1) -> bytes:
    return replica.create(author, "shard_result", round=round_, set=set_, shard=shard, hash=hash_)


def with_changes(replica: Replica, *ops: bytes) -> Value:
    """The value an honest proposer would propose for the tip round, with `ops` (shard results and
    disputes) named among its membership changes too."""
    value = own_value(replica.chain, replica.facts, set(replica.commit_ops(replica.chain.tip.round)))
    assert value is not None
    kept = {op for op in value.members if replica.facts.refs[op][0] not in ("shard_result", "dispute")}
    return Value(value.round, value.set, tuple(sorted({*kept, *map(op_id, ops)})), value.last)


def commit_all(replica: Replica) -> None:
    round_ = replica.chain.tip.round
    for m in MEMBERS:
        if m.public_key not in replica.commit_ops(round_):
            replica.create(m, "commit", round=round_, hash=hashlib.sha256(m.public_key).digest(), size=10)


def decide(replica: Replica, value: Value, state: bytes = H1) -> None:
    """Certify the tip round with `value`: its proposer proposes it, every member of its electorate
    among MEMBERS precommits it."""
    chain, round_ = replica.chain, replica.chain.tip.round
    by_key = {m.public_key: m for m in MEMBERS}
    replica.create(by_key[chain.proposer(0)], "proposal", round=round_, epoch=0, attempt=0, valid=0, **value.fields())
    for key in sorted(chain.tip.electorate & by_key.keys()):
        replica.create(by_key[key], "precommit", round=round_, epoch=0, attempt=0, value=value.id, state=state)
    assert chain.round == round_ and chain.certificates[round_].value_id == value.id


def invalid(replica: Replica, *ops: bytes) -> str:
    """Why a value naming `ops` is invalid (it must be)."""
    with pytest.raises(InvalidValue) as refused:
        replica.chain.read(with_changes(replica, *ops))
    return str(refused.value)


# --- the ops ------------------------------------------------------------------------------------


def test_both_ops_round_trip_through_the_schema_and_the_facts():
    replica = run()
    signed = replica.create(A, "shard_result", round=1, set=S1, shard=MAX_SHARDS - 1, hash=R1)
    disputed = dispute(replica, B, A, round_=1, shard=MAX_SHARDS - 1)
    op = decode_op(signed, replica.run_id)
    assert (op.kind, op.body["round"], op.body["set"], op.body["shard"], op.body["hash"]) == (
        "crdt.shard_result", 1, S1, MAX_SHARDS - 1, R1)
    signed_id = op.id
    op = decode_op(disputed, replica.run_id)
    assert (op.kind, op.body["set"], op.body["member"], op.body["hash"]) == ("crdt.dispute", S1, A.public_key, R1)
    data = replica.facts.encode()
    decoded = Facts.decode(data)
    # Both are referable: their rows start with the op ID (a value names them by it).
    assert decoded.rows["shard_result"] == replica.facts.rows["shard_result"] == {
        (signed_id, A.public_key, 1, S1, MAX_SHARDS - 1, R1)}
    assert decoded.rows["dispute"] == replica.facts.rows["dispute"] == {
        (op.id, B.public_key, 1, S1, MAX_SHARDS - 1, A.public_key, R1)}
    assert decoded.refs[signed_id][0] == "shard_result" and decoded.refs[op.id][0] == "dispute"
    assert decoded.encode() == data
    assert decoded.shard_results_in(1, S1) == {MAX_SHARDS - 1: {A.public_key: {R1}}}
    assert decoded.shard_results_in(1, S2) == {} and decoded.disputes_in(1, S2) == {}
    assert decoded.disputes_in(1, S1) == {(A.public_key, MAX_SHARDS - 1, R1): {B.public_key}}
    raw = unpack(data, max_size=2**20)
    raw["hparams"] = []  # an empty table written out: not the canonical form
    with pytest.raises(ProtocolError, match="non-canonical"):
        Facts.decode(canonical.pack(raw))


@pytest.mark.parametrize("kind, body", [
    ("shard_result", {"round": 1, "set": S1, "shard": MAX_SHARDS, "hash": R1}),
    ("shard_result", {"round": 1, "set": S1, "shard": -1, "hash": R1}),
    ("shard_result", {"round": 0, "set": S1, "shard": 0, "hash": R1}),
    ("shard_result", {"round": 1, "set": S1, "shard": 0, "hash": R1[:31]}),
    ("shard_result", {"round": 1, "set": S1, "shard": 0, "hash": R1 + b"\x00"}),
    ("shard_result", {"round": 1, "set": S1, "shard": 0}),
    ("shard_result", {"round": 1, "set": S1, "shard": 0, "hash": R1, "extra": 1}),
    ("shard_result", {"round": 1, "shard": 0, "hash": R1}),  # no set
    ("shard_result", {"round": 1, "set": S1[:31], "shard": 0, "hash": R1}),
    ("dispute", {"round": 1, "shard": 0, "member": b"\x01" * 32, "hash": R1}),  # no set
    ("dispute", {"round": 1, "set": S1 + b"\x00", "shard": 0, "member": b"\x01" * 32, "hash": R1}),
    ("dispute", {"round": 1, "set": S1, "shard": MAX_SHARDS, "member": b"\x01" * 32, "hash": R1}),
    ("dispute", {"round": 1, "set": S1, "shard": 0, "member": b"\x01" * 31, "hash": R1}),
    ("dispute", {"round": 1, "set": S1, "shard": 0, "member": b"\x01" * 32, "hash": R1[:16]}),
    ("dispute", {"round": 1, "set": S1, "shard": 0, "hash": R1}),
])
def test_an_op_that_breaks_its_shape_is_refused_on_decode_and_never_written(kind, body):
    replica = run()
    with pytest.raises(ProtocolError):
        decode_op(forged(A, replica.run_id, kind, body), replica.run_id)
    with pytest.raises(ProtocolError):
        replica.create(A, kind, **body)


def test_the_limits_members_only_rounds_backed_caps_and_no_dispute_of_oneself():
    replica = run()
    stranger = keys(1, offset=90)[0]
    with pytest.raises(ProtocolError, match="join the run first"):
        replica.create(stranger, "shard_result", round=1, set=S1, shard=0, hash=R1)
    with pytest.raises(ProtocolError, match="join the run first"):
        replica.create(stranger, "dispute", round=1, set=S1, shard=0, member=A.public_key, hash=R1)
    for kind, fields in (("shard_result", {"hash": R1}), ("dispute", {"member": B.public_key, "hash": R1})):
        with pytest.raises(ProtocolError) as refused:  # no precommit backs round 5: at most round 0 + AHEAD
            replica.create(A, kind, round=5, set=S1, shard=0, **fields)
        assert refused.value.code == "too-far-ahead"
    with pytest.raises(ProtocolError) as refused:
        dispute(replica, A, A, round_=1)
    assert refused.value.code == "names-self"
    for _ in range(2):  # the same result twice is let in (a restart); a third is over the cap
        replica.create(A, "shard_result", round=1, set=S1, shard=3, hash=R1)
    with pytest.raises(ProtocolError, match="at most 2"):
        replica.create(A, "shard_result", round=1, set=S1, shard=3, hash=R1)
    replica.create(A, "shard_result", round=1, set=S1, shard=4, hash=R1)  # each shard is counted apart
    replica.create(A, "shard_result", round=1, set=S2, shard=3, hash=R2)  # and each set
    for _ in range(2):
        dispute(replica, B, A, round_=1, shard=3)
    with pytest.raises(ProtocolError, match="at most 2"):
        dispute(replica, B, A, round_=1, shard=3, hash_=R2)
    dispute(replica, B, C, round_=1, shard=3)  # another member of the same shard is counted apart
    dispute(replica, B, A, R2, round_=1, shard=3, set_=S2)  # and another set


def test_earlier_statement_says_same_or_conflict_for_the_nodes_own_writes():
    replica = run()
    me = A.public_key
    signed = {"round": 1, "set": S1, "shard": 2, "hash": R1}
    assert earlier_statement(replica.facts, me, "shard_result", signed) is None
    replica.create(A, "shard_result", **signed)
    assert earlier_statement(replica.facts, me, "shard_result", signed) == "same"
    assert earlier_statement(replica.facts, me, "shard_result", {**signed, "hash": R2}) == "conflict"
    assert earlier_statement(replica.facts, me, "shard_result", {**signed, "shard": 3, "hash": R2}) is None
    assert earlier_statement(replica.facts, me, "shard_result", {**signed, "set": S2, "hash": R2}) is None
    said = {"round": 1, "set": S1, "shard": 2, "member": B.public_key, "hash": R1}
    assert earlier_statement(replica.facts, me, "dispute", said) is None
    replica.create(A, "dispute", **said)
    assert earlier_statement(replica.facts, me, "dispute", said) == "same"
    assert earlier_statement(replica.facts, me, "dispute", {**said, "hash": R2}) is None
    assert earlier_statement(replica.facts, me, "dispute", {**said, "set": S2}) is None


# --- the replica's indexes and equivocation ------------------------------------------------------


def test_the_replica_indexes_results_and_disputes_by_round():
    replica = run()
    assert replica.shard_results(1, S1) == {} and replica.disputes(1, S1) == {}
    replica.create(A, "shard_result", round=1, set=S1, shard=0, hash=R1)
    replica.create(B, "shard_result", round=1, set=S1, shard=0, hash=R1)
    replica.create(B, "shard_result", round=1, set=S1, shard=1, hash=R2)
    replica.create(A, "shard_result", round=1, set=S2, shard=0, hash=R2)  # another set of the same round
    replica.create(C, "shard_result", round=2, set=S1, shard=0, hash=R3)
    dispute(replica, C, B, R2, round_=1, shard=1)
    dispute(replica, D, B, R2, round_=1, shard=1)
    dispute(replica, D, A, R3, round_=1, shard=0)  # a hash A never signed: kept, counts for nothing
    dispute(replica, E, A, R2, round_=1, shard=0, set_=S2)
    assert replica.shard_results(1, S1) == {0: {A.public_key: {R1}, B.public_key: {R1}}, 1: {B.public_key: {R2}}}
    assert replica.shard_results(1, S2) == {0: {A.public_key: {R2}}}
    assert replica.shard_results(2, S1) == {0: {C.public_key: {R3}}} and replica.shard_results(2, S2) == {}
    assert replica.disputes(1, S1) == {(B.public_key, 1, R2): {C.public_key, D.public_key},
                                       (A.public_key, 0, R3): {D.public_key}}
    assert replica.disputes(1, S2) == {(A.public_key, 0, R2): {E.public_key}}
    assert replica.disputes(2, S1) == {}
    replica.shard_results(1, S1)[0][A.public_key].add(R3)  # a copy: the caller cannot change the facts
    replica.disputes(1, S1)[(B.public_key, 1, R2)].add(A.public_key)
    assert replica.shard_results(1, S1)[0][A.public_key] == {R1}
    assert len(replica.disputes(1, S1)[(B.public_key, 1, R2)]) == 2
    assert not replica.state.banned


def test_two_different_results_for_one_shard_ban_with_evidence_and_the_same_twice_does_not():
    replica = seated()
    result(replica, A, R1, shard=5)
    result(replica, A, R1, shard=5)  # the same statement again
    result(replica, B, R1, shard=5)
    result(replica, B, R2, shard=6)  # another shard: no conflict
    assert not replica.state.banned
    before = in_causal_order(replica)
    first = decode_op(result(replica, C, R1, shard=5), replica.run_id)
    second = decode_op(result(replica, C, R2, shard=5), replica.run_id)
    assert replica.state.banned == (C.public_key,) and replica.facts.proven(C.public_key)
    assert replica.shard_results(2, S1)[5][C.public_key] == {R1, R2}
    reason = ban_reason(replica.facts, C.public_key)
    assert reason == f"double shard_result: two different ones for round 2, set {S1.hex()[:12]}, shard 5"
    assert replica.ban_reason(C.public_key) == reason and replica.ban_reason(A.public_key) is None

    fields = evidence_fields(first, second)
    assert fields["reason"] == "double-shard_result"
    assert guilty_author(fields["reason"], fields["a"], fields["b"], replica.run_id) == C.public_key
    same = [decode_op(data, replica.run_id) for data in before[-4:-2]]  # A's result twice
    assert same[0].author == same[1].author == A.public_key and evidence_fields(*same) is None
    with pytest.raises(ProtocolError, match="bad-evidence"):
        guilty_author("double-shard_result", same[0].data, same[1].data, replica.run_id)

    seen_one = Replica(replica.genesis)  # saw only the first result: the evidence is what bans there
    for data in before + [first.data]:
        seen_one.add(data)
    assert not seen_one.state.banned
    seen_one.create(D, "evidence", **fields)
    assert seen_one.state.banned == (C.public_key,)
    assert ban_reason(seen_one.facts, C.public_key) == "convicted by evidence of an equivocation seen elsewhere"

    # The ban takes effect once a certified value names the evidence: off the roster and the
    # electorate from the next round on, its commits ignored.
    assert C.public_key in seen_one.state.members and C.public_key in seen_one.electorate(2)
    value = certify(seen_one, MEMBERS)
    assert any(seen_one.facts.refs[op][0] == "evidence" for op in value.members)
    assert C.public_key not in seen_one.state.members and C.public_key not in seen_one.electorate(3)
    seen_one.create(C, "commit", round=3, hash=H1, size=10)
    assert C.public_key not in seen_one.commits(3) and C.public_key not in seen_one.contributors(3)


# --- the ban by disputes ----------------------------------------------------------------------


def test_disputes_from_more_than_a_third_of_the_electorate_ban_the_signer():
    replica = seated()
    commit_all(replica)
    signed = result(replica, A)
    disputes = [dispute(replica, late, A) for late in LATE]  # on the roster without a say: they count for nothing
    disputes += [dispute(replica, B, A), dispute(replica, C, A)]  # two of six: exactly a third, not more
    assert len(replica.disputes(2, S1)[(A.public_key, 7, R1)]) == 5
    assert "without disputes by more than a third" in invalid(replica, signed, *disputes)
    assert not replica.state.banned and replica.ban_reason(A.public_key) is None
    disputes.append(dispute(replica, D, A))  # three of six
    assert not replica.state.banned  # disputes alone ban nobody: a certified value naming them does
    value = with_changes(replica, signed, *disputes)
    assert replica.chain.read(value).changes.bans == (A.public_key,)
    proposed = own_value(replica.chain, replica.facts, set(replica.commit_ops(2)))  # an honest proposer names it
    assert {signed, *disputes[-3:]} <= {replica.get(op) for op in proposed.members}
    assert "without the result" in invalid(replica, *disputes)  # the disputes without the result they dispute
    decide(replica, value)
    state = replica.state
    assert state.banned == (A.public_key,) and A.public_key not in state.members
    assert A.public_key not in replica.electorate(3)
    assert replica.ban_reason(A.public_key) == ban_reason(replica.facts, A.public_key, replica.chain) == DISPUTED_REASON
    assert ban_reason(replica.facts, A.public_key) is None  # the facts alone do not say it: the chain does
    # The ban takes effect as any ban: out of the round's contributors and electorate, its commit ignored.
    replica.create(A, "commit", round=3, hash=H1, size=10)
    assert A.public_key not in replica.contributors(3) and A.public_key not in replica.commits(3)


def test_disputes_of_a_hash_the_member_never_signed_ban_nobody():
    replica = seated()
    commit_all(replica)
    signed = result(replica, A)
    wrong_hash, of_f, other_shard, other_set = [], [], [], []
    for author in (B, C, D, E):
        wrong_hash.append(dispute(replica, author, A, R2))  # A signed R1, not R2
        of_f.append(dispute(replica, author, F))  # F signed nothing
        other_shard.append(dispute(replica, author, A, R1, shard=8))  # A signed nothing for shard 8
        other_set.append(dispute(replica, author, A, R1, set_=S2))  # A signed nothing for set S2
    for disputes in (wrong_hash, of_f, other_shard, other_set):
        # named with A's result, they leave it without disputes; named alone, they dispute no result named
        assert "without disputes by more than a third" in invalid(replica, signed, *disputes)
        assert "without the result" in invalid(replica, *disputes)
    assert "without disputes by more than a third" in invalid(replica, signed)
    certify(replica, MEMBERS)  # the round goes on without a verdict
    assert not replica.state.banned and not replica.chain.tip.membership.banned


def test_a_verdict_bans_from_the_next_round_on_and_never_revokes_a_certificate():
    replica = seated()
    first = replica.chain.certificates[1]
    assert F.public_key in first.accepted
    commit_all(replica)
    signed = result(replica, F, R3, round_=1, shard=0)  # a result for round 1, disputed in round 2
    disputes = [dispute(replica, author, F, R3, round_=1, shard=0) for author in (A, B)]
    assert "more than a third" in invalid(replica, signed, *disputes)
    disputes.append(dispute(replica, C, F, R3, round_=1, shard=0))
    decide(replica, with_changes(replica, signed, *disputes))
    assert replica.state.banned == (F.public_key,)
    # Banned after the fact: the certificates it took part in stand as they were.
    assert replica.chain.certificates[1] is first and F.public_key in replica.chain.certificates[1].accepted
    assert F.public_key in replica.chain.certificates[2].electorate and F.public_key in replica.chain.certificates[2].accepted
    assert replica.state.rounds[:2] == ((1, H1), (2, H1))
    assert F.public_key not in replica.electorate(3) and F.public_key not in replica.state.members


def test_a_value_bans_a_signer_once():
    replica = seated()
    commit_all(replica)
    named = []
    for shard in (9, 2):
        named.append(result(replica, A, shard=shard))
        named += [dispute(replica, author, A, shard=shard) for author in (B, C, D)]
    assert "twice" in invalid(replica, *named)  # two verdicts against A in one value
    first = decode_op(result(replica, E, R1, shard=4), replica.run_id)
    second = decode_op(result(replica, E, R2, shard=4), replica.run_id)
    replica.create(F, "evidence", **evidence_fields(first, second))
    signed = result(replica, E, R1, shard=11)
    disputes = [dispute(replica, author, E, shard=11) for author in (B, C, D)]
    assert "twice" in invalid(replica, signed, *disputes)  # evidence (named by the proposer) and a verdict
    value = with_changes(replica, *named[:4])
    decide(replica, value)
    assert set(replica.chain.certificates[2].reading.changes.bans) == {A.public_key, E.public_key}
    assert replica.state.banned == tuple(sorted((A.public_key, E.public_key)))


def test_the_verdicts_do_not_depend_on_the_order_the_ops_came_in():
    replica = seated()
    commit_all(replica)
    signed_a = result(replica, A, R1, shard=7)
    signed_b = result(replica, B, R2, shard=7)
    c_ops = [decode_op(result(replica, C, hash_, shard=1), replica.run_id) for hash_ in (R1, R3)]
    # C equivocates: proven at once, banned once a value names the evidence
    disputes_a = [dispute(replica, author, A) for author in (C, D)]  # two of six: no verdict
    disputes_b = [dispute(replica, author, B, R2) for author in (D, E, F)]  # three of six: a verdict
    disputes_b.append(dispute(replica, LATE[0], B, R2))  # without a say: counts for nothing, named or not
    replica.create(D, "evidence", **evidence_fields(*c_ops))
    assert "more than a third" in invalid(replica, signed_a, *disputes_a)
    decide(replica, with_changes(replica, signed_b, *disputes_b))
    certify(replica, MEMBERS)  # and a round after it
    expected = replica.state
    assert expected.banned == tuple(sorted((B.public_key, C.public_key)))
    assert set(replica.chain.certificates[2].reading.changes.bans) == {B.public_key, C.public_key}
    assert B.public_key not in expected.electorate and C.public_key not in expected.electorate
    ops = in_causal_order(replica)
    rng = random.Random(1234)
    for trial in range(4):
        order = list(reversed(ops)) if trial == 0 else rng.sample(ops, len(ops))
        other = Replica(replica.genesis)
        for data in order:  # out of order: parked until their parents arrive
            other.add(data)
        assert len(other) == len(replica) and other.facts.encode() == replica.facts.encode()
        assert other.state == expected and other.chain.tip.membership == replica.chain.tip.membership


# --- one round, several contributor sets ----------------------------------------------------------


def test_different_results_for_one_shard_under_different_sets_are_no_equivocation():
    replica = run()
    # The first set was given up (another proposal, another attempt): A aggregates the new one as well.
    first = decode_op(replica.create(A, "shard_result", round=1, set=S1, shard=5, hash=R1), replica.run_id)
    second = decode_op(replica.create(A, "shard_result", round=1, set=S2, shard=5, hash=R2), replica.run_id)
    assert not replica.state.banned and replica.ban_reason(A.public_key) is None
    assert replica.shard_results(1, S1)[5] == {A.public_key: {R1}}
    assert replica.shard_results(1, S2)[5] == {A.public_key: {R2}}
    assert evidence_fields(first, second) is None
    with pytest.raises(ProtocolError, match="bad-evidence"):
        guilty_author("double-shard_result", first.data, second.data, replica.run_id)
    assert earlier_statement(replica.facts, A.public_key, "shard_result",
                             {"round": 1, "set": S2, "shard": 5, "hash": R2}) == "same"

    # Two hashes under one set: the ban, and evidence any replica can check.
    before = in_causal_order(replica)
    third = decode_op(replica.create(A, "shard_result", round=1, set=S2, shard=5, hash=R3), replica.run_id)
    assert replica.state.banned == (A.public_key,)
    assert replica.ban_reason(A.public_key) == (
        f"double shard_result: two different ones for round 1, set {S2.hex()[:12]}, shard 5")
    assert evidence_fields(first, third) is None  # R1 (under S1) and R3 (under S2): still no conflict
    fields = evidence_fields(second, third)
    assert fields["reason"] == "double-shard_result"
    assert guilty_author(fields["reason"], fields["a"], fields["b"], replica.run_id) == A.public_key
    seen_two = Replica(replica.genesis)  # saw the two results of different sets, not the third
    for data in before:
        seen_two.add(data)
    assert not seen_two.state.banned
    seen_two.create(B, "evidence", **fields)
    assert seen_two.state.banned == (A.public_key,)


def test_disputes_under_one_set_do_not_count_toward_a_result_signed_under_another():
    replica = seated()
    commit_all(replica)
    under_s1, under_s2 = result(replica, A, set_=S1), result(replica, A, set_=S2)  # the same values, both sets
    disputes = [dispute(replica, B, A, set_=S1), dispute(replica, C, A, set_=S1)]
    disputes.append(dispute(replica, D, A, set_=S2))  # three disputers of (round 2, shard 7, R1), split two and one
    assert "more than a third" in invalid(replica, under_s1, under_s2, *disputes)
    signed_b = result(replica, B, R2, shard=3, set_=S2)
    against_b = [dispute(replica, author, B, R2, shard=3, set_=S1) for author in (C, D, E)]  # all under S1
    assert "without" in invalid(replica, signed_b, *against_b)  # B signed R2 for shard 3 only under S2
    disputes.append(dispute(replica, E, A, set_=S1))  # a third under S1: that result's disputers are more than a third
    assert "more than a third" in invalid(replica, under_s2, disputes[-2])
    value = with_changes(replica, under_s1, *disputes[:2], disputes[-1])
    assert replica.chain.read(value).changes.bans == (A.public_key,)
    decide(replica, value)
    assert replica.state.banned == (A.public_key,)


# --- the facts of a run without these ops ---------------------------------------------------------


def test_the_facts_of_a_run_without_them_are_what_they_were():
    members = keys(4, offset=70)
    replica = joined_replica(members)
    certify(replica, members)
    certify(replica, members)
    replica.create(members[1], "checkpoint", round=2, id=CKPT, size=99)
    replica.create(members[2], "attest", round=2, id=CKPT, size=99)
    replica.create(members[3], "prevote", round=3, epoch=0, attempt=0, value=b"")
    replica.create(members[0], "score", round=2, authors=sorted(m.public_key for m in members[:2]), scores=[3, -4])
    data = replica.facts.encode()
    tables = unpack(data, max_size=2**20)
    assert "shard_result" not in tables and "dispute" not in tables  # empty tables are not written
    # The state hash of this very log (the same keys, ops and signatures): the canonical form of
    # the facts must not move, or every snapshot signed before would no longer verify.
    assert hashlib.sha256(data).hexdigest() == "0611d7ce0465075d82230b0dc75825cd1cde661f545795d1c78fd952bf88a8f4"
    assert replica.state.round == 2 and replica.state.banned == ()
    assert replica.state.rounds == ((1, H1), (2, H1)) and H2 not in dict(replica.state.rounds).values()
