"""Payload commitments (`crdt.commit`) and the per-round queries the round protocol polls."""

from __future__ import annotations

import random

import pytest

from locomesh.crdt import Facts, Replica, decode_op, encode_op, evidence_fields, load_snapshot, op_id, snapshot_fields
from locomesh.protocol import ProtocolError, pack, unpack

from .test_crdt_support import H1, in_causal_order, joined_replica, keys

MEMBERS = keys(4)
A, B, C, D = MEMBERS
OUTSIDER = keys(1, offset=50)[0]
P1, P2, P3 = b"\xa1" * 32, b"\xa2" * 32, b"\xa3" * 32


def commit(replica: Replica, who, round_: int, payload: bytes = P1, size: int = 1000) -> bytes:
    return replica.create(who, "commit", round=round_, hash=payload, size=size)


def _round_history() -> Replica:
    """Four members; round 1 committed and voted by all, round 2 committed by three, D left after 1."""
    replica = joined_replica(MEMBERS)
    for index, member in enumerate(MEMBERS):
        commit(replica, member, 1, bytes([index + 1]) * 32, 100 + index)
    for member in MEMBERS:
        replica.create(member, "vote", round=1, hash=H1)
    replica.create(D, "leave", round=1)
    for member in (A, B, C):
        commit(replica, member, 2, P2, 2000)
    return replica


def test_commits_and_votes_are_listed_per_round():
    replica = _round_history()
    assert replica.commits(1) == {m.public_key: (bytes([i + 1]) * 32, 100 + i) for i, m in enumerate(MEMBERS)}
    assert replica.commits(2) == {m.public_key: (P2, 2000) for m in (A, B, C)}  # D's leave names round 1
    assert replica.commits(3) == {}
    assert replica.votes(1) == {m.public_key: H1 for m in MEMBERS}
    assert replica.votes(2) == {}
    assert replica.electorate(2) == {m.public_key for m in (A, B, C)}
    assert replica.state.round == 1


def test_any_delivery_order_gives_the_same_facts_and_answers():
    source = _round_history()
    ops = in_causal_order(source)
    rng = random.Random(4)
    for _trial in range(5):
        shuffled = ops[:]
        rng.shuffle(shuffled)
        replica = Replica(source.genesis)
        for data in shuffled:
            replica.add(data)
        assert replica.facts.encode() == source.facts.encode()
        assert replica.state == source.state
        for round_ in (1, 2):
            assert replica.commits(round_) == source.commits(round_)
            assert replica.votes(round_) == source.votes(round_)


@pytest.mark.parametrize("second", [(P2, 1000), (P1, 1001)], ids=["other-hash", "other-size"])
def test_two_different_commitments_for_one_round_are_a_ban(second):
    replica = joined_replica(MEMBERS)
    commit(replica, A, 1, P1, 1000)
    commit(replica, B, 1, P3, 10)
    replica.create(A, "vote", round=1, hash=H1)
    assert replica.state.banned == ()
    commit(replica, A, 1, *second)
    assert replica.state.banned == (A.public_key,)
    assert replica.commits(1) == {B.public_key: (P3, 10)}
    assert replica.votes(1) == {}  # a banned author's vote counts for nothing either
    assert A.public_key not in replica.electorate(1)


def test_repeating_a_commitment_or_committing_to_another_round_is_no_ban():
    replica = joined_replica(MEMBERS)
    commit(replica, A, 1)
    commit(replica, A, 1)  # a second op (new seq) saying the same thing contradicts nothing
    commit(replica, A, 2, P2)
    assert replica.state.banned == ()
    assert replica.commits(1) == {A.public_key: (P1, 1000)} and replica.commits(2) == {A.public_key: (P2, 1000)}


def test_the_queries_skip_non_members_late_joiners_leavers_and_forkers():
    replica = joined_replica([A, B])
    replica.create(C, "join", round=3)  # trains from round 3 on
    for author in (A, B, C):
        commit(replica, author, 2)
        commit(replica, author, 3)
        replica.create(author, "vote", round=2, hash=H1)
    replica.create(B, "leave", round=2)  # trains up to round 2 (a leaver writes nothing after its leave)
    with pytest.raises(ProtocolError, match="not-member"):  # a key that never joined writes nothing but joins
        commit(replica, OUTSIDER, 2)
    assert set(replica.commits(2)) == {A.public_key, B.public_key}
    assert set(replica.commits(3)) == {A.public_key, C.public_key}
    assert set(replica.votes(2)) == {A.public_key, B.public_key}
    fork = encode_op(A, replica.run_id, "crdt.join", [], 1, round=3)  # A's seq 1 again
    replica.add(fork)
    assert set(replica.commits(2)) == {B.public_key} and set(replica.commits(3)) == {C.public_key}


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
    base = in_causal_order(seen_both)
    a = commit(seen_both, D, 1, P1)
    b = commit(seen_both, D, 1, P2)
    fields = evidence_fields(decode_op(a, seen_both.run_id), decode_op(b, seen_both.run_id))
    assert fields["reason"] == "double-commit"

    seen_one = Replica(seen_both.genesis)
    for data in base + [a]:
        seen_one.add(data)
    assert seen_one.commits(1) == {D.public_key: (P1, 1000)}
    seen_one.create(A, "evidence", **fields)
    assert seen_one.state.banned == (D.public_key,) and seen_one.commits(1) == {}

    same = commit(seen_both, C, 1, P1)
    again = commit(seen_both, C, 1, P1)
    bogus = {"reason": "double-commit", "a": min(same, again), "b": max(same, again)}
    with pytest.raises(ProtocolError, match="bad-evidence"):
        seen_one.create(B, "evidence", **bogus)


def test_commits_survive_the_snapshot_round_trip():
    full = _round_history()
    commit(full, A, 1, P3)  # A equivocates: the ban must survive compaction too
    encoded = full.facts.encode()
    decoded = Facts.decode(encoded)
    assert decoded.commits == full.facts.commits and decoded.encode() == encoded
    assert decoded.equivocated == {A.public_key}

    fields, facts_bytes = snapshot_fields(full)
    certificate = [full.create(member, "snapshot", **fields) for member in (B, C)]
    newcomer = load_snapshot(full.genesis, facts_bytes, certificate)
    later = [d for d in in_causal_order(full) if op_id(d) not in full.ancestry(list(newcomer.heads))]
    for data in later:
        newcomer.add(data)
    commit(full, B, 3, P3)
    newcomer.add(full.get(max(full.heads, key=lambda h: full.facts.ops[h][2])))
    assert newcomer.facts.encode() == full.facts.encode()
    for round_ in (1, 2, 3):
        assert newcomer.commits(round_) == full.commits(round_)
        assert newcomer.votes(round_) == full.votes(round_)
    assert full.commits(1) == {m.public_key: (bytes([i + 1]) * 32, 100 + i) for i, m in enumerate(MEMBERS) if m != A}


def test_snapshot_facts_with_a_bad_commit_row_are_refused():
    raw = unpack(_round_history().facts.encode(), max_size=2**20)
    raw["commits"][0][3] = 0  # a commitment to an empty payload
    with pytest.raises(ProtocolError, match="bad-field"):
        Facts.decode(pack(raw))
    raw = unpack(_round_history().facts.encode(), max_size=2**20)
    raw["commits"].reverse()
    with pytest.raises(ProtocolError, match="non-canonical"):
        Facts.decode(pack(raw))


def test_a_proposal_names_the_commitments_a_round_aggregates():
    replica = _round_history()
    chosen = sorted(m.public_key for m in (A, B))
    replica.create(A, "propose", round=2, authors=chosen)
    assert replica.proposals(2) == {A.public_key: tuple(chosen)}
    assert replica.proposals(1) == {}
    restored = Facts.decode(replica.facts.encode())
    assert restored.proposals_in(2) == {A.public_key: {tuple(chosen)}}


def test_two_different_proposals_for_one_round_are_an_equivocation():
    replica = _round_history()
    first = replica.create(B, "propose", round=2, authors=sorted(m.public_key for m in (A, B)))
    second = replica.create(B, "propose", round=2, authors=[A.public_key])
    assert B.public_key in replica.state.banned
    assert replica.proposals(2) == {}
    a, b = (decode_op(data, replica.run_id) for data in (first, second))
    assert evidence_fields(a, b)["reason"] == "double-propose"


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
