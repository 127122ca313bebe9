"""Issue #33: rounds that stay live when members come and go, on the agreement (node/agreement/:
Tendermint over the run's CRDT) through real replicas. Whatever order ops arrive in, no replica
ever sees a certificate change or two for one round; a join again leaves the certificates alone;
two messages of one kind in one attempt are an equivocation, in two attempts or epochs they are
not; the attempt deadline follows the run's pace; and a stuck round says why, on whom, and what
comes next. (Tendermint's rules one by one: tests/test_agreement_machine.py; its invariants
under faults: tests/test_agreement_properties.py.)"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from locomesh.cli.run_view import waiting_text
from locomesh.crdt import Replica
from locomesh.crdt.evidence import ban_reason
from locomesh.node.doctor.run_checks import progress_check
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.deciding import MIN_DEADLINE, Deciding
from locomesh.node.rounds.status import round_clock, waiting_on
from locomesh.protocol import ProtocolError, peer_id_from_public_key

from .agreement_sim import World
from .test_attacks_rounds import MEMBERS, RECOVER, _run, agree, participation, peers
from .test_crdt_support import H1, H2, certify, in_causal_order

H3 = b"\x33" * 32


def test_a_join_again_by_a_member_leaves_the_certificates_and_its_say_alone():
    """Found by `sim soak` on 198eff9: a member that joined again (its new join naming round 24)
    stopped counting in the electorates of every round before 24, and the certificates those
    rounds had (its vote among them) were taken back. Certificates are final, and a join of a key
    on the roster admits nothing."""
    replica = _run()
    certify(replica, MEMBERS)
    certified = replica.state.rounds
    assert len(certified) == 2
    again = MEMBERS[3]
    replica.create(again, "join", round=6)
    assert replica.state.rounds == certified and replica.chain.tip.electorate == {m.public_key for m in MEMBERS}
    certify(replica, MEMBERS)
    assert replica.state.rounds[:2] == certified and replica.electorate(4) == {m.public_key for m in MEMBERS}
    assert again.public_key in replica.chain.voters(3)


@pytest.mark.parametrize("kind", ["prevote", "precommit"])
def test_two_messages_in_one_attempt_are_an_equivocation_and_two_attempts_or_epochs_are_not(kind):
    replica = _run()
    x, y = MEMBERS[1:3]

    def say(member, value, attempt=0, epoch=0):
        fields = {"state": value} if kind == "precommit" else {}
        return replica.create(member, kind, round=2, epoch=epoch, attempt=attempt, value=value, **fields)

    say(x, H1, attempt=0)
    say(x, H2, attempt=1)
    say(x, H3, epoch=1)
    assert ban_reason(replica.facts, x.public_key) is None
    say(y, H1)
    say(y, H2)
    assert ban_reason(replica.facts, y.public_key) == f"double {kind}: two different ones for round 2, epoch 0, attempt 0"
    assert y.public_key in replica.state.banned
    with pytest.raises(ProtocolError, match="over-cap"):  # the cap: two per attempt at most
        say(y, H3)


# --- safety under any arrival order ----------------------------------------------------------------

SCENARIOS = {
    "an equivocator": dict(seed=1, n=4, behaviours={3: "equivocate"}),
    "votes ahead": dict(seed=2, n=7, behaviours={1: "future", 2: "future"}),
    "a wrong state": dict(seed=3, n=4, behaviours={2: "wrong_hash"}),
    "a withholder": dict(seed=4, n=4, behaviours={1: "withhold"}),
    "a crash and a recovery": dict(seed=5, n=3, recover_after=60.0),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_arrival_order_changes_a_certificate(scenario):
    """Every op of a run played out by real seats (a Byzantine member, or a member that crashed and
    the recovery epoch that followed), added to fresh replicas in several random orders: after
    every op, each certificate a replica holds is the one it held before, if any, and in the end
    every replica holds the certificates of the replica the ops came from."""
    world = World(**SCENARIOS[scenario])
    world.run(until=120)
    if scenario == "a crash and a recovery":
        world.crash(2)
        world.run(until=300)
    source = world.honest()[0].replica
    final = {r: (c.value_id, c.state) for r, c in source.chain.certificates.items()}
    assert len(final) >= 5 and (scenario != "a crash and a recovery" or source.chain.tip.epoch.number >= 1)
    ops = in_causal_order(source)
    rng = random.Random(scenario)
    for _order in range(3):
        rng.shuffle(ops)
        replica = Replica(world.genesis)
        seen: dict[int, tuple[bytes, bytes]] = {}
        for data in ops:
            replica.add(data)
            held = {r: (c.value_id, c.state) for r, c in replica.chain.certificates.items()}
            assert held.keys() >= seen.keys(), "a certificate disappeared"
            assert all(seen.setdefault(r, said) == said for r, said in held.items()), "a certificate changed"
        assert seen == final and not replica.pending


# --- the attempt deadline follows the run's pace -----------------------------------------------------


def test_the_attempt_deadline_follows_the_rounds_seen_within_the_run_s_bounds():
    def deadline(*durations: float) -> tuple[float, float]:
        machine = rm.RoundMachine(b"m" * 32, timing=rm.Timing(round_deadline=600.0))
        machine.durations.extend(durations)
        p = SimpleNamespace(machine=machine, participant=SimpleNamespace(settings=SimpleNamespace(recover_after=3)))
        p.attempt_deadline = lambda: Deciding.attempt_deadline(p)
        return Deciding.attempt_deadline(p), Deciding.recover_after(p)

    assert deadline() == (600.0, 1800.0)  # nothing seen yet: the run's deadline
    assert deadline(4.0, 5.0) == (600.0, 1800.0)  # two rounds: not yet
    assert deadline(4.0, 5.0, 6.0) == (MIN_DEADLINE, 3 * MIN_DEADLINE)
    assert deadline(4.0, 5.0, 6.0, 40.0) == (120.0, 360.0)
    assert deadline(4.0, 5.0, 6.0, 40.0, 400.0) == (600.0, 1800.0)
    # A round certified with us counts from its start here to its certificate.
    me, value, state = b"m" * 32, b"v" * 32, b"s" * 32
    machine = rm.RoundMachine(me)
    assert machine.handle(rm.Observation(0.0, 0, None, {})) == [rm.StartTraining(1)]
    machine.handle(rm.Trained(1, b"p" * 32, 10, 4.0, 4.0))
    machine.handle(rm.Computed(1, value, state, 8.0))  # the state of the value the agreement asked about
    done = machine.handle(rm.Observation(12.0, 1, state, {}, decided={1: rm.Decided(1, value, (me,), state)}))
    assert rm.Adopt(1, value) in done and list(machine.durations) == [12.0]


# --- a value's check fetches again -------------------------------------------------------------------


async def test_a_check_fetches_a_payload_again_after_a_failed_fetch(autojump_clock):
    """A fetch that failed (its author was late, or the link slow) does not make every later check
    of a value naming that payload wait out its bound: the check fetches it again, up to its tries."""
    import trio

    from locomesh.node.exchange.work import RoundWork

    author, work, fetched = b"a" * 32, RoundWork(round=2, started=0.0), []

    def start_fetch(work: RoundWork, who: bytes, payload_id: bytes, size: int) -> None:
        fetched.append(trio.current_time())
        work.fetching[who] = done = trio.Event()
        if len(fetched) == 1:
            work.fetch_failures[who] = 1
        else:
            work.fetched_ok.add(who)
        done.set()

    p = SimpleNamespace(me=b"m" * 32, _start_fetch=start_fetch,
                        replica=SimpleNamespace(commits=lambda round_: {author: (b"p" * 32, 10)}))
    with trio.move_on_after(30.0):
        assert await Deciding._payload(p, work, author)
    assert len(fetched) == 2 and fetched[1] - fetched[0] < 5.0, fetched


# --- a stuck round is visible ---------------------------------------------------------------------


async def test_a_stuck_round_says_since_when_until_when_on_whom_and_what_comes_next(mock_clock):
    """Two of four members send nothing in round 2: no two thirds can agree. Before the recover
    deadline the round is not stuck; past it, run status and `locomesh doctor` say since when, on
    whom (the silent members, by peer ID), what fixes it, and that this node signed a recover."""
    import trio

    replica = _run()
    me, active, *silent = MEMBERS
    p = participation(replica, me, connected={active.public_key, silent[0].public_key})
    for member in (me, active):
        replica.create(member, "commit", round=2, hash=member.public_key, size=10)
    start = trio.current_time()
    agree(p, start)
    replica.create(active, "prevote", round=2, epoch=0, attempt=0, value=b"")
    mock_clock.jump(20.0)
    agree(p, trio.current_time())
    early = round_clock(p, trio.current_time())
    assert (early["waited_s"], early["deadline_s"], early["stuck"]) == (20.0, RECOVER, None)
    assert early["next"].endswith(f"a recover is due in {RECOVER - 20.0:.0f} s")
    mock_clock.jump(RECOVER + 10.0 - 20.0)
    agree(p, trio.current_time())  # past the deadline: we sign a recover
    assert replica.chain.signers() == {me.public_key}
    due = p.seat.next_wakeup()  # a wake-up due in the past would make the participation's loop spin
    assert due is None or due > trio.current_time(), (due, trio.current_time())
    waiting = waiting_on(p)
    assert waiting["waited_s"] == RECOVER + 10.0 and waiting["next"].startswith("signed a recover")
    cause, fix = waiting["stuck"]["cause"], waiting["stuck"]["fix"]
    assert f"2 of the 4 members of its electorate sent nothing ({', '.join(peers(*silent))})" in cause
    assert "(1 of 4 so far)" in fix and "locomesh node start" in fix
    line = waiting_text(waiting)
    assert f"{peer_id_from_public_key(silent[1].public_key)} (not connected)" in line
    clock = f"{RECOVER + 10.0:.0f} s of the {RECOVER:.0f} s before a recover"
    assert f"(attempt {waiting['attempt']}, {waiting['step']} step: {clock}" in line
    check = progress_check({"run_id": "abc", "phase": "committed", "round": 1, "certified": 1, "waiting": waiting})
    assert (check.status, check.detail, check.fix) == ("fail", cause, fix)
    assert progress_check({"phase": "train", "round": 4, "certified": 4, "waiting": {"stuck": None}}).status == "ok"
    # Every member votes, and still no certificate: the cause is elsewhere.
    for member in silent:
        replica.create(member, "prevote", round=2, epoch=0, attempt=0, value=b"")
    stuck = waiting_on(p)["stuck"]
    assert "although the members vote" in stuck["cause"] and "locomesh doctor" in stuck["fix"]
