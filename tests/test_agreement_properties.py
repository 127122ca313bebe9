"""The agreement's invariants over real replicas and the real seat and machine (tests/agreement_sim.py),
under random delivery delays, crashes and restarts, partitions that heal, and Byzantine members
under a third that equivocate, vote in attempts not begun, withhold payloads, propose one
payload or unfetchable ones, and compute wrong states:

- never two certificates for one round (all replicas agree on every round they certified);
- no certificate ever disappears or changes on any replica;
- once more than two thirds of the electorate are honest, up and connected, rounds are certified.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .agreement_sim import BEHAVIOURS, World

PROPERTY = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, dict]:
    n = draw(st.integers(4, 7))
    f = (n - 1) // 3
    byzantine = draw(st.lists(st.sampled_from(BEHAVIOURS), max_size=f))
    chosen = draw(st.permutations(range(1, n)))[:len(byzantine)]
    world = World(seed=draw(st.integers(0, 2**16)), n=n, max_delay=draw(st.sampled_from([0.05, 0.3, 1.0])),
                  behaviours=dict(zip(chosen, byzantine)), recover_after=10_000.0)
    faults = {"crash": draw(st.booleans()) and len(byzantine) < f, "partition": draw(st.booleans())}
    return world, faults


@PROPERTY
@given(worlds())
def test_rounds_are_certified_once_and_for_all_whatever_the_order_faults_and_byzantine_members(case):
    world, faults = case
    world.run(until=60)
    assert world.agree()
    honest = [i for i, m in enumerate(world.members) if m.behaviour is None]
    if faults["crash"]:
        victim = honest[-1]
        world.crash(victim)
        world.run(until=120)
        world.restart(victim)
    if faults["partition"]:  # a minority cut off for a while: the rest is still more than two thirds
        cut = honest[-1:]
        world.partition(cut, [i for i in range(world.n) if i not in cut])
        world.run(until=world.now + 60)
        assert world.agree()
        world.heal()
    before = world.certified()
    world.run(until=world.now + 200)
    assert world.agree()
    assert world.certified() >= before + 3, "more than two thirds honest and up, yet rounds stopped"


def test_a_minority_voting_in_every_attempt_ahead_cannot_stall_a_round():
    """On 24b704e a minority's votes in every attempt made every attempt split, and after 64 attempts
    nothing could be written for the round. Here votes of attempts not begun move nobody until a
    third of the electorate sent them (line 55)."""
    world = World(seed=5, n=7, behaviours={1: "future", 2: "future"})
    world.run(until=300)
    assert world.agree() and world.certified() >= 15
    assert all(c.attempt <= 2 for m in world.honest() for c in m.replica.chain.certificates.values())


def test_an_equivocating_voter_rolls_nothing_back():
    """On 24b704e a member of a round's minimal quorum that equivocated once had its ban applied to
    every past round: the certificates of rounds 2-4 vanished and every machine synced back to
    round 1. A ban here removes the key's future say only."""
    world = World(seed=11, n=4, behaviours={3: "equivocate"})
    world.run(until=400)
    assert world.agree()
    assert all(m.rollbacks == 0 for m in world.members)
    assert world.certified() >= 10


@pytest.mark.parametrize("members, killed", [(3, 2), (2, 1)])
def test_a_member_of_a_run_of_two_or_three_killed_for_good_costs_the_recovery_wait_then_rounds_go_on(members, killed):
    world = World(seed=7, n=members, recover_after=60.0)
    world.run(until=100)
    before = world.certified()
    world.crash(killed)
    world.run(until=100 + 60 + 40)
    after = world.certified()
    assert after > before, "no round certified after the recovery wait"
    survivors = [m for m in world.members if m.alive]
    assert all(m.replica.chain.tip.epoch.number >= 1 for m in survivors)
    world.run(until=world.now + 200)
    assert world.certified() >= after + 10 and world.agree()


def test_the_creator_alone_of_two_cannot_be_outvoted_by_a_split_and_the_other_alone_cannot_recover():
    """Exactly half with the creator recovers; exactly half without it does not: the two halves of
    a split cannot both go on."""
    world = World(seed=8, n=2, recover_after=60.0)
    world.run(until=100)
    before = world.certified()
    world.partition([0], [1])
    world.run(until=400)
    assert world.members[0].replica.chain.round > before
    assert world.members[1].replica.chain.round == before
    world.heal()
    world.run(until=600)
    assert world.agree() and world.members[1].replica.chain.round >= world.members[0].replica.chain.round - 1


def test_a_partition_into_five_and_four_heals_into_one_history_without_bans():
    world = World(seed=21, n=9, recover_after=60.0)
    world.run(until=80)
    five, four = [0, 1, 2, 3, 4], [5, 6, 7, 8]
    world.partition(five, four)
    cut_at = world.certified()
    world.run(until=400)
    assert min(world.members[i].replica.chain.round for i in five) > cut_at + 3, "the five did not go on"
    assert max(world.members[i].replica.chain.round for i in four) <= cut_at + 1
    world.heal()
    world.run(until=700)
    assert world.agree()
    assert all(m.rollbacks == 0 for m in world.members)
    assert min(m.replica.chain.round for m in world.members) >= max(world.members[i].replica.chain.round for i in five) - 2
    assert not any(m.replica.state.banned for m in world.members)


def test_a_member_stopped_for_minutes_and_started_again_never_moves_a_certified_round_backwards():
    """On 24b704e a member stopped at round 98 and started 4 minutes later merged its ops back and
    took the certificates of rounds 99-154 with them: every node synced back to round 98, for good."""
    world = World(seed=13, n=3, recover_after=60.0)
    world.run(until=100)
    world.crash(2)
    world.run(until=340)
    ahead = world.certified()
    world.restart(2)
    world.run(until=600)
    assert world.agree() and all(m.rollbacks == 0 for m in world.members)
    assert world.certified() > ahead
