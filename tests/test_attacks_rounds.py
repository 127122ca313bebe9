"""Attacks on a round's liveness (issue #18, findings 1, 7 and B), on the pure round logic: the
round machine (node/rounds/machine.py) driven event by event, and the run state (crdt/) through the
real Replica. The same attacks run against real nodes in netsim: tests/test_attacks_netsim.py."""

from __future__ import annotations

from locomesh.crdt import Replica
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.status import waiting_on

from .test_crdt_support import genesis, keys

A, B, W = b"a" * 32, b"b" * 32, b"w" * 32
SEED = b"\x5e" * 32


def _me_after(withholder: bytes, others: tuple[bytes, ...]) -> bytes:
    """A key that comes right after `withholder` in round 1's proposer order (seed SEED)."""
    for byte in range(256):
        key = bytes([byte]) * 32
        if key in (withholder, *others):
            continue
        order = rm.proposer_order(1, SEED, {key, withholder, *others})
        if order[:2] == [withholder, key]:
            return key
    raise AssertionError("no such key")


ME = _me_after(W, (A, B))
ELECTORATE = (ME, A, B, W)


def seen(now, **fields):
    fields.setdefault("electorate", frozenset(ELECTORATE))
    return rm.Observation(now, 0, None, commits=fields.pop("commits", {}), seed=SEED, **fields)


def test_a_proposer_that_withholds_a_payload_of_its_own_set_is_passed_over():
    """W is first in proposer order, commits, never serves its payload and proposes a set that
    names itself. On bfb477a the honest peers followed that proposal for ever (320 Fetch actions,
    still in `propose` after 6 hours); now its set is given up after ABANDON_AFTER failed fetches
    and the next proposer's set is aggregated."""
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0)) == [rm.StartTraining(1)]
    machine.handle(rm.Trained(1, b"m" * 32, 10, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10), W: (b"pw" * 16, 10)}
    machine.handle(seen(1.1, commits=commits))
    machine.handle(rm.Fetched(1, A, True, 1.2))
    machine.handle(rm.Fetched(1, B, True, 1.3))
    withheld = tuple(sorted(ELECTORATE))
    proposals = {W: withheld}
    now, fetches, actions = 1.4, 0, machine.handle(rm.Fetched(1, W, False, 1.4))
    while not any(isinstance(a, rm.PublishProposal) for a in actions):
        assert now < 60.0, "still following the withheld proposal after a minute"
        now += 0.5
        actions = machine.handle(seen(now, commits=commits, proposals=proposals))
        if rm.Fetch(1, W, b"pw" * 16, 10) in actions:
            fetches += 1
            actions += machine.handle(rm.Fetched(1, W, False, now))
    ours = tuple(sorted((ME, A, B)))
    assert rm.PublishProposal(1, ours) in actions and rm.StartAggregate(1, ours, 1.1) in actions
    assert 1 + fetches == rm.ABANDON_AFTER  # the fetch before our cut failed too
    assert machine.handle(rm.Aggregated(1, b"\x01" * 32, now)) == [rm.PublishVote(1, b"\x01" * 32, ME)]


def test_the_proposer_order_is_drawn_from_the_certified_hash_so_no_key_is_ground_to_be_first():
    """On bfb477a the order was drawn from the round number alone: a key could be ground offline
    to come first in any round it chose. Now the seed is the hash certified before the round."""
    members = {A, B, W, ME}
    firsts = {rm.proposer_order(7, bytes([i]) * 32, members)[0] for i in range(32)}
    assert firsts == members
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    assert machine.current.seed == SEED


def test_the_proposer_order_changes_with_the_attempt():
    members = {A, B, W, ME}
    assert len({tuple(rm.proposer_order(3, SEED, members, attempt)) for attempt in range(8)}) > 1


def test_a_round_past_its_deadline_says_so_once_per_attempt_and_a_new_attempt_restarts_the_turns():
    machine = rm.RoundMachine(ME, timing=rm.Timing(round_deadline=30.0))
    machine.handle(seen(0.0))
    machine.handle(rm.Trained(1, b"m" * 32, 10, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine.handle(seen(1.1, commits=commits))
    machine.handle(rm.Fetched(1, A, True, 1.2))
    machine.handle(rm.Fetched(1, B, True, 1.3))  # W never commits
    assert rm.PublishTimeout(1, 0) not in machine.handle(seen(29.9, commits=commits))
    assert rm.PublishTimeout(1, 0) in machine.handle(seen(30.0, commits=commits))
    assert rm.PublishTimeout(1, 0) not in machine.handle(seen(31.0, commits=commits))
    smaller = frozenset({ME, A, B})
    machine.handle(seen(32.0, commits=commits, electorate=smaller, attempt=1))
    assert machine.current.attempt == 1 and machine.current.attempt_started == 32.0
    assert rm.PublishTimeout(1, 1) not in machine.handle(seen(61.9, commits=commits, electorate=smaller, attempt=1))
    assert rm.PublishTimeout(1, 1) in machine.handle(seen(62.0, commits=commits, electorate=smaller, attempt=1))


def test_run_status_says_what_a_round_waits_for_and_on_whom():
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    assert waiting_on(machine) == ("our inner steps", frozenset({ME}))
    machine.handle(rm.Trained(1, b"m" * 32, 10, 1.0, 1.0))
    machine.handle(seen(1.1, commits={A: (b"pa" * 16, 10)}))
    what, on = waiting_on(machine)
    assert what == "commits and payloads until the cutoff" and on == {A, B, W}
    machine.handle(rm.Fetched(1, A, True, 1.2))
    machine.handle(seen(10.0, commits={A: (b"pa" * 16, 10)}))  # cut; W's turn to propose
    assert waiting_on(machine) == ("the round's proposal", frozenset({W}))


# --- the run state: a crashed member leaves a stalled round's electorate -----------------------

MEMBERS = keys(3)
X, Y, Z = MEMBERS
H1, H2 = b"\x11" * 32, b"\x22" * 32


def _three_member_run() -> Replica:
    replica = Replica(genesis(X, influence="joined"))
    for member in MEMBERS:
        replica.create(member, "join", round=1)
    for member in MEMBERS:
        replica.create(member, "commit", round=1, hash=bytes([member.public_key[0]]) * 32, size=10)
        replica.create(member, "vote", round=1, hash=H1)
    assert replica.state.round == 1
    return replica


def test_a_member_that_crashed_before_committing_no_longer_deadlocks_a_three_member_run():
    """Z crashes before committing to round 2: a quorum of 3 needs all 3 votes, and on bfb477a the
    other two sat in round 2 for ever. Both time out attempt 0; attempt 1's electorate is who showed
    up in the round, and their two votes certify it."""
    replica = _three_member_run()
    for member in (X, Y):
        replica.create(member, "commit", round=2, hash=bytes([member.public_key[0]]) * 32, size=10)
        replica.create(member, "vote", round=2, hash=H2)
    assert replica.state.round == 1
    replica.create(X, "timeout", round=2, attempt=0)
    assert replica.state.round == 1 and len(replica.attempts(2)) == 1  # one of three: not more than a third
    replica.create(Y, "timeout", round=2, attempt=0)
    assert replica.attempts(2) == [frozenset(m.public_key for m in MEMBERS), frozenset({X.public_key, Y.public_key})]
    assert replica.state.round == 2 and replica.state.rounds[-1] == (2, H2)
    assert replica.electorate(3) == {X.public_key, Y.public_key}  # Z answered nothing in the stalled round
    assert replica.lapsed(Z.public_key, 3)  # back from its crash, it joins again


def test_attempts_never_certify_two_hashes():
    """X voted H1 and Y H2 in round 2 (Z silent): no attempt can certify either, however many
    timeouts come, since every attempt keeps both voters."""
    replica = _three_member_run()
    replica.create(X, "vote", round=2, hash=H1)
    replica.create(Y, "vote", round=2, hash=H2)
    for attempt in range(3):
        for member in (X, Y):
            replica.create(member, "timeout", round=2, attempt=attempt)
    assert len(replica.attempts(2)) == 4
    assert replica.state.round == 1


def test_a_minority_cannot_close_an_attempt_early():
    replica = _three_member_run()
    replica.create(X, "timeout", round=2, attempt=0)
    replica.create(X, "timeout", round=2, attempt=1)
    assert len(replica.attempts(2)) == 1
    assert replica.electorate(2) == {m.public_key for m in MEMBERS}


def test_a_member_that_crashed_after_its_commit_leaves_the_retried_round_too():
    """Z committed to round 2 and crashed before its vote left it: the next attempt keeps only who
    voted or timed out, so X and Y certify the round without it."""
    replica = _three_member_run()
    for member in MEMBERS:
        replica.create(member, "commit", round=2, hash=bytes([member.public_key[0]]) * 32, size=10)
    for member in (X, Y):
        replica.create(member, "vote", round=2, hash=H2)
        replica.create(member, "timeout", round=2, attempt=0)
    assert replica.attempts(2)[-1] == {X.public_key, Y.public_key}
    assert replica.state.round == 2
