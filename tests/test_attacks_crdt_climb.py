"""Issue #34, finding 5: one member grows every replica without bound.

A key that joined an open run once could name a round up to 4 past the highest round its causal
past named, its own ops included, so it climbed 4 rounds per op: 5,000 proposals of 17 KiB, all
applied, 44 MB kept in every replica. Now a round must be backed by another member's precommit
of a value (or by any such precommit, for a key trusted at genesis), and each author's chain
holds at most a budget of ops and bytes per window of rounds (crdt/limits.py, rules 3 and 5).
"""

from __future__ import annotations

import random

import pytest

from locomesh.crdt import Replica, op_id
from locomesh.crdt.limits import AHEAD, NO_VOTES, WINDOW, WINDOW_BYTES, WINDOW_OPS, Limits
from locomesh.crdt.ops.base import MAX_SET
from locomesh.netsim.adversaries import forged_chain as chain
from locomesh.protocol import ProtocolError

from .test_attacks_crdt_spam import codes, held_ids, precommit, proposal
from .test_crdt_support import H1, certify, joined_replica, keys

MEMBERS = keys(3)
A, B, C = MEMBERS  # A created the run and admitted B and C at genesis
CLIMBER, FRIEND = keys(2, offset=90)  # fresh keys: trusted by nobody
MiB = 1024 * 1024


def started(*fresh) -> Replica:
    """A run of A, B, C and the fresh keys `fresh` (the climber by default): round 1 certified by
    A (its electorate), which admitted every join; no round past it precommitted yet."""
    fresh = fresh or (CLIMBER,)
    replica = joined_replica([*MEMBERS, *fresh], admitted=[B.public_key, C.public_key])
    certify(replica, MEMBERS)
    assert replica.chain.round == 1 and replica.chain.tip.electorate == {m.public_key for m in MEMBERS}
    return replica


def kept_by(replica: Replica, author: bytes) -> tuple[int, int]:
    """(ops, bytes) of `author` that `replica` applied and keeps."""
    mine = [i for i, row in replica.facts.ops.items() if row[0] == author]
    return len(mine), sum(len(replica.get(i)) for i in mine)


def test_a_member_cannot_climb_on_its_own_precommits():
    replica = started()
    said = codes(replica, chain(replica, CLIMBER, [precommit(r) for r in range(1, 1 + 20 * AHEAD, AHEAD)]))
    # Round 1 is backed by A's precommit: the climber's own precommit of 1 + AHEAD backs nothing further for it.
    assert said[:3] == ["applied", "applied", "too-far-ahead"] and set(said[3:]) == {"invalid-parent"}
    named = sorted(replica.commit_ops(1).values())
    with pytest.raises(ProtocolError, match="too-far-ahead"):
        replica.create(CLIMBER, "proposal", **proposal(2 + AHEAD, named)[1])
    replica.create(A, "precommit", **precommit(2)[1])  # the run moves on: the climber may follow
    assert replica.create(CLIMBER, "proposal", **proposal(2 + AHEAD, named)[1])


def test_the_attack_5000_climbing_proposals_keep_a_few_in_every_replica():
    """The finding: 5,000 proposals of 17 KiB by one member, each 4 rounds past the one before
    (each naming MAX_SET ops the replica holds, so none waits for a dependency)."""
    replica = started()
    everyone = held_ids(replica)
    assert len(everyone) == MAX_SET
    before = len(replica)
    spam = chain(replica, CLIMBER, [proposal(1 + AHEAD * i, everyone) for i in range(5000)])
    assert sum(map(len, spam)) > 80 * MiB
    said = codes(replica, spam)
    assert said[:2] == ["applied", "applied"] and said[2] == "too-far-ahead"
    ops, kept = kept_by(replica, CLIMBER.public_key)
    assert len(replica) - before == 2 and ops == 3  # its join, and two proposals
    assert kept < 64 * 1024, f"{kept} bytes kept"
    assert not replica.pending


def test_an_author_writes_at_most_its_budget_of_ops_per_window_of_rounds():
    """Prevotes and precommits for every attempt of every round: within the caps per (round,
    epoch, attempt), over the budget."""
    replica = started()
    specs = []
    for round_ in range(2, 2 + WINDOW):
        for attempt in range(64):  # the same message twice: the cap, and no equivocation
            specs += [("prevote", {"round": round_, "epoch": 0, "attempt": attempt, "value": H1})] * 2
            specs += [precommit(round_, attempt=attempt)] * 2
    assert len(specs) > WINDOW_OPS
    own, _bytes = kept_by(replica, A.public_key)  # its join, commit, proposal and precommit of round 1 count
    said = codes(replica, chain(replica, A, specs))  # A created the run: its own precommits back its rounds
    assert said[:WINDOW_OPS - own] == ["applied"] * (WINDOW_OPS - own)
    assert said[WINDOW_OPS - own] == "over-budget" and set(said[WINDOW_OPS - own + 1:]) == {"invalid-parent"}


def test_an_author_writes_at_most_its_budget_of_bytes_per_window_of_rounds():
    limits, key = Limits(), A.public_key
    link = limits.next_link("join", {"round": 1}, None, NO_VOTES, key, 100)
    big = 300 * 1024
    for round_ in (1, 2, 3):
        link = limits.next_link("attest", {"round": round_, "id": H1, "size": 1}, link, NO_VOTES, key, big)
    with pytest.raises(ProtocolError, match="over-budget"):
        limits.next_link("attest", {"round": 4, "id": H1, "size": 1}, link, NO_VOTES, key, WINDOW_BYTES - 3 * big)
    # A window later the old rounds no longer count.
    backed = (1 + WINDOW, B.public_key, 0)
    assert limits.next_link("attest", {"round": 1 + WINDOW, "id": H1, "size": 1}, link, backed, key, big)


def test_evidence_spends_no_budget_so_equivocators_cannot_silence_an_honest_member():
    """An honest node writes evidence for every equivocator it sees, each up to tens of KiB: were
    it budgeted, Sybils equivocating in bulk would spend its budget and its precommits would be refused."""
    limits, key = Limits(), A.public_key
    link = limits.next_link("join", {"round": 1}, None, NO_VOTES, key, 100)
    big = 70 * 1024
    for _ in range(16):  # rule 2's cap of evidence ops a round
        link = limits.next_link("evidence", {}, link, NO_VOTES, key, big)
    assert 16 * big > WINDOW_BYTES - 100
    assert limits.next_link("precommit", precommit(1)[1], link, NO_VOTES, key, 200)


def test_replicas_agree_on_climbers_in_any_order():
    """One member climbs on its own precommits, a pair climbs on each other's, honest members
    precommit on the way. Every rule reads the causal past alone, so every replica applies and
    refuses the same ops whatever order they come in."""
    source = started(CLIMBER, FRIEND)
    named = sorted(source.commit_ops(1).values())
    ops = chain(source, CLIMBER, [proposal(1 + AHEAD * i, named) for i in range(20)])
    codes(source, ops)
    for step in range(12):
        who = (CLIMBER, FRIEND)[step % 2]
        batch = chain(source, who, [precommit(2 + AHEAD * step),
                                    ("commit", {"round": 2 + AHEAD * step + AHEAD, "hash": H1, "size": 1})])
        codes(source, batch)
        ops += batch
        if step % 4 == 0:
            ops.append(source.create(B, "precommit", **precommit(2 + step // 4)[1]))
    refused = {i for i in map(op_id, ops) if source.is_rejected(i)}
    applied = {i for i in map(op_id, ops) if i in source}
    assert refused and applied and refused.isdisjoint(source.op_ids())
    outcomes = set()
    for seed in range(4):
        order = ops[:]
        random.Random(seed).shuffle(order)
        replica = started(CLIMBER, FRIEND)
        for _sweep in range(3):  # ops parked before their parents come out as their parents apply
            codes(replica, order)
        assert all(replica.is_rejected(i) for i in refused)
        outcomes.add((replica.op_ids(), replica.facts.encode()))
    assert len(outcomes) == 1 and next(iter(outcomes))[0] == source.op_ids()
