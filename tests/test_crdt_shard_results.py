"""The ops of sharded exchange in the CRDT: `shard_result` (a committee member's signed hash of a
shard's aggregate) and `dispute` (a member's word that its exact recomputation differs): their
shape and limits, the replica's per-round indexes, the ban for two different results (with its
evidence), the ban by disputes from more than a third of the round's electorate, and the facts of
a run without them kept byte for byte."""

from __future__ import annotations

import hashlib
import random

import pytest

from locomesh.crdt import Facts, Replica, decode_op, evidence_fields, guilty_author
from locomesh.crdt.evidence import ban_reason
from locomesh.crdt.limits import earlier_statement
from locomesh.crdt.ops import seal_ops
from locomesh.protocol import ProtocolError, canonical, unpack
from locomesh.protocol.kinds import MAX_SHARDS

from .test_crdt_support import CKPT, H1, H2, in_causal_order, joined_replica, keys

MEMBERS = keys(6, offset=30)  # attempt 0's electorate of round 1: all six ("joined" influence)
LATE = keys(3, offset=40)  # members that join for round 3: not in round 1's electorate
A, B, C, D, E, F = MEMBERS
R1, R2, R3 = b"\x31" * 32, b"\x32" * 32, b"\x33" * 32  # shard result hashes
# Two contributor sets of one round (a new attempt, another proposal), named as the driver names them.
S1 = hashlib.sha256(b"locomesh set" + b"".join(sorted(m.public_key for m in MEMBERS))).digest()
S2 = hashlib.sha256(b"locomesh set" + b"".join(sorted(m.public_key for m in MEMBERS[:5]))).digest()


def run() -> Replica:
    replica = joined_replica(MEMBERS)
    for late in LATE:
        replica.create(late, "join", round=3)
    return replica


def forged(identity, run_id: bytes, kind: str, body: dict) -> bytes:
    """A sealed op whose body skips every check a writer runs (what a hostile peer can send)."""
    content = canonical.pack({"author": identity.public_key, "body": {"parents": [], "seq": 1, **body},
                              "kind": f"crdt.{kind}", "run": run_id, "v": 1})
    return seal_ops(identity, run_id, [content])[0]


def dispute(replica: Replica, author, member, hash_: bytes = R1, round_: int = 1, shard: int = 7,
            set_: bytes = S1) -> bytes:
    return replica.create(author, "dispute", round=round_, set=set_, shard=shard, member=member.public_key,
                          hash=hash_)


# --- the ops ------------------------------------------------------------------------------------


def test_both_ops_round_trip_through_the_schema_and_the_facts():
    replica = run()
    result = replica.create(A, "shard_result", round=1, set=S1, shard=MAX_SHARDS - 1, hash=R1)
    disputed = dispute(replica, B, A, shard=MAX_SHARDS - 1)
    op = decode_op(result, replica.run_id)
    assert (op.kind, op.body["round"], op.body["set"], op.body["shard"], op.body["hash"]) == (
        "crdt.shard_result", 1, S1, MAX_SHARDS - 1, R1)
    op = decode_op(disputed, replica.run_id)
    assert (op.kind, op.body["set"], op.body["member"], op.body["hash"]) == ("crdt.dispute", S1, A.public_key, R1)
    data = replica.facts.encode()
    decoded = Facts.decode(data)
    assert decoded.shard_results == replica.facts.shard_results == {(A.public_key, 1, S1, MAX_SHARDS - 1, R1)}
    assert decoded.disputes == replica.facts.disputes == {(B.public_key, 1, S1, MAX_SHARDS - 1, A.public_key, R1)}
    assert decoded.encode() == data
    assert decoded.shard_results_in(1, S1) == {MAX_SHARDS - 1: {A.public_key: {R1}}}
    assert decoded.shard_results_in(1, S2) == {} and decoded.disputes_in(1, S2) == {}
    assert decoded.disputes_in(1, S1) == {(A.public_key, MAX_SHARDS - 1, R1): {B.public_key}}
    raw = unpack(data, max_size=2**20)
    raw["shard_results"] = raw["disputes"] = []  # empty tables written out: not the canonical form
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
        with pytest.raises(ProtocolError) as refused:  # no vote backs round 5: at most round 0 + AHEAD
            replica.create(A, kind, round=5, set=S1, shard=0, **fields)
        assert refused.value.code == "too-far-ahead"
    with pytest.raises(ProtocolError) as refused:
        dispute(replica, A, A)
    assert refused.value.code == "names-self"
    for _ in range(2):  # the same result twice is let in (a restart); a third is over the cap
        replica.create(A, "shard_result", round=1, set=S1, shard=3, hash=R1)
    with pytest.raises(ProtocolError, match="at most 2"):
        replica.create(A, "shard_result", round=1, set=S1, shard=3, hash=R1)
    replica.create(A, "shard_result", round=1, set=S1, shard=4, hash=R1)  # each shard is counted apart
    replica.create(A, "shard_result", round=1, set=S2, shard=3, hash=R2)  # and each set
    for _ in range(2):
        dispute(replica, B, A, shard=3)
    with pytest.raises(ProtocolError, match="at most 2"):
        dispute(replica, B, A, shard=3, hash_=R2)
    dispute(replica, B, C, shard=3)  # another member of the same shard is counted apart
    dispute(replica, B, A, R2, shard=3, set_=S2)  # and another set


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
    dispute(replica, C, B, R2, shard=1)
    dispute(replica, D, B, R2, shard=1)
    dispute(replica, D, A, R3, shard=0)  # a hash A never signed: kept, counts for nothing
    dispute(replica, E, A, R2, shard=0, set_=S2)
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
    replica = run()
    replica.create(A, "shard_result", round=1, set=S1, shard=5, hash=R1)
    replica.create(A, "shard_result", round=1, set=S1, shard=5, hash=R1)  # the same statement again
    replica.create(B, "shard_result", round=1, set=S1, shard=5, hash=R1)
    replica.create(B, "shard_result", round=1, set=S1, shard=6, hash=R2)  # another shard: no conflict
    assert not replica.state.banned
    before = in_causal_order(replica)
    first = decode_op(replica.create(C, "shard_result", round=1, set=S1, shard=5, hash=R1), replica.run_id)
    second = decode_op(replica.create(C, "shard_result", round=1, set=S1, shard=5, hash=R2), replica.run_id)
    assert replica.state.banned == (C.public_key,) and C.public_key not in replica.state.members
    assert replica.shard_results(1, S1)[5][C.public_key] == {R1, R2}
    reason = ban_reason(replica.facts, C.public_key)
    assert reason == f"double shard result: two different ones for round 1, set {S1.hex()[:12]}, shard 5"
    assert replica.ban_reason(C.public_key) == reason and replica.ban_reason(A.public_key) is None

    fields = evidence_fields(first, second)
    assert fields["reason"] == "double-result"
    assert guilty_author(fields["reason"], fields["a"], fields["b"], replica.run_id) == C.public_key
    same = [decode_op(data, replica.run_id) for data in before[-4:-2]]  # A's result twice
    assert same[0].author == same[1].author == A.public_key and evidence_fields(*same) is None
    with pytest.raises(ProtocolError, match="bad-evidence"):
        guilty_author("double-result", same[0].data, same[1].data, replica.run_id)

    seen_one = Replica(replica.genesis)  # saw only the first result: the evidence is what bans there
    for data in before + [first.data]:
        seen_one.add(data)
    assert not seen_one.state.banned
    seen_one.create(D, "evidence", **fields)
    assert seen_one.state.banned == (C.public_key,)
    assert ban_reason(seen_one.facts, C.public_key) == "convicted by evidence of an equivocation seen elsewhere"


# --- the ban by disputes ----------------------------------------------------------------------


def test_disputes_from_more_than_a_third_of_the_electorate_ban_the_signer():
    replica = run()
    replica.create(A, "shard_result", round=1, set=S1, shard=7, hash=R1)
    assert replica.electorate(1) == {m.public_key for m in MEMBERS}
    for late in LATE:  # members, but not of round 1's electorate: they count for nothing
        dispute(replica, late, A)
    dispute(replica, B, A)
    dispute(replica, C, A)  # two of six: exactly a third, not more
    assert not replica.state.banned and replica.ban_reason(A.public_key) is None
    assert len(replica.disputes(1, S1)[(A.public_key, 7, R1)]) == 5
    dispute(replica, D, A)  # three of six
    state = replica.state
    assert state.banned == (A.public_key,) and state.disputed == {A.public_key: (1, S1, 7)}
    assert A.public_key not in state.members
    reason = (f"disputed: more than a third of round 1's electorate recomputed shard 7 of set {S1.hex()[:12]} "
              "and found its signed result wrong")
    assert replica.ban_reason(A.public_key) == ban_reason(replica.facts, A.public_key, state) == reason
    assert ban_reason(replica.facts, A.public_key) is None  # the facts alone do not say it: the state does
    # The ban takes effect as any ban: out of the round's contributors and electorate, its commit ignored.
    replica.create(A, "commit", round=1, hash=H1, size=10)
    assert A.public_key not in replica.contributors(1) and A.public_key not in replica.electorate(1)
    assert A.public_key not in replica.commits(1)


def test_disputes_of_a_hash_the_member_never_signed_ban_nobody():
    replica = run()
    replica.create(A, "shard_result", round=1, set=S1, shard=7, hash=R1)
    for author in (B, C, D, E):
        dispute(replica, author, A, R2)  # A signed R1, not R2
        dispute(replica, author, F)  # F signed nothing
        dispute(replica, author, A, R1, shard=8)  # A signed nothing for shard 8
        dispute(replica, author, A, R1, set_=S2)  # A signed nothing for set S2
    assert not replica.state.banned and replica.state.disputed == {}


def test_the_electorate_of_a_certified_round_is_its_first_attempts():
    replica = run()
    for m in MEMBERS:
        replica.create(m, "commit", round=1, hash=bytes([m.public_key[0]]) * 32, size=10)
    replica.create(A, "propose", round=1, authors=sorted(m.public_key for m in MEMBERS))
    for m in MEMBERS:
        replica.create(m, "vote", round=1, hash=H2, proposer=A.public_key)
    assert replica.state.round == 1 and len(replica.state.certificates[1].attempts[0]) == 6
    replica.create(F, "shard_result", round=1, set=S1, shard=0, hash=R3)
    dispute(replica, A, F, R3, shard=0)
    dispute(replica, B, F, R3, shard=0)
    assert not replica.state.banned
    dispute(replica, C, F, R3, shard=0)
    assert replica.state.disputed == {F.public_key: (1, S1, 0)} and replica.state.banned == (F.public_key,)
    # Banned after the fact, F leaves round 1's electorate: five of its six voters still certify it.
    assert replica.state.round == 1 and F.public_key not in replica.state.certificates[1].electorate


def test_the_first_round_and_shard_that_banned_is_the_one_named():
    replica = run()
    for shard in (9, 2):
        replica.create(A, "shard_result", round=2, set=S1, shard=shard, hash=R1)
        for author in (B, C, D):
            dispute(replica, author, A, round_=2, shard=shard)
    assert replica.state.disputed == {A.public_key: (2, S1, 2)}
    replica.create(A, "shard_result", round=1, set=S1, shard=11, hash=R1)
    for author in (B, C, D):
        dispute(replica, author, A, round_=1, shard=11)
    assert replica.state.disputed == {A.public_key: (1, S1, 11)}


def test_the_verdicts_do_not_depend_on_the_order_the_ops_came_in():
    replica = run()
    replica.create(A, "shard_result", round=1, set=S1, shard=7, hash=R1)
    replica.create(B, "shard_result", round=1, set=S1, shard=7, hash=R2)
    replica.create(C, "shard_result", round=1, set=S1, shard=1, hash=R1)
    replica.create(C, "shard_result", round=1, set=S1, shard=1, hash=R3)  # C equivocates
    for author in (C, D):
        dispute(replica, author, A)  # C is banned itself: the electorate is five, one of them disputes
    for author in (D, E):
        dispute(replica, author, B, R2)  # two of five: B is banned
    dispute(replica, LATE[0], B, R2)
    expected = replica.state
    assert expected.banned == tuple(sorted((B.public_key, C.public_key))) and set(expected.disputed) == {B.public_key}
    ops = in_causal_order(replica)
    rng = random.Random(1234)
    for trial in range(4):
        order = list(reversed(ops)) if trial == 0 else rng.sample(ops, len(ops))
        other = Replica(replica.genesis)
        for data in order:  # out of order: parked until their parents arrive
            other.add(data)
        assert len(other) == len(replica) and other.facts.encode() == replica.facts.encode()
        assert other.state.banned == expected.banned and other.state.disputed == expected.disputed


# --- one round, several contributor sets ----------------------------------------------------------


def test_different_results_for_one_shard_under_different_sets_are_no_equivocation():
    replica = run()
    # The first set was given up (a split, another proposal): A aggregates the new one as well.
    first = decode_op(replica.create(A, "shard_result", round=1, set=S1, shard=5, hash=R1), replica.run_id)
    second = decode_op(replica.create(A, "shard_result", round=1, set=S2, shard=5, hash=R2), replica.run_id)
    assert not replica.state.banned and replica.ban_reason(A.public_key) is None
    assert replica.shard_results(1, S1)[5] == {A.public_key: {R1}}
    assert replica.shard_results(1, S2)[5] == {A.public_key: {R2}}
    assert evidence_fields(first, second) is None
    with pytest.raises(ProtocolError, match="bad-evidence"):
        guilty_author("double-result", first.data, second.data, replica.run_id)
    assert earlier_statement(replica.facts, A.public_key, "shard_result",
                             {"round": 1, "set": S2, "shard": 5, "hash": R2}) == "same"

    # Two hashes under one set: the ban, and evidence any replica can check.
    before = in_causal_order(replica)
    third = decode_op(replica.create(A, "shard_result", round=1, set=S2, shard=5, hash=R3), replica.run_id)
    assert replica.state.banned == (A.public_key,)
    assert replica.ban_reason(A.public_key) == (
        f"double shard result: two different ones for round 1, set {S2.hex()[:12]}, shard 5")
    assert evidence_fields(first, third) is None  # R1 (under S1) and R3 (under S2): still no conflict
    fields = evidence_fields(second, third)
    assert fields["reason"] == "double-result"
    assert guilty_author(fields["reason"], fields["a"], fields["b"], replica.run_id) == A.public_key
    seen_two = Replica(replica.genesis)  # saw the two results of different sets, not the third
    for data in before:
        seen_two.add(data)
    assert not seen_two.state.banned
    seen_two.create(B, "evidence", **fields)
    assert seen_two.state.banned == (A.public_key,)


def test_disputes_under_one_set_do_not_count_toward_a_result_signed_under_another():
    replica = run()
    replica.create(A, "shard_result", round=1, set=S1, shard=7, hash=R1)
    replica.create(A, "shard_result", round=1, set=S2, shard=7, hash=R1)  # the same values, both sets
    dispute(replica, B, A, set_=S1)
    dispute(replica, C, A, set_=S1)
    dispute(replica, D, A, set_=S2)  # three disputers of (round 1, shard 7, R1), but split two and one
    assert not replica.state.banned and replica.state.disputed == {}
    replica.create(B, "shard_result", round=1, set=S2, shard=3, hash=R2)
    for author in (C, D, E):  # three of six, all under S1: B signed R2 for shard 3 only under S2
        dispute(replica, author, B, R2, shard=3, set_=S1)
    assert not replica.state.banned
    dispute(replica, E, A, set_=S1)  # a third under S1: that result's disputers are more than a third
    assert replica.state.disputed == {A.public_key: (1, S1, 7)} and replica.state.banned == (A.public_key,)


# --- the facts of a run without these ops ---------------------------------------------------------


def test_the_facts_of_a_run_without_them_are_what_they_were():
    replica = joined_replica(keys(4, offset=70))
    members = keys(4, offset=70)
    for m in members:
        replica.create(m, "commit", round=1, hash=bytes([m.public_key[0]]) * 32, size=10)
    replica.create(members[0], "propose", round=1, authors=sorted(m.public_key for m in members))
    for m in members:
        replica.create(m, "vote", round=1, hash=H1, proposer=members[0].public_key)
    replica.create(members[1], "checkpoint", round=1, id=CKPT, size=99)
    replica.create(members[2], "attest", round=1, id=CKPT, size=99)
    replica.create(members[3], "timeout", round=2, attempt=0)
    replica.create(members[0], "score", round=1, authors=sorted(m.public_key for m in members[:2]), scores=[3, -4])
    data = replica.facts.encode()
    assert "shard_results" not in unpack(data, max_size=2**20) and "disputes" not in unpack(data, max_size=2**20)
    # The state hash of this very log before these op kinds existed (the same keys, ops and signatures).
    assert hashlib.sha256(data).hexdigest() == "61f475b989b5f3175572764daa88e2b90c787ed3fa231840f836249d9cadaf64"
    assert replica.state.round == 1 and replica.state.disputed == {}
