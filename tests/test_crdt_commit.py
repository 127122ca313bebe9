"""Payload commitments (`crdt.commit`) and the per-round queries the round protocol polls."""

from __future__ import annotations

import random

import pytest

from locomesh.crdt import (
    Facts, InvalidValue, Replica, Value, decode_op, encode_op, evidence_fields, load_snapshot, op_id, snapshot_fields,
)
from locomesh.protocol import ProtocolError, pack, unpack

from .test_crdt_support import H2, attempt_proposed_by, certify, in_causal_order, joined_replica, keys

MEMBERS = keys(4)
A, B, C, D = MEMBERS
OUTSIDER = keys(1, offset=50)[0]
P1, P2, P3 = b"\xa1" * 32, b"\xa2" * 32, b"\xa3" * 32


def commit(replica: Replica, who, round_: int, payload: bytes = P1, size: int = 1000) -> bytes:
    return replica.create(who, "commit", round=round_, hash=payload, size=size)


def _round_history() -> Replica:
    """Four members; round 1 committed by all and certified, round 2 committed by three, D leaving
    after round 1."""
    replica = joined_replica(MEMBERS)
    for index, member in enumerate(MEMBERS):
        commit(replica, member, 1, bytes([index + 1]) * 32, 100 + index)
    certify(replica, MEMBERS)
    replica.create(D, "leave", round=1)
    for member in (A, B, C):
        commit(replica, member, 2, P2, 2000)
    return replica


def test_commits_and_precommits_are_listed_per_round():
    replica = _round_history()
    assert replica.commits(1) == {m.public_key: (bytes([i + 1]) * 32, 100 + i) for i, m in enumerate(MEMBERS)}
    assert replica.commits(2) == {m.public_key: (P2, 2000) for m in (A, B, C)}  # D's leave names round 1
    assert replica.commits(3) == {}
    assert set(replica.commit_ops(2)) == {m.public_key for m in (A, B, C)}
    assert replica.chain.voters(1) == {A.public_key}  # round 1's electorate: the creator alone
    assert replica.chain.voters(2) == frozenset()
    assert replica.chain.certificates[1].accepted == {m.public_key for m in MEMBERS}
    assert replica.electorate(2) == {m.public_key for m in MEMBERS}  # a leave waits for a value to name it
    assert replica.state.round == 1


def test_any_delivery_order_gives_the_same_facts_and_answers():
    source = _round_history()
    certify(source, [A, B, C], H2, attempt=attempt_proposed_by(source, [A, B, C]))
    ops = in_causal_order(source)
    rng = random.Random(4)
    for _trial in range(5):
        shuffled = ops[:]
        rng.shuffle(shuffled)
        replica = Replica(source.genesis)
        for data in shuffled:
            replica.add(data)
        assert replica.facts.encode() == source.facts.encode()
        assert replica.state == source.state and replica.state.round == 2
        assert replica.chain.certificates == source.chain.certificates
        for round_ in (1, 2):
            assert replica.commits(round_) == source.commits(round_)
            assert replica.chain.voters(round_) == source.chain.voters(round_)


@pytest.mark.parametrize("second", [(P2, 1000), (P1, 1001)], ids=["other-hash", "other-size"])
def test_two_different_commitments_for_one_round_are_a_ban(second):
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    commit(replica, B, 2, P1, 1000)
    commit(replica, C, 2, P3, 10)
    assert replica.state.banned == ()
    first = replica.get(replica.commit_ops(2)[B.public_key])
    double = commit(replica, B, 2, *second)
    assert replica.state.banned == (B.public_key,)
    assert replica.commits(2) == {C.public_key: (P3, 10)}
    assert B.public_key not in replica.commit_ops(2)  # no value can take either of its payloads
    evidence = replica.create(A, "evidence", **evidence_fields(*(decode_op(d, replica.run_id) for d in (first, double))))
    others = [A, C, D]
    value = certify(replica, others, attempt=attempt_proposed_by(replica, others))
    assert op_id(evidence) in value.members
    assert B.public_key not in replica.electorate(3) and B.public_key not in replica.state.members


def test_repeating_a_commitment_or_committing_to_another_round_is_no_ban():
    replica = joined_replica(MEMBERS)
    commit(replica, A, 1)
    commit(replica, A, 1)  # a second op (new seq) saying the same thing contradicts nothing
    commit(replica, A, 2, P2)
    assert replica.state.banned == ()
    assert replica.commits(1) == {A.public_key: (P1, 1000)} and replica.commits(2) == {A.public_key: (P2, 1000)}


def test_only_members_commit_and_only_keys_that_may_contribute_count():
    """A key that never joined writes no commit (one that left does: it comes back by committing); a
    fresh key's commit is a valid op that no value may take until its join is admitted and the
    round's slate draws it; a key admitted at genesis may contribute in the round that admits its
    join."""
    replica = joined_replica([A, B])
    replica.create(C, "join", round=1)  # not admitted: fresh, it must earn a say
    with pytest.raises(ProtocolError, match="not-member"):
        commit(replica, OUTSIDER, 1)
    for author in (A, B, C):
        commit(replica, author, 1)
    assert set(replica.commits(1)) == {A.public_key, B.public_key, C.public_key}
    assert replica.contributors(1) == {A.public_key, B.public_key}
    with pytest.raises(InvalidValue, match="may not contribute"):
        replica.chain.read(Value(1, tuple(sorted(replica.commit_ops(1).values()))))
    value = certify(replica, [A, B])
    assert replica.chain.certificates[1].accepted == {A.public_key, B.public_key}
    assert replica.commit_ops(1)[C.public_key] not in value.set
    assert replica.contributors(2) == {A.public_key, B.public_key, C.public_key}  # the slate draws the one fresh key
    replica.create(B, "leave", round=2)
    commit(replica, B, 2)  # no join again: a graceful stop is undone by the next commit
    assert B.public_key in replica.commits(2) and B.public_key in replica.contributors(2)


def test_a_commit_op_is_checked_against_its_schema():
    run = joined_replica([A]).run_id
    good = encode_op(A, run, "crdt.commit", [], 1, round=1, hash=P1, size=2**31)
    assert decode_op(good, run).body["size"] == 2**31
    for fields in ({"round": 0, "hash": P1, "size": 1}, {"round": 1, "hash": P1, "size": 0},
                   {"round": 1, "hash": P1, "size": 2**31 + 1}, {"round": 1, "hash": P1[:31], "size": 1},
                   {"round": 2**40 + 1, "hash": P1, "size": 1}, {"round": 1, "hash": P1}):
        with pytest.raises(ProtocolError, match="bad-field"):
            encode_op(A, run, "crdt.commit", [], 1, **fields)


def test_double_commit_evidence_convicts_where_only_one_side_was_seen():
    seen_both = joined_replica(MEMBERS)
    certify(seen_both, MEMBERS)
    base = in_causal_order(seen_both)
    a = commit(seen_both, D, 2, P1)
    b = commit(seen_both, D, 2, P2)
    fields = evidence_fields(decode_op(a, seen_both.run_id), decode_op(b, seen_both.run_id))
    assert fields["reason"] == "double-commit"

    seen_one = Replica(seen_both.genesis)
    for data in base + [a]:
        seen_one.add(data)
    assert seen_one.commits(2) == {D.public_key: (P1, 1000)} and seen_one.state.banned == ()
    evidence = seen_one.create(A, "evidence", **fields)
    assert seen_one.state.banned == (D.public_key,) and "convicted" in seen_one.ban_reason(D.public_key)
    others = [A, B, C]
    assert op_id(evidence) in certify(seen_one, others, contributors=others,
                                      attempt=attempt_proposed_by(seen_one, others)).members
    assert D.public_key not in seen_one.electorate(3)
    commit(seen_one, D, 3, P3)
    assert D.public_key not in seen_one.commits(3)

    same = commit(seen_both, C, 2, P1)
    again = commit(seen_both, C, 2, P1)
    bogus = {"reason": "double-commit", "a": min(same, again), "b": max(same, again)}
    with pytest.raises(ProtocolError, match="bad-evidence"):
        seen_one.create(B, "evidence", **bogus)


def test_commits_survive_the_snapshot_round_trip():
    full = _round_history()
    commit(full, A, 1, P3)  # A equivocates: the ban must survive compaction too
    encoded = full.facts.encode()
    decoded = Facts.decode(encoded)
    assert decoded.rows["commit"] == full.facts.rows["commit"] and decoded.encode() == encoded
    assert decoded.equivocated == {A.public_key}

    fields, facts_bytes = snapshot_fields(full)
    certificate = [full.create(member, "snapshot", **fields) for member in (A, B, C)]
    newcomer = load_snapshot(full.genesis, facts_bytes, certificate)
    later = [d for d in in_causal_order(full) if op_id(d) not in full.ancestry(list(newcomer.heads))]
    for data in later:
        newcomer.add(data)
    commit(full, B, 3, P3)
    newcomer.add(full.get(max(full.heads, key=lambda h: full.facts.ops[h][2])))
    assert newcomer.facts.encode() == full.facts.encode()
    for round_ in (1, 2, 3):
        assert newcomer.commits(round_) == full.commits(round_)
        assert newcomer.chain.voters(round_) == full.chain.voters(round_)
    assert newcomer.chain.certificates[1].accepted == full.chain.certificates[1].accepted
    assert full.commits(1) == {m.public_key: (bytes([i + 1]) * 32, 100 + i) for i, m in enumerate(MEMBERS) if m != A}


def test_snapshot_facts_with_a_bad_commit_row_are_refused():
    raw = unpack(_round_history().facts.encode(), max_size=2**20)
    raw["commit"][0][4] = 0  # a commitment to an empty payload
    with pytest.raises(ProtocolError, match="bad-field"):
        Facts.decode(pack(raw))
    raw = unpack(_round_history().facts.encode(), max_size=2**20)
    raw["commit"].reverse()
    with pytest.raises(ProtocolError, match="non-canonical"):
        Facts.decode(pack(raw))


def test_a_proposal_names_the_commitments_a_round_aggregates_and_waits_for_them():
    """A proposal's value is the op IDs it names (crdt/value.py): its facts row gives the value
    back, and a replica applies it only once it holds every op the value names, whatever its parents."""
    replica = _round_history()
    commits = replica.commit_ops(2)
    value = Value(2, tuple(sorted(commits[m.public_key] for m in (A, B))))
    own = commits[A.public_key]  # A's newest op, written before B's commit
    data = encode_op(A, replica.run_id, "crdt.proposal", [own], replica.facts.ops[own][1] + 1, round=2, epoch=0,
                     attempt=0, valid=0, **value.fields())
    fresh = Replica(replica.genesis)
    for op in in_causal_order(replica):
        if op_id(op) != commits[B.public_key]:
            fresh.add(op)
    assert fresh.add(data).waiting and fresh.wanted() == [commits[B.public_key]]
    assert op_id(data) in fresh.add(replica.get(commits[B.public_key])).applied
    (row,) = fresh.facts.in_round("proposal", 2)[A.public_key]
    assert Value.of_proposal(row) == value and row[0] == op_id(data)
    assert fresh.facts.in_round("proposal", 1).keys() == {fresh.chain.certificates[1].proposer}
    restored = Facts.decode(fresh.facts.encode())
    assert restored.in_round("proposal", 2) == {A.public_key: {row}}


def test_two_different_proposals_for_one_attempt_are_an_equivocation():
    replica = _round_history()
    both = Value(2, tuple(sorted(replica.commit_ops(2)[m.public_key] for m in (A, B))))
    one = Value(2, (replica.commit_ops(2)[A.public_key],))
    first = replica.create(B, "proposal", round=2, epoch=0, attempt=0, valid=0, **both.fields())
    replica.create(B, "proposal", round=2, epoch=0, attempt=1, valid=0, **one.fields())
    assert replica.state.banned == ()  # another attempt is another place
    second = replica.create(B, "proposal", round=2, epoch=0, attempt=0, valid=0, **one.fields())
    assert replica.state.banned == (B.public_key,)
    a, b = (decode_op(data, replica.run_id) for data in (first, second))
    assert evidence_fields(a, b)["reason"] == "double-proposal"


def test_listeners_hear_of_every_applied_op_and_not_of_duplicates():
    writer = joined_replica(MEMBERS)
    reader = joined_replica(MEMBERS)
    heard = []
    reader.listeners.append(lambda: heard.append(len(reader)))
    ops = [commit(writer, member, 1) for member in (A, B)]
    before = len(reader)
    for data in ops:
        reader.add(data)
    assert heard == [before + 1, before + 2]  # after each op is applied: the reader sees it already
    reader.add(ops[0])
    assert len(heard) == 2  # a duplicate changes nothing, so nobody is told
