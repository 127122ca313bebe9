"""The round machine (node/rounds/machine.py) driven event by event: the paths through a round."""

from __future__ import annotations

import pytest

from locomesh.node.rounds import machine as rm

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32
H1, H2 = b"\x01" * 32, b"\x02" * 32


def _key_placed(position):
    """A key that comes at `position` in round 1's proposer order among itself, A and B."""
    for byte in range(256):
        key = bytes([byte]) * 32
        if key not in (A, B) and rm.proposer_order(1, b"", {key, A, B}).index(key) == position:
            return key
    raise AssertionError("no such key")


ME = _key_placed(0)  # the first proposer of round 1 (most tests: proposing is then immediate)


def seen(now, certified=0, certified_hash=None, electorate=(ME, A, B), commits=None, proposals=None, certified_proposals=None):
    return rm.Observation(now, certified, certified_hash, frozenset(electorate), dict(commits or {}), dict(proposals or {}),
                          dict(certified_proposals or {}))


def kinds(actions):
    return [type(action).__name__ for action in actions]


def trained_machine(now=10.0, seconds=4.0, **timing):
    machine = rm.RoundMachine(ME, timing=rm.Timing(**timing))
    assert machine.handle(seen(0.0)) == [rm.StartTraining(1)]
    assert machine.phase is rm.Phase.TRAIN
    return machine, machine.handle(rm.Trained(1, b"p" * 32, 100, seconds, now))


def test_a_round_where_everyone_delivers():
    machine, actions = trained_machine()
    assert actions == [rm.PublishCommit(1, b"p" * 32, 100)]
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}
    actions = machine.handle(seen(10.1, commits=commits))
    assert actions == [rm.Fetch(1, A, b"pa" * 16, 10), rm.Fetch(1, B, b"pb" * 16, 11)]
    assert machine.handle(rm.Fetched(1, A, True, 10.2)) == []
    everyone = tuple(sorted((ME, A, B)))
    assert machine.handle(rm.Fetched(1, B, True, 10.3)) == [rm.PublishProposal(1, everyone), rm.StartAggregate(1, everyone, 10.1)]
    assert machine.handle(rm.Aggregated(1, H1, 10.4)) == [rm.PublishVote(1, H1, ME)]
    actions = machine.handle(seen(10.5, certified=1, certified_hash=H1, electorate=(ME, A, B)))
    assert actions[0] == rm.RoundDone(1, H1, 3, synced=False)
    assert actions[1] == rm.StartTraining(2)
    assert machine.state_round == 1 and machine.state_hash == H1


def test_a_vanished_peer_costs_one_window_and_no_more():
    machine, _ = trained_machine(now=10.0, seconds=4.0)
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10)}))
    assert machine.handle(rm.Fetched(1, A, True, 10.2)) == []  # B never commits
    cutoff = machine.cutoff()
    assert cutoff == 10.0 + rm.MIN_COLLECT_SECONDS
    assert machine.handle(seen(cutoff - 0.01, commits={A: (b"pa" * 16, 10)})) == []
    cut = tuple(sorted((ME, A)))
    assert machine.handle(seen(cutoff, commits={A: (b"pa" * 16, 10)})) == [
        rm.PublishProposal(1, cut), rm.StartAggregate(1, cut, 10.1)
    ]


def test_our_set_waits_a_window_at_most_for_a_payload_not_yet_seen_at_its_committees():
    """Sharded exchange: a fetched payload that no committee member is seen holding yet
    (`Observation.unconfirmed`) would die with its author. Our proposal waits for it one window
    past our turn's start, then goes without it; once confirmed it is named."""
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}

    def waiting(now):
        return rm.Observation(now, 0, None, frozenset((ME, A, B)), commits, unconfirmed=frozenset({B}))

    def machine_with_both_fetched():
        machine, _ = trained_machine(now=10.0, seconds=4.0)
        machine.handle(waiting(10.1))
        assert machine.handle(rm.Fetched(1, A, True, 10.2)) == []
        assert machine.handle(rm.Fetched(1, B, True, 10.3)) == []  # B is fetched, not yet confirmed
        return machine, machine.current.closed_at

    machine, turn = machine_with_both_fetched()
    assert machine.handle(waiting(turn + machine.window() - 0.01)) == []
    without_b = tuple(sorted((ME, A)))
    assert machine.handle(waiting(turn + machine.window())) == [rm.PublishProposal(1, without_b),
                                                                 rm.StartAggregate(1, without_b, 10.1)]
    machine, turn = machine_with_both_fetched()
    everyone = tuple(sorted((ME, A, B)))
    assert machine.handle(seen(turn + 0.2, commits=commits)) == [rm.PublishProposal(1, everyone),
                                                                  rm.StartAggregate(1, everyone, 10.1)]


def test_the_last_proposer_too_waits_a_window_at_most_for_an_unconfirmed_payload():
    """Last in proposer order, with no earlier set to follow: the wait for a payload not yet seen
    at its committees still holds (it must not fall through to proposing at once)."""
    last = _key_placed(2)
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), last: (b"p" * 32, 100)}

    def waiting(now):
        return rm.Observation(now, 0, None, frozenset((last, A, B)), commits, unconfirmed=frozenset({B}))

    machine = rm.RoundMachine(last)
    machine.handle(rm.Observation(0.0, 0, None, frozenset((last, A, B)), {}))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 10.0))
    machine.handle(waiting(10.1))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    ours = max(starts for proposer, starts, _ in machine.turns() if proposer == last)
    assert [p for p, _, _ in machine.turns()][-1] == last
    assert machine.handle(waiting(ours + 0.1)) == []
    without_b = tuple(sorted((last, A)))
    assert machine.handle(waiting(ours + machine.window()))[0] == rm.PublishProposal(1, without_b)


def test_a_commit_after_the_cutoff_is_left_out_even_when_fetched():
    machine, _ = trained_machine(now=10.0)
    machine.handle(seen(10.5, commits={A: (b"pa" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 10.6))
    late = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    actions = machine.handle(seen(12.5, commits=late))  # B shows up after the cutoff at 12.0
    cut = tuple(sorted((ME, A)))
    assert actions == [rm.Fetch(1, B, b"pb" * 16, 10), rm.PublishProposal(1, cut), rm.StartAggregate(1, cut, 10.5)]


def test_our_own_late_commit_is_left_out_like_anyone_else_s():
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    both = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    assert kinds(machine.handle(seen(1.0, commits=both))) == ["Fetch", "Fetch"]  # fetched while we train
    machine.handle(rm.Fetched(1, A, True, 1.5))
    machine.handle(rm.Fetched(1, B, True, 1.6))
    actions = machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 5.0))  # cutoff was 3.0
    cut = tuple(sorted((A, B)))
    assert actions == [rm.PublishCommit(1, b"p" * 32, 100), rm.PublishProposal(1, cut), rm.StartAggregate(1, cut, 1.0)]


def test_the_window_grows_with_the_commit_spread_it_measured():
    """The spread: from the first commit to the one that made more than two thirds (here the
    second of three, at 1.5 s; the third came 1 s later and does not count)."""
    machine, _ = trained_machine(now=10.0, seconds=0.0)
    machine.handle(seen(11.5, commits={B: (b"pb" * 16, 10)}))
    machine.handle(seen(12.5, commits={A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 12.6))
    machine.handle(rm.Fetched(1, B, True, 12.7))
    machine.handle(rm.Aggregated(1, H1, 12.8))
    machine.handle(seen(12.9, certified=1, certified_hash=H1))
    machine.handle(rm.Trained(2, b"q" * 32, 100, 0.0, 20.0))
    assert machine.cutoff() == 20.0 + 2 * 1.5


def test_a_round_certified_with_another_hash_makes_the_peer_sync():
    machine, _ = trained_machine()
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    machine.handle(rm.Aggregated(1, H1, 10.4))
    assert machine.handle(seen(10.5, certified=1, certified_hash=H2)) == [rm.Discard(1), rm.StartSync(1, H2)]
    assert machine.phase is rm.Phase.SYNC
    actions = machine.handle(rm.Synced(1, H2, 11.0))
    assert actions[0] == rm.RoundDone(1, H2, 0, synced=True)
    assert machine.state_hash == H2


def training_machine_holding(*fetched, fetching=()):
    """A machine still training round 1 that has fetched the payloads of `fetched` and is
    fetching those of `fetching`."""
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    machine.handle(seen(1.0, commits={author: (author[:1] * 32, 10) for author in (*fetched, *fetching)}))
    for author in fetched:
        machine.handle(rm.Fetched(1, author, True, 1.5))
    return machine


def test_a_round_certified_while_we_train_is_replayed_from_the_payloads_we_hold():
    machine = training_machine_holding(A, B)
    actions = machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals={A: (A, B)}))
    assert actions == [rm.StopTraining(1), rm.StartAggregate(1, (A, B), 0.0, replay=True)]
    assert machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 2.1)) == []  # the cancelled training
    actions = machine.handle(rm.Aggregated(1, H1, 2.5))
    assert actions[0] == rm.RoundDone(1, H1, 2, synced=True)  # adopted: no vote, no download
    assert actions[1] == rm.StartTraining(2)
    assert machine.state_round == 1 and machine.state_hash == H1


def test_a_replay_that_misses_the_certified_hash_falls_back_to_a_sync():
    machine = training_machine_holding(A, B)
    machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals={A: (A, B)}))
    assert machine.handle(rm.Aggregated(1, H2, 2.5)) == [rm.StartSync(1, H1)]
    assert machine.phase is rm.Phase.SYNC and machine.state_round == 0


def test_no_replay_without_every_payload_of_a_proposal():
    machine = training_machine_holding(A)
    proposals = {A: (A, B), B: (ME, A)}  # B never committed to us; our own payload was never committed
    actions = machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals=proposals))
    assert actions == [rm.Discard(1), rm.StartSync(1, H1)]


def test_a_replay_waits_for_the_fetches_still_under_way():
    machine = training_machine_holding(A, fetching=(B,))
    actions = machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals={A: (A, B)}))
    assert actions == [rm.StopTraining(1)] and machine.phase is rm.Phase.REPLAY
    assert machine.handle(seen(2.2, certified=1, certified_hash=H1, certified_proposals={A: (A, B)})) == []
    assert machine.handle(rm.Fetched(1, B, True, 2.4)) == [rm.StartAggregate(1, (A, B), 0.0, replay=True)]


def test_a_replay_whose_fetch_fails_syncs():
    machine = training_machine_holding(A, fetching=(B,))
    machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals={A: (A, B)}))
    assert machine.handle(rm.Fetched(1, B, False, 2.4)) == [rm.Discard(1), rm.StartSync(1, H1)]


def test_more_stewards_store_a_state_than_a_quorum_tolerates_faults_and_at_least_two():
    members = [bytes([i]) * 32 for i in range(32)]
    for n, expected in ((1, 1), (2, 2), (3, 2), (4, 2), (7, 3), (8, 3), (10, 4), (32, 11)):
        electorate = set(members[:n])
        stewards = rm.state_stewards(5, b"", electorate)
        assert len(stewards) == expected and set(stewards) <= electorate
        assert len(stewards) > (n - 1) // 3  # f + 1: one of them is honest
    assert rm.state_stewards(5, b"", set(members)) == rm.state_stewards(5, b"", set(reversed(members)))
    assert len({tuple(rm.state_stewards(r, b"", set(members))) for r in range(1, 6)}) == 5  # the work moves round by round


def test_the_replay_takes_the_first_proposal_in_proposer_order_that_we_can_rebuild():
    machine = training_machine_holding(A, B)
    proposals = {A: (A, B), B: (B,), ME: (A,)}
    first = next(p for p in rm.proposer_order(1, b"", set(proposals)) if set(proposals[p]) <= {A, B})
    actions = machine.handle(seen(2.0, certified=1, certified_hash=H1, certified_proposals=proposals))
    assert actions[1] == rm.StartAggregate(1, proposals[first], 0.0, replay=True)


def test_a_round_certified_while_we_aggregate_is_adopted_when_our_result_matches():
    machine, _ = trained_machine()
    machine.handle(seen(10.1, commits={A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    assert machine.phase is rm.Phase.AGGREGATE
    assert machine.handle(seen(10.4, certified=1, certified_hash=H1)) == []  # no discard: let it finish
    actions = machine.handle(rm.Aggregated(1, H1, 10.6))
    assert actions[0] == rm.RoundDone(1, H1, 3, synced=False) and actions[1] == rm.StartTraining(2)


def test_a_failed_sync_is_tried_again_after_a_pause():
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0, certified=3, certified_hash=H1)) == [rm.StartSync(3, H1)]
    assert machine.handle(rm.Synced(3, None, 1.0)) == []
    assert machine.handle(seen(1.5, certified=3, certified_hash=H1)) == []
    assert machine.handle(seen(1.0 + rm.RETRY_SECONDS, certified=3, certified_hash=H1)) == [rm.StartSync(3, H1)]


def test_a_late_joiner_syncs_then_waits_for_the_round_its_join_names():
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0, certified=2, certified_hash=H1, electorate=(A, B))) == [rm.StartSync(2, H1)]
    actions = machine.handle(rm.Synced(2, H1, 1.0))
    assert actions == [rm.RoundDone(2, H1, 0, synced=True)]  # not eligible for round 3: no training
    assert machine.handle(seen(2.0, certified=2, certified_hash=H1, electorate=(A, B))) == []
    actions = machine.handle(seen(5.0, certified=3, certified_hash=H2, electorate=(A, B, ME)))
    assert actions == [rm.StartSync(3, H2)]


def test_work_for_a_round_the_run_moved_past_is_discarded():
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0))
    assert machine.handle(seen(1.0, certified=1, certified_hash=H1)) == [rm.Discard(1), rm.StartSync(1, H1)]
    assert machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 2.0)) == []  # the stale completion is ignored


def test_completions_of_work_we_left_change_nothing_and_impossible_ones_raise():
    machine, _ = trained_machine()
    assert machine.handle(rm.Fetched(7, A, True, 10.5)) == []  # a round we are not in
    with pytest.raises(rm.ImpossibleEvent):
        machine.handle(rm.Aggregated(1, H1, 11.0))  # nothing was aggregating
    with pytest.raises(rm.ImpossibleEvent):
        machine.handle(rm.Synced(1, H1, 11.0))
    assert machine.phase is rm.Phase.COLLECT
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}
    machine.handle(seen(10.1, commits=commits))
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    assert machine.phase is rm.Phase.AGGREGATE
    assert machine.handle(rm.Fetched(1, B, True, 10.4)) == []  # a refetch that ended late: stale
    assert machine.phase is rm.Phase.AGGREGATE


def test_a_peer_outside_the_electorate_does_not_train():
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0, electorate=(A, B))) == []
    assert machine.phase is rm.Phase.IDLE


def test_a_peer_whose_membership_lapsed_joins_again_once_per_round():
    machine = rm.RoundMachine(ME)
    assert machine.handle(seen(0.0, certified=4, certified_hash=H1, electorate=(A, B))) == [rm.StartSync(4, H1)]
    machine.handle(rm.Synced(4, H1, 1.0))
    lapsed = rm.Observation(2.0, 4, H1, frozenset((A, B)), {}, lapsed=True)
    assert machine.handle(lapsed) == [rm.PublishJoin(5)]
    assert machine.handle(lapsed) == []  # our replica has the join at once: no second one
    rejoined = rm.Observation(2.1, 4, H1, frozenset((A, B, ME)), {})
    assert machine.handle(rejoined) == [rm.StartTraining(5)]


def test_a_lapsed_peer_that_sees_the_next_round_under_way_joins_the_round_after():
    machine = rm.RoundMachine(ME, state_round=4, state_hash=H1)
    under_way = rm.Observation(2.0, 4, H1, frozenset((A, B)), {A: (b"pa" * 16, 10)}, lapsed=True)
    assert machine.handle(under_way) == [rm.PublishJoin(6)]
    assert machine.handle(rm.Observation(30.0, 5, H2, frozenset((A, B)), {})) == [rm.StartSync(5, H2)]
    machine.handle(rm.Synced(5, H2, 31.0))
    assert machine.handle(rm.Observation(32.0, 5, H2, frozenset((A, B, ME)), {})) == [rm.StartTraining(6)]


def test_the_collect_wait_never_runs_past_the_round_deadline():
    machine, _ = trained_machine(now=10.0, seconds=400.0, round_deadline=12.0, min_collect=30.0)
    # a 30 s window would end at 40 s; the round started at 0.0 and must end by 12.0
    assert machine.cutoff() <= 12.0


def test_no_round_starts_before_the_run_has_its_minimum_of_peers():
    machine = rm.RoundMachine(ME, timing=rm.Timing(min_peers=3))
    assert machine.handle(seen(0.0, electorate=(ME, A))) == []
    assert machine.handle(seen(1.0, electorate=(ME, A, B))) == [rm.StartTraining(1)]


def test_a_peer_that_is_not_the_proposer_follows_the_proposal_and_fetches_what_it_lacks():
    me = _key_placed(2)
    first = rm.proposer_order(1, b"", {me, A, B})[0]
    machine = rm.RoundMachine(me)
    machine.handle(seen(0.0, electorate=(me, A, B)))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10)}
    machine.handle(seen(1.1, electorate=(me, A, B), commits=commits))
    assert machine.handle(rm.Fetched(1, A, True, 1.2)) == []
    assert machine.handle(seen(3.0, electorate=(me, A, B), commits=commits)) == []  # cut; waiting for the proposer
    assert machine.phase is rm.Phase.PROPOSE
    commits[B] = (b"pb" * 16, 11)  # B committed after our cutoff, but the proposer counted it
    proposal = tuple(sorted((me, A, B)))
    actions = machine.handle(seen(3.2, electorate=(me, A, B), commits=commits, proposals={first: proposal}))
    assert actions == [rm.Fetch(1, B, b"pb" * 16, 11)]
    assert machine.handle(rm.Fetched(1, B, True, 3.4)) == [rm.StartAggregate(1, proposal, 1.1)]


def test_a_payload_whose_fetch_failed_before_our_cut_is_fetched_again_when_the_proposal_names_it():
    """The fetch of B's payload failed (a provider reset the connection), so our cut leaves B out;
    the proposer's set names B. Following it must fetch B again: waiting for the failed fetch held
    two of four daemons in round 4 of bench/round_exchange.py until the bench gave up."""
    me = _key_placed(2)
    first = rm.proposer_order(1, b"", {me, A, B})[0]
    machine = rm.RoundMachine(me)
    machine.handle(seen(0.0, electorate=(me, A, B)))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11)}
    machine.handle(seen(1.1, electorate=(me, A, B), commits=commits))
    assert machine.handle(rm.Fetched(1, A, True, 1.2)) == []
    assert machine.handle(rm.Fetched(1, B, False, 1.3)) == []  # cut without B; waiting for the proposer
    assert machine.phase is rm.Phase.PROPOSE
    proposal = tuple(sorted((me, A, B)))
    actions = machine.handle(seen(1.4, electorate=(me, A, B), commits=commits, proposals={first: proposal}))
    assert actions == [rm.Fetch(1, B, b"pb" * 16, 11)]
    assert machine.handle(rm.Fetched(1, B, True, 1.9)) == [rm.StartAggregate(1, proposal, 1.1)]


def test_a_payload_of_the_followed_proposal_that_failed_is_asked_for_again_after_a_pause():
    """Nobody can serve B's payload for now (its author is gone, the others are busy): asking again
    at once after each failure was a busy loop for as long as the round lasted. B's first fetch
    failed before our cut and the proposal names it: asked again at once; after a failure while we
    follow the proposal, after RETRY_SECONDS (and at ABANDON_AFTER failures in all the proposal is
    given up: tests/test_attacks_rounds.py)."""
    me = _key_placed(2)
    first = rm.proposer_order(1, b"", {me, A, B})[0]
    machine = rm.RoundMachine(me)
    machine.handle(seen(0.0, electorate=(me, A, B)))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11)}
    machine.handle(seen(1.1, electorate=(me, A, B), commits=commits))
    machine.handle(rm.Fetched(1, A, True, 1.2))
    proposal = tuple(sorted((me, A, B)))
    following = dict(electorate=(me, A, B), commits=commits, proposals={first: proposal})
    assert machine.handle(seen(1.3, **following)) == []  # B's first fetch is still under way
    fetch_b = rm.Fetch(1, B, b"pb" * 16, 11)
    assert machine.handle(rm.Fetched(1, B, False, 1.5)) == [fetch_b]  # our cut; the proposal names B: at once
    assert rm.ABANDON_AFTER > 2, "with 2 the second failure gives the proposal up"
    assert machine.handle(rm.Fetched(1, B, False, 2.0)) == []
    assert machine.handle(seen(2.0 + rm.RETRY_SECONDS - 0.1, **following)) == []
    assert machine.handle(seen(2.0 + rm.RETRY_SECONDS, **following)) == [fetch_b]
    assert machine.handle(seen(2.0 + rm.RETRY_SECONDS + 0.1, **following)) == []  # in flight: asked once
    assert machine.handle(rm.Fetched(1, B, True, 3.5)) == [rm.StartAggregate(1, proposal, 1.1)]


def _second_in_line_after_everyone_committed(commits):
    """A machine second in proposer order that has cut the round with `commits` from A and B in."""
    me = _key_placed(1)
    machine = rm.RoundMachine(me)
    electorate = (me, A, B)
    machine.handle(seen(0.0, electorate=electorate))
    machine.handle(seen(0.5, electorate=electorate, commits=commits))
    for author in commits:
        machine.handle(rm.Fetched(1, author, True, 0.6))
    assert machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0)) == [rm.PublishCommit(1, b"p" * 32, 100)]
    return machine, electorate


def test_a_silent_proposer_that_committed_gets_patience_windows_then_hands_over():
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine, electorate = _second_in_line_after_everyone_committed(commits)
    assert machine.handle(seen(1.2, electorate=electorate, commits=commits)) == []  # everyone in: cut; first proposer's turn
    closed, patience = machine.current.closed_at, rm.PATIENCE * rm.MIN_COLLECT_SECONDS
    # One window is not enough: the first proposer is alive (it committed), only slow.
    assert machine.handle(seen(closed + rm.MIN_COLLECT_SECONDS, electorate=electorate, commits=commits)) == []
    assert machine.handle(seen(closed + patience - 0.1, electorate=electorate, commits=commits)) == []
    everyone = tuple(sorted(electorate))
    actions = machine.handle(seen(closed + patience, electorate=electorate, commits=commits))
    assert actions == [rm.PublishProposal(1, everyone), rm.StartAggregate(1, everyone, 1.0)]


def test_a_silent_proposer_that_did_not_commit_hands_over_after_one_window():
    first = rm.proposer_order(1, b"", {_key_placed(1), A, B})[0]
    other = B if first == A else A
    commits = {other: (b"po" * 16, 10)}
    machine, electorate = _second_in_line_after_everyone_committed(commits)
    assert machine.handle(seen(1.2, electorate=electorate, commits=commits)) == []
    closed = machine.cutoff()  # the silent first proposer never committed: cut at the cutoff
    assert machine.handle(seen(closed, electorate=electorate, commits=commits)) == []
    closed = machine.current.closed_at
    assert machine.handle(seen(closed + rm.MIN_COLLECT_SECONDS - 0.1, electorate=electorate, commits=commits)) == []
    mine = tuple(sorted((machine.me, other)))
    actions = machine.handle(seen(closed + rm.MIN_COLLECT_SECONDS, electorate=electorate, commits=commits))
    assert actions == [rm.PublishProposal(1, mine), rm.StartAggregate(1, mine, 1.0)]


def test_a_silent_proposer_that_committed_but_is_unreachable_hands_over_after_one_window():
    """It committed, then crashed (our connection to it is gone): no PATIENCE for it."""
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine, electorate = _second_in_line_after_everyone_committed(commits)
    first = rm.proposer_order(1, b"", set(electorate))[0]
    gone = frozenset({first})

    def observe(now):
        return machine.handle(rm.Observation(now, 0, None, frozenset(electorate), commits, unreachable=gone))

    assert observe(1.2) == []  # everyone in: cut; the first proposer's turn
    closed = machine.current.closed_at
    assert observe(closed + rm.MIN_COLLECT_SECONDS - 0.1) == []
    everyone = tuple(sorted(electorate))
    assert observe(closed + rm.MIN_COLLECT_SECONDS) == [rm.PublishProposal(1, everyone), rm.StartAggregate(1, everyone, 1.0)]


def test_a_late_proposal_of_an_earlier_proposer_wins_until_aggregation_starts():
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine, electorate = _second_in_line_after_everyone_committed(commits)
    first = rm.proposer_order(1, b"", set(electorate))[0]
    third = rm.proposer_order(1, b"", set(electorate))[2]
    everyone = tuple(sorted(electorate))
    machine.handle(seen(1.2, electorate=electorate, commits=commits))
    # The third proposer's set is acceptable but not its turn yet: nothing happens.
    later = {third: everyone}
    assert machine.handle(seen(1.3, electorate=electorate, commits=commits, proposals=later)) == []
    # The first proposer's set arrives: it is followed (every payload is in: aggregate it).
    both = {**later, first: everyone}
    assert machine.handle(seen(1.4, electorate=electorate, commits=commits, proposals=both)) == [
        rm.StartAggregate(1, everyone, 1.0)
    ]
    assert machine.phase is rm.Phase.AGGREGATE


def test_a_peer_still_fetching_switches_to_an_earlier_proposers_set():
    me = _key_placed(2)  # third in line: the first two proposers' sets decide
    first, second, _ = rm.proposer_order(1, b"", {me, A, B})
    electorate = (me, A, B)
    machine = rm.RoundMachine(me)
    machine.handle(seen(0.0, electorate=electorate))
    early = {first: (b"p1" * 16, 10)}
    machine.handle(seen(0.5, electorate=electorate, commits=early))
    machine.handle(rm.Fetched(1, first, True, 0.6))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0))
    machine.handle(seen(machine.cutoff(), electorate=electorate, commits=early))  # cut without `second`
    assert machine.phase is rm.Phase.PROPOSE
    # `second` committed after our cutoff; the first proposer stays silent past its (long) turn,
    # so we follow `second`'s set, which names its own payload: we fetch it.
    commits = {**early, second: (b"p2" * 16, 10)}
    everyone = tuple(sorted(electorate))
    after_first_turn = machine.current.closed_at + rm.PATIENCE * machine.window()
    actions = machine.handle(seen(after_first_turn, electorate=electorate, commits=commits, proposals={second: everyone}))
    assert actions == [rm.Fetch(1, second, b"p2" * 16, 10)]
    # The first proposer's set (without `second`) arrives while we fetch: it wins.
    ours = tuple(sorted((me, first)))
    proposals = {second: everyone, first: ours}
    actions = machine.handle(seen(after_first_turn + 0.1, electorate=electorate, commits=commits, proposals=proposals))
    assert actions == [rm.StartAggregate(1, ours, 1.0)]


def test_an_earlier_proposal_seen_once_aggregation_started_changes_nothing():
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine, electorate = _second_in_line_after_everyone_committed(commits)
    order = rm.proposer_order(1, b"", set(electorate))
    first = order[0]
    machine.handle(seen(1.2, electorate=electorate, commits=commits))
    closed, patience = machine.current.closed_at, rm.PATIENCE * rm.MIN_COLLECT_SECONDS
    # Our turn came and went: we proposed and are aggregating our own set.
    actions = machine.handle(seen(closed + patience, electorate=electorate, commits=commits))
    assert kinds(actions) == ["PublishProposal", "StartAggregate"]
    # Too late for the first proposer's set: aggregation is under way, the machine stays put.
    late = {first: tuple(sorted(electorate))}
    assert machine.handle(seen(closed + patience + 0.1, electorate=electorate, commits=commits, proposals=late)) == []
    assert machine.phase is rm.Phase.AGGREGATE


def test_a_proposal_naming_half_of_the_electorate_or_less_is_refused():
    me = _key_placed(2)
    first = rm.proposer_order(1, b"", {me, A, B})[0]
    machine = rm.RoundMachine(me)
    electorate = (me, A, B, C)
    machine.handle(seen(0.0, electorate=electorate))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 1.0, 1.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine.handle(seen(1.1, electorate=electorate, commits=commits))
    machine.handle(rm.Fetched(1, A, True, 1.2))
    machine.handle(rm.Fetched(1, B, True, 1.3))
    machine.handle(seen(3.0, electorate=electorate, commits=commits))
    small = tuple(sorted((first, me) if first != me else (first, A)))
    assert machine.handle(seen(3.1, electorate=electorate, commits=commits, proposals={first: small})) == []
    assert machine.current.chosen is None


def test_a_proposer_whose_own_set_others_would_refuse_does_not_propose_and_follows_the_next():
    """Its fetches failed, so its set names only itself of three: proposing it would spend its vote on
    a set nobody follows (seen in an 8-daemon run: in an electorate of two, no quorum until the deadline)."""
    machine, _ = trained_machine(now=10.0)
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}
    machine.handle(seen(10.1, commits=commits))
    machine.handle(rm.Fetched(1, A, False, 10.2))
    assert machine.handle(rm.Fetched(1, B, False, 10.3)) == []  # cut at the cutoff: our set is (ME,) alone
    assert kinds(machine.handle(seen(13.0, commits=commits))) == ["Fetch", "Fetch"]  # asked for again, no proposal
    second = rm.proposer_order(1, b"", {ME, A, B})[1]
    everyone = tuple(sorted((ME, A, B)))
    actions = machine.handle(seen(13.1, commits=commits, proposals={second: everyone}))
    assert machine.current.chosen == everyone and actions == []  # both in flight already


def test_a_proposer_asks_again_for_what_it_counted_and_proposes_once_its_set_is_acceptable():
    """Under load the fetches of a cut may fail (no byte for a while); the payloads were committed
    in time, so the proposer asks for them again, with growing pauses, and proposes when its set
    names more than half of the electorate, in its turn or, once every turn is over, then."""
    machine, _ = trained_machine(now=10.0)
    first = rm.proposer_order(1, b"", {ME, A, B})[0]
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}
    machine.handle(seen(10.1, commits=commits))
    machine.handle(rm.Fetched(1, A, False, 10.2))
    machine.handle(rm.Fetched(1, B, False, 10.3))
    assert kinds(machine.handle(seen(13.0, commits=commits))) == ["Fetch", "Fetch"]
    assert machine.handle(rm.Fetched(1, B, False, 13.5)) == []  # again: asked for after a pause
    assert kinds(machine.handle(seen(14.0, commits=commits))) == []
    assert kinds(machine.handle(seen(14.6, commits=commits))) == ["Fetch"]
    assert first == ME  # our turn: (ME, A) is two of three
    actions = machine.handle(rm.Fetched(1, A, True, 15.0))
    assert kinds(actions) == ["PublishProposal", "StartAggregate"]
    assert machine.current.following == ME and set(machine.current.chosen) == {ME, A}


def test_a_set_that_became_acceptable_after_our_turn_goes_out_when_it_does():
    """Our turn passed while our fetches were failing (nobody before us proposed); a payload we
    counted arrives during a later proposer's turn: our set is acceptable now, and goes out."""
    me = _key_placed(1)
    machine = rm.RoundMachine(me)
    machine.handle(seen(0.0, electorate=(me, A, B)))
    machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 10.0))
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), me: (b"p" * 32, 100)}
    machine.handle(seen(10.1, electorate=(me, A, B), commits=commits))
    machine.handle(rm.Fetched(1, A, False, 10.2))
    machine.handle(rm.Fetched(1, B, False, 10.3))
    turn = rm.PATIENCE * machine.window()
    ours_over = 13.0 + 2 * turn
    for now in (13.0, 13.0 + turn + 0.1, ours_over + 0.1):
        actions = machine.handle(seen(now, electorate=(me, A, B), commits=commits))
        assert "PublishProposal" not in kinds(actions)
    actions = machine.handle(rm.Fetched(1, A, True, ours_over + 1.0))
    assert kinds(actions) == ["PublishProposal", "StartAggregate"]
    assert set(machine.current.chosen) == {me, A}


def test_the_last_proposer_proposes_even_a_set_the_others_would_refuse():
    """An electorate of one (round 1: the run's creator) whose own commit came after its cutoff: its
    set names no member, but nobody else can propose, and its vote alone certifies the round."""
    machine = rm.RoundMachine(ME)
    machine.handle(seen(0.0, electorate=(ME,)))
    others = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine.handle(seen(1.0, electorate=(ME,), commits=others))
    machine.handle(rm.Fetched(1, A, True, 1.5))
    machine.handle(rm.Fetched(1, B, True, 1.6))
    actions = machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 5.0))  # the cutoff was 3.0
    cut = tuple(sorted((A, B)))
    assert actions == [rm.PublishCommit(1, b"p" * 32, 100), rm.PublishProposal(1, cut), rm.StartAggregate(1, cut, 1.0)]


def test_a_peer_that_sits_out_finishes_its_round_then_leaves_once_and_trains_nothing():
    machine, _ = trained_machine()  # round 1 under way: training was done before the pause
    commits = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 11), ME: (b"p" * 32, 100)}
    sitting = rm.Observation(10.1, 0, None, frozenset((ME, A, B)), commits, sit_out=True)
    assert kinds(machine.handle(sitting)) == ["Fetch", "Fetch"]  # the round under way goes on
    machine.handle(rm.Fetched(1, A, True, 10.2))
    machine.handle(rm.Fetched(1, B, True, 10.3))
    machine.handle(rm.Aggregated(1, H1, 10.4))
    after = rm.Observation(10.5, 1, H1, frozenset((ME, A, B)), {}, sit_out=True)
    assert machine.handle(after) == [rm.RoundDone(1, H1, 3, synced=False), rm.PublishLeave(1)]
    left = rm.Observation(10.6, 1, H1, frozenset((A, B)), {}, member=False, sit_out=True)
    assert machine.handle(left) == []  # no second leave, no join, no training
    assert machine.phase is rm.Phase.IDLE


def test_a_peer_that_sits_out_keeps_its_state_current_and_resumes_without_a_sync():
    machine = rm.RoundMachine(ME, state_round=1, state_hash=H1)
    assert machine.handle(rm.Observation(1.0, 1, H1, frozenset((ME, A, B)), {}, sit_out=True)) == [rm.PublishLeave(1)]
    # The run goes on without us: every certified round is synced, whatever the phase.
    assert machine.handle(rm.Observation(20.0, 2, H2, frozenset((A, B)), {}, member=False, sit_out=True)) == [
        rm.StartSync(2, H2)]
    assert machine.handle(rm.Synced(2, H2, 21.0)) == [rm.RoundDone(2, H2, 0, synced=True)]
    assert machine.state_round == 2 and machine.state_hash == H2
    # Resumed: join the contributors again from the next round, then train from the state held.
    assert machine.handle(rm.Observation(22.0, 2, H2, frozenset((A, B)), {}, member=False)) == [rm.PublishJoin(3)]
    assert machine.handle(rm.Observation(22.1, 2, H2, frozenset((A, B, ME)), {})) == [rm.StartTraining(3)]


def test_a_peer_that_resumes_while_a_round_is_under_way_joins_the_one_after():
    machine = rm.RoundMachine(ME, state_round=2, state_hash=H2)
    under_way = rm.Observation(5.0, 2, H2, frozenset((A, B)), {A: (b"pa" * 16, 10)}, member=False)
    assert machine.handle(under_way) == [rm.PublishJoin(4)]
    assert machine.handle(under_way) == []  # once per certified round
