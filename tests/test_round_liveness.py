"""Issue #33: rounds that stay live when members come and go, on the run state (crdt/electorate.py)
through the real Replica. A split attempt (no hash can reach a quorum any more) ends as soon as
its votes are seen, without a clock; a vote stands through attempts that only timed out; and
whatever order ops arrive in, no two replicas ever see two hashes certified for one round."""

from __future__ import annotations

import random

import pytest

from locomesh.crdt import Replica
from locomesh.crdt.electorate import split_votes
from locomesh.crdt.evidence import ban_reason
from locomesh.protocol import ProtocolError

from .test_crdt_support import genesis, keys

MEMBERS = keys(4)
W, X, Y, Z = MEMBERS
H1, H2, H3 = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32


def _run(members=MEMBERS[1:]) -> Replica:
    """A run whose round 1 is certified by `members`, each of which committed to round 2."""
    replica = Replica(genesis(members[0], influence="joined"))
    for member in members:
        replica.create(member, "join", round=1)
    for member in members:
        replica.create(member, "vote", round=1, hash=H1)
    for member in members:
        replica.create(member, "commit", round=2, hash=bytes([member.public_key[0]]) * 32, size=10)
    assert replica.state.round == 1
    return replica


def test_a_split_between_two_members_ends_the_attempt_at_once_and_the_next_one_certifies():
    """The restart case of #33: two members voted different sets. On 198eff9 both waited for the
    round deadline, and attempt 1 split again (votes were per round: nobody could vote again)."""
    replica = _run(MEMBERS[1:3])
    replica.create(X, "propose", round=2, authors=[X.public_key])
    replica.create(Y, "propose", round=2, authors=sorted([X.public_key, Y.public_key]))
    replica.create(X, "vote", round=2, hash=H1, proposer=X.public_key)
    assert len(replica.attempts(2)) == 1  # Y may still vote H1
    replica.create(Y, "vote", round=2, hash=H2, proposer=Y.public_key)
    history = replica.history(2)
    assert [a.split for a in history] == [True, False] and history[1].electorate == {X.public_key, Y.public_key}
    assert replica.votes(2) == {}  # both votes died with attempt 0
    assert split_votes(history) == {X.public_key: 1, Y.public_key: 1}
    for member in (X, Y):
        replica.create(member, "vote", round=2, hash=H2, proposer=Y.public_key, attempt=1)
    assert replica.state.round == 2 and replica.state.rounds[-1] == (2, H2)
    assert replica.state.certificates[2].accepted == {X.public_key, Y.public_key}
    assert not replica.state.banned  # a vote again in a new attempt is no equivocation


def test_an_attempt_does_not_split_while_the_members_yet_to_vote_could_still_make_a_quorum():
    replica = _run()
    replica.create(X, "vote", round=2, hash=H1)
    replica.create(Y, "vote", round=2, hash=H2)
    assert len(replica.attempts(2)) == 2  # 1 + Z's vote to come = 2 of 3: no quorum possible
    replica = _run(MEMBERS)  # four: 1 + 2 to come = 3 of 4 could still agree
    replica.create(W, "vote", round=2, hash=H1)
    replica.create(X, "vote", round=2, hash=H2)
    assert len(replica.attempts(2)) == 1
    replica.create(Y, "vote", round=2, hash=H3)
    assert len(replica.attempts(2)) == 2


def test_a_split_leaves_out_of_the_next_attempt_the_members_that_neither_voted_nor_timed_out():
    replica = _run()
    replica.create(X, "vote", round=2, hash=H1)
    replica.create(Y, "vote", round=2, hash=H2)
    assert replica.attempts(2)[-1] == {X.public_key, Y.public_key}  # Z crashed: gone from attempt 1
    for member in (X, Y):
        replica.create(member, "vote", round=2, hash=H1, attempt=1)
    assert replica.state.rounds[-1] == (2, H1)


def test_a_vote_stands_through_an_attempt_that_only_timed_out():
    """X and Y voted H1 and Z went silent: the timeouts start attempt 1 without Z, and the votes
    cast in attempt 0 certify it there, with nobody voting again."""
    replica = _run()
    for member in (X, Y):
        replica.create(member, "vote", round=2, hash=H1)
        replica.create(member, "timeout", round=2, attempt=0)
    history = replica.history(2) if replica.state.round == 1 else None
    assert history is None and replica.state.rounds[-1] == (2, H1)
    assert replica.state.certificates[2].electorate == {X.public_key, Y.public_key}


def test_a_fresh_vote_from_a_member_whose_vote_stands_is_not_counted():
    """A member locked to H1 (its attempt only timed out) that votes H2 in the next attempt does
    not move the tally: honest members never do that, and counting it could certify two hashes."""
    replica = _run(MEMBERS)
    for member in (W, X):
        replica.create(member, "vote", round=2, hash=H1)
    for member in (W, X, Y):
        replica.create(member, "timeout", round=2, attempt=0)
    assert len(replica.attempts(2)) == 2
    replica.create(W, "vote", round=2, hash=H2, attempt=1)
    assert replica.votes(2) == {W.public_key: H1, X.public_key: H1}
    replica.create(Y, "vote", round=2, hash=H1, attempt=1)
    assert replica.state.rounds[-1] == (2, H1)


def test_a_join_again_that_names_a_later_round_leaves_the_certificates_before_it_alone():
    """Found by `sim soak`: a member that lapsed and joined again (its new join naming round 24)
    stopped counting in the electorates of every round before 24, so the certificates those rounds
    had (its vote among them) were taken back, and every member synced back to round 5."""
    replica = _run(MEMBERS)
    for member in (W, X, Z):
        replica.create(member, "vote", round=2, hash=H2)
    assert replica.state.round == 2  # 3 of 4: Y was silent
    replica.create(Z, "join", round=6)
    assert replica.state.round == 2 and Z.public_key in replica.contributors(2)


def test_two_votes_in_one_attempt_are_an_equivocation_and_two_attempts_are_not():
    replica = _run()
    replica.create(X, "vote", round=2, hash=H1, attempt=0)
    replica.create(X, "vote", round=2, hash=H2, attempt=1)
    assert ban_reason(replica.facts, X.public_key) is None
    replica.create(Y, "vote", round=2, hash=H1, attempt=0)
    replica.create(Y, "vote", round=2, hash=H2, attempt=0)
    assert ban_reason(replica.facts, Y.public_key) == "double vote: two different ones for round 2, attempt 0"
    with pytest.raises(ProtocolError):  # the cap: two votes per attempt at most
        replica.create(Y, "vote", round=2, hash=H3, attempt=0)


# --- safety under any arrival order ----------------------------------------------------------------


def _honest_and_hostile_ops(rng: random.Random) -> tuple[Replica, list[bytes]]:
    """A round 2 played out among W, X, Y (honest: one vote per attempt, only while they hold no
    standing vote, for a hash of their choice) and Z (hostile: votes anything in any attempt,
    times out at will), with random timeouts; returns the source replica and every op written."""
    source = _run(MEMBERS)
    written: list[bytes] = []
    for _ in range(rng.randrange(4, 16)):
        history = source.history(2) if source.state.round == 1 else None
        if history is None:
            break
        attempt = len(history) - 1
        author = rng.choice(MEMBERS)
        if author is Z:
            if rng.random() < 0.6:
                hash_, at = rng.choice((H1, H2, H3)), rng.randrange(attempt + 1)
                if ban_reason(source.facts, Z.public_key) is None and not any(
                        a == at for a, _h, _p in source.facts.votes_in(2).get(Z.public_key, ())):
                    written.append(source.create(Z, "vote", round=2, hash=hash_, attempt=at))
            elif attempt not in source.facts.timeouts_in(2).get(Z.public_key, ()):
                written.append(source.create(Z, "timeout", round=2, attempt=attempt))
        elif rng.random() < 0.6:
            cast = {a for a, _h, _p in source.facts.votes_in(2).get(author.public_key, ())}
            if author.public_key in history[-1].electorate and author.public_key not in history[-1].standing \
                    and attempt not in cast:
                written.append(source.create(author, "vote", round=2, hash=rng.choice((H1, H2, H3)), attempt=attempt))
        elif attempt not in source.facts.timeouts_in(2).get(author.public_key, ()):
            written.append(source.create(author, "timeout", round=2, attempt=attempt))
    return source, written


@pytest.mark.parametrize("seed", range(40))
def test_no_arrival_order_certifies_two_hashes_for_one_round(seed):
    """Every prefix of several random delivery orders of the same ops: once a replica sees round 2
    certified with a hash, it never sees another hash certified for it, and all agree in the end."""
    rng = random.Random(seed)
    source, written = _honest_and_hostile_ops(rng)
    final = source.state.certificates.get(2)
    for _order in range(3):
        replica = _run(MEMBERS)
        shuffled = written[:]
        rng.shuffle(shuffled)
        seen_hash = None
        for data in shuffled:
            replica.add(data)
            certificate = replica.state.certificates.get(2)
            if certificate is not None:
                assert seen_hash in (None, certificate.hash), "a second hash certified for round 2"
                seen_hash = certificate.hash
        assert (replica.state.certificates.get(2) is None) == (final is None)
        if final is not None:
            assert replica.state.certificates[2].hash == final.hash


# --- the round machine: voting again after a split, locks, the last resort, the deadline ------------

from locomesh.node.rounds import machine as rm  # noqa: E402

A, B = b"a" * 32, b"b" * 32


def _first_proposer() -> bytes:
    """A key that comes first in round 1's proposer order among itself, A and B."""
    return next(key for key in (bytes([byte]) * 32 for byte in range(256))
                if key not in (A, B) and rm.proposer_order(1, b"", {key, A, B})[0] == key)


ME = _first_proposer()
COMMITS = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10), ME: (b"p" * 32, 100)}


def _seen(now, **fields):
    certified, certified_hash = fields.pop("certified", 0), fields.pop("certified_hash", None)
    return rm.Observation(now, certified, certified_hash, fields.pop("electorate", frozenset((ME, A, B))),
                          fields.pop("commits", COMMITS), **fields)


def _voted_machine() -> rm.RoundMachine:
    """ME proposed and voted H1 for the set of all three in attempt 0 of round 1."""
    machine = rm.RoundMachine(ME)
    machine.handle(_seen(0.0))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 10.0))
    machine.handle(_seen(10.1))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    everyone = tuple(sorted((ME, A, B)))
    assert machine.handle(rm.Fetched(1, B, True, 10.3)) == [rm.PublishProposal(1, everyone), rm.StartAggregate(1, everyone, 10.1)]
    assert machine.handle(rm.Aggregated(1, H1, 10.4)) == [rm.PublishVote(1, H1, ME, 0)]
    return machine


def test_a_vote_that_died_with_a_split_is_cast_again_for_the_set_most_votes_of_the_split_named():
    machine = _voted_machine()
    ours, theirs = tuple(sorted((ME, A, B))), tuple(sorted((ME, A)))
    proposals = {ME: ours, A: theirs}
    assert machine.handle(_seen(10.5, proposals=proposals, standing=frozenset({ME}))) == []
    split = _seen(11.0, proposals=proposals, attempt=1, split_votes={ME: 1, A: 2})
    assert machine.handle(split) == [rm.StartAggregate(1, theirs, 10.1)]
    assert machine.handle(rm.Aggregated(1, H2, 11.5)) == [rm.PublishVote(1, H2, A, 1)]


def test_after_a_split_with_a_tie_the_larger_set_wins():
    machine = _voted_machine()
    ours, theirs = tuple(sorted((ME, A, B))), tuple(sorted((ME, A)))
    split = _seen(11.0, proposals={ME: ours, A: theirs}, attempt=1, split_votes={ME: 1, A: 1})
    assert machine.handle(split) == [rm.StartAggregate(1, ours, 10.1)]


def test_a_vote_in_an_attempt_that_only_timed_out_stands_and_is_not_cast_again():
    machine = _voted_machine()
    locked = _seen(700.0, attempt=1, standing=frozenset({ME, A}), electorate=frozenset({ME, A}))
    assert machine.handle(locked) == []
    assert machine.phase is rm.Phase.VOTED


def test_a_set_to_converge_on_whose_payload_we_lack_is_fetched_first():
    machine = _voted_machine()
    commits = {**COMMITS, b"c" * 32: (b"pc" * 16, 10)}
    theirs = tuple(sorted((ME, A, b"c" * 32)))
    split = _seen(11.0, commits=commits, proposals={A: theirs}, attempt=1, split_votes={A: 2})
    assert machine.handle(split) == [rm.Fetch(1, b"c" * 32, b"pc" * 16, 10)]
    assert machine.handle(rm.Fetched(1, b"c" * 32, True, 11.2)) == [rm.StartAggregate(1, theirs, 10.1)]


def test_once_every_turn_passed_with_no_set_to_follow_a_member_proposes_its_own():
    """The 8-daemon stall of #33: the member that held six payloads waited for a proposal it could
    follow for a whole attempt. Now it proposes what it holds once every turn passed: a vote for it
    ends the attempt (a split, if another set was voted), and the next one converges."""
    machine = rm.RoundMachine(ME)
    machine.handle(_seen(0.0))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 10.0))
    machine.handle(_seen(10.1))
    machine.handle(rm.Fetched(1, A, False, 10.2))
    assert machine.handle(rm.Fetched(1, B, False, 10.3)) == []  # {ME}: 1 of 3, refused; A's turn, then B's
    now, actions = 10.3, []
    while not any(isinstance(a, rm.PublishProposal) for a in actions):
        now += 1.0
        assert now < 60.0, "never proposed"
        actions = machine.handle(_seen(now))
        for action in actions:
            if isinstance(action, rm.Fetch):
                actions = actions + machine.handle(rm.Fetched(1, action.author, False, now))
    assert rm.PublishProposal(1, (ME,)) in actions
    assert now > 10.3 + rm.PATIENCE * rm.MIN_COLLECT_SECONDS  # A, which committed, had its patience first


def test_the_attempt_deadline_follows_the_rounds_seen_within_the_run_s_bounds():
    machine = rm.RoundMachine(ME, timing=rm.Timing(round_deadline=600.0))
    assert machine.deadline() == 600.0  # nothing seen yet: the run's deadline
    machine.durations.extend([4.0, 5.0, 6.0])
    assert machine.deadline() == rm.MIN_DEADLINE
    machine.durations.extend([40.0])
    assert machine.deadline() == 120.0
    machine.durations.extend([400.0])
    assert machine.deadline() == 600.0
    voted = _voted_machine()
    voted.handle(_seen(12.0, certified=1, certified_hash=H1))
    assert list(voted.durations) == [12.0]  # a round certified with us: from its start here to its certificate


# --- a stuck round is visible ---------------------------------------------------------------------

from locomesh.cli.run_view import waiting_text  # noqa: E402
from locomesh.node.doctor.run_checks import progress_check  # noqa: E402
from locomesh.node.rounds.status import round_clock, waiting_on  # noqa: E402


def test_a_stuck_round_says_since_when_until_when_on_whom_and_what_comes_next():
    machine = _voted_machine()
    machine.durations.extend([10.0, 12.0, 11.0])
    assert round_clock(machine, 20.0)["stuck"] is False  # within twice the longest recent round
    clock = round_clock(machine, 40.0)
    assert {k: clock[k] for k in ("attempt", "waited_s", "deadline_s", "usual_s", "stuck")} == {
        "attempt": 0, "waited_s": 40.0, "deadline_s": rm.MIN_DEADLINE + 6.0, "usual_s": 12.0, "stuck": True}
    assert clock["next"].startswith("said the attempt passed its deadline")
    what, on = waiting_on(machine, frozenset({ME}))
    waiting = {"for": what, "on": ["12D3KooWA", "12D3KooWB"], "unreachable": ["12D3KooWB"], **clock}
    line = waiting_text(waiting)
    assert "12D3KooWB (not connected)" in line and "attempt 0: 40 s of its 36 s deadline" in line
    check = progress_check({"run_id": "abc", "phase": "voted", "round": 0, "certified": 0, "waiting": waiting})
    assert check.status == "warn" and "round 1 is stuck" in check.detail and "not voted" in check.detail
    assert progress_check({"phase": "train", "round": 4, "certified": 4, "waiting": {"stuck": False}}).status == "ok"
