"""The round machine (node/rounds/machine.py) driven event by event: training, commits, fetches, and
adopting, replaying or syncing each certified round. (Which value a round decides is the
agreement's: tests/test_agreement_*.py.)"""

from __future__ import annotations

import pytest

from locomesh.node.rounds import machine as rm

ME, A, B = b"m" * 32, b"a" * 32, b"b" * 32
H1, H2 = b"\x01" * 32, b"\x02" * 32
V1, V2 = b"\x11" * 32, b"\x22" * 32
PAYLOAD = b"p" * 32


def seen(now, certified=0, certified_hash=None, commits=None, decided=None, **fields) -> rm.Observation:
    return rm.Observation(now, certified, certified_hash, dict(commits or {}), decided=dict(decided or {}), **fields)


def decided(round_, value=V1, authors=(ME, A, B), state=H1) -> dict[int, rm.Decided]:
    return {round_: rm.Decided(round_, value, tuple(sorted(authors)), state)}


def trained(now=10.0, **timing) -> rm.RoundMachine:
    machine = rm.RoundMachine(ME, timing=rm.Timing(**timing))
    assert machine.handle(seen(0.0)) == [rm.StartTraining(1)]
    assert machine.handle(rm.Trained(1, PAYLOAD, 100, 4.0, now)) == [rm.PublishCommit(1, PAYLOAD, 100)]
    assert machine.phase is rm.Phase.COMMITTED
    return machine


def test_a_round_we_computed_is_adopted_and_the_next_one_trains():
    machine = trained()
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (PAYLOAD, 100)}
    assert machine.handle(seen(10.1, commits=commits)) == [rm.Fetch(1, A, b"pa" * 16, 10), rm.Fetch(1, B, b"pb" * 16, 11)]
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    assert machine.handle(rm.Computed(1, V1, H1, 11.0)) == []  # the agreement asked; the round decides
    actions = machine.handle(seen(12.0, certified=1, certified_hash=H1, decided=decided(1)))
    assert actions[:2] == [rm.Adopt(1, V1), rm.RoundDone(1, H1, 3, synced=False)]
    assert actions[2] == rm.StartTraining(2)
    assert (machine.state_round, machine.state_hash) == (1, H1)


def test_a_round_certified_with_a_value_we_did_not_compute_is_replayed_from_the_payloads_we_hold():
    machine = trained()
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    actions = machine.handle(seen(12.0, certified=1, certified_hash=H1, decided=decided(1, authors=(ME, A))))
    assert actions == [rm.Replay(1, V1, tuple(sorted((ME, A))))] and machine.phase is rm.Phase.REPLAY
    actions = machine.handle(rm.Computed(1, V1, H1, 13.0))
    # the replayed state is adopted (stored, attested) and reported as a split
    assert actions[:2] == [rm.Adopt(1, V1), rm.RoundDone(1, H1, 2, synced=True)] and machine.state_round == 1


def test_a_replay_that_misses_the_certified_hash_syncs():
    machine = trained()
    machine.handle(seen(12.0, certified=1, certified_hash=H1, decided=decided(1, authors=(ME,))))
    assert machine.handle(rm.Computed(1, V1, H2, 13.0)) == [rm.Discard(1), rm.StartSync(1, H1)]
    assert machine.phase is rm.Phase.SYNC


def test_without_every_payload_of_the_certified_value_the_round_is_synced():
    machine = trained()
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10), B: (b"pb" * 16, 11)}))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, False, 10.2))
    assert machine.handle(seen(12.0, certified=1, certified_hash=H1, decided=decided(1))) == [rm.Discard(1), rm.StartSync(1, H1)]


def test_a_value_we_computed_to_another_state_is_synced_not_replayed():
    machine = trained()
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10), B: (b"pb" * 16, 11)}))
    for author in (A, B):
        machine.handle(rm.Fetched(1, author, True, 10.2))
    machine.handle(rm.Computed(1, V1, H2, 11.0))
    actions = machine.handle(seen(12.0, certified=1, certified_hash=H1, decided=decided(1)))
    assert actions == [rm.Discard(1), rm.StartSync(1, H1)]


def test_a_round_decided_while_we_train_stops_our_inner_steps():
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    machine.handle(seen(1.0, commits={A: (b"pa" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 1.5))
    actions = machine.handle(seen(2.0, certified=1, certified_hash=H1, decided=decided(1, authors=(A,))))
    assert actions == [rm.StopTraining(1), rm.Replay(1, V1, (A,))]
    assert machine.handle(rm.Trained(1, PAYLOAD, 100, 4.0, 3.0)) == []  # too late: stale
    assert machine.handle(rm.Computed(1, V1, H1, 3.0))[:2] == [rm.Adopt(1, V1), rm.RoundDone(1, H1, 1, synced=True)]


def test_a_run_more_than_a_round_ahead_is_synced_to_its_newest_state():
    machine = trained()
    actions = machine.handle(seen(12.0, certified=3, certified_hash=H2, decided=decided(1)))
    assert actions == [rm.Discard(1), rm.StartSync(3, H2)]
    assert machine.handle(rm.Synced(3, H2, 13.0))[0] == rm.RoundDone(3, H2, 0, synced=True)
    assert machine.state_round == 3


def test_a_failed_sync_is_tried_again_after_a_pause():
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0, certified=2, certified_hash=H2, may_contribute=False))
    assert machine.phase is rm.Phase.SYNC
    assert machine.handle(rm.Synced(2, None, 1.0)) == []
    assert machine.handle(seen(1.5, certified=2, certified_hash=H2)) == []
    assert machine.handle(seen(2.0, certified=2, certified_hash=H2)) == [rm.StartSync(2, H2)]


def test_a_peer_that_may_not_contribute_or_sits_out_trains_nothing_but_fetches_when_it_votes():
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0, may_contribute=False)) == []
    assert machine.handle(seen(1.0, commits={A: (b"pa" * 16, 10)}, may_contribute=False)) == [rm.Fetch(1, A, b"pa" * 16, 10)]
    quiet = rm.RoundMachine(ME)
    quiet.fetching = False  # not in the electorate, not training: it syncs, it needs no payload
    assert quiet.handle(seen(0.0, sit_out=True)) == []
    assert quiet.handle(seen(1.0, commits={A: (b"pa" * 16, 10)}, sit_out=True)) == []


def test_no_round_starts_before_the_run_has_its_minimum_of_contributors():
    machine = rm.RoundMachine(ME, timing=rm.Timing(min_peers=3))
    assert machine.handle(seen(0.0, eligible=2)) == []
    assert machine.handle(seen(1.0, eligible=3)) == [rm.StartTraining(1)]


def test_a_peer_the_roster_let_go_joins_again_once_per_certified_round():
    machine = rm.RoundMachine(ME, state_round=4, state_hash=H1)
    assert machine.handle(seen(0.0, certified=4, certified_hash=H1, rejoin=True, may_contribute=False)) == [rm.PublishJoin(5)]
    assert machine.handle(seen(1.0, certified=4, certified_hash=H1, rejoin=True, may_contribute=False)) == []
    under_way = {A: (b"pa" * 16, 10)}
    later = rm.RoundMachine(ME, state_round=4, state_hash=H1)
    assert later.handle(seen(0.0, certified=4, certified_hash=H1, commits=under_way, rejoin=True,
                             may_contribute=False))[0] == rm.PublishJoin(6)


def test_the_cutoff_follows_the_spread_of_the_commits_the_rounds_decided():
    machine = trained(now=10.0)
    assert machine.cutoff() == 10.0 + rm.MIN_COLLECT_SECONDS  # our commit was the first seen
    machine.handle(seen(13.0, commits={A: (b"pa" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 13.5))
    machine.handle(rm.Computed(1, V1, H1, 14.0))
    machine.handle(seen(14.0, certified=1, certified_hash=H1, decided=decided(1, authors=(ME, A))))
    assert machine.window() == 2 * 3.0  # the second of two commits came 3 s after the first
    machine.spreads.extend([145.0, 3.0])  # a round whose commits a partition held back, then one as usual
    assert machine.window() == 2 * 3.0  # the median: the held round does not stretch the next cutoffs


def test_the_cutoff_never_runs_past_half_of_what_is_left_of_the_round_deadline():
    machine = rm.RoundMachine(ME, timing=rm.Timing(round_deadline=10.0, min_collect=60.0))
    machine.handle(seen(0.0))
    machine.handle(rm.Trained(1, PAYLOAD, 100, 4.0, 4.0))
    assert machine.cutoff() == 4.0 + (10.0 - 4.0) / 2


def test_completions_of_work_we_left_change_nothing_and_impossible_ones_raise():
    machine = trained()
    assert machine.handle(rm.Fetched(7, A, True, 11.0)) == []  # a round we are not in
    with pytest.raises(rm.ImpossibleEvent):
        machine.handle(rm.Synced(1, H1, 11.0))  # no sync was asked for
