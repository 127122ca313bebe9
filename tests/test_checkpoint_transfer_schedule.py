"""The download scheduler alone (sans-IO): simulated providers that are fast, slow, gone, or lying."""

from __future__ import annotations

import random

import pytest

from locomesh.node.transfer.schedule import DownloadSchedule, Outcome

SIZE = 1000


def schedule(chunks: int, providers: list[str], **options) -> DownloadSchedule:
    return DownloadSchedule({index: SIZE for index in range(chunks)}, providers, **options)


def simulate(plan: DownloadSchedule, behaviour, *, seed: int = 0, steps: int = 10_000) -> list[tuple[str, int, Outcome]]:
    """Run the schedule against providers whose answer for a chunk is `behaviour(peer, index)`.

    In-flight requests complete in a seeded random order, so interleavings vary but repeat.
    """
    rng = random.Random(seed)
    in_flight: list[tuple[str, int]] = []
    log = []
    for _ in range(steps):
        for peer in plan.peers:
            while (index := plan.next_chunk(peer)) is not None:
                in_flight.append((peer, index))
        if plan.finished or not in_flight:
            break
        peer, index = in_flight.pop(rng.randrange(len(in_flight)))
        outcome, seconds = behaviour(peer, index)
        plan.record(peer, index, outcome, seconds=seconds)
        log.append((peer, index, outcome))
    return log


def test_honest_providers_fetch_every_chunk_once():
    plan = schedule(40, ["a", "b", "c"])
    log = simulate(plan, lambda peer, index: (Outcome.STORED, 0.01))
    assert plan.done and plan.failure() is None
    fetched = [index for _, index, _ in log]
    assert set(fetched) == set(range(40)) and len(fetched) <= 40 + 3 * plan.max_window  # endgame copies only
    assert all(plan.peers[peer].stored > 0 for peer in "abc")


def test_a_liar_is_struck_dropped_and_its_chunks_come_from_others():
    plan = schedule(30, ["honest", "liar"], max_strikes=3)
    log = simulate(plan, lambda peer, index: (Outcome.BAD if peer == "liar" else Outcome.STORED, 0.01))
    assert plan.done
    # answers already in flight when it was dropped still count
    assert plan.peers["liar"].strikes >= 3 and plan.peers["liar"].dropped is not None
    assert plan.peers["honest"].stored == 30
    assert [entry for entry in log if entry[0] == "liar" and entry[2] is Outcome.STORED] == []


def test_a_chunk_that_failed_verification_is_never_asked_of_that_provider_again():
    plan = schedule(1, ["liar", "honest"], max_strikes=10)
    assert plan.next_chunk("liar") == 0
    plan.record("liar", 0, Outcome.BAD)
    assert plan.next_chunk("liar") is None
    assert plan.next_chunk("honest") == 0


def test_a_vanished_provider_loses_its_chunks_to_the_others():
    plan = schedule(20, ["gone", "here"], max_failures=2)
    simulate(plan, lambda peer, index: (Outcome.FAILED if peer == "gone" else Outcome.STORED, 0.01))
    assert plan.done
    assert plan.peers["gone"].dropped is not None and plan.peers["here"].stored == 20


def test_a_slow_provider_gets_fewer_chunks_but_keeps_its_window():
    plan = schedule(200, ["fast", "slow"], max_window=4)
    simulate(plan, lambda peer, index: (Outcome.STORED, 0.01 if peer == "fast" else 0.1), seed=3)
    assert plan.done
    # A window scaled by the observed rate would trap a provider on a long path in a small one.
    assert plan.window("slow") == 4 and plan.window("fast") == 4
    assert plan.peers["fast"].rate > plan.peers["slow"].rate


def test_busy_halves_the_window_without_a_strike():
    plan = schedule(10, ["p"], max_window=4)
    first = plan.next_chunk("p")
    plan.record("p", first, Outcome.BUSY)
    assert plan.window("p") == 2 and plan.peers["p"].strikes == 0 and plan.failure() is None


def test_a_provider_that_is_always_busy_is_dropped_in_the_end():
    plan = schedule(2, ["full"], max_busy=5)
    simulate(plan, lambda peer, index: (Outcome.BUSY, 0.01))
    assert plan.finished and plan.peers["full"].dropped == "busy 5 times in a row"
    assert plan.failure() == "every provider was dropped: full: busy 5 times in a row"


def test_endgame_duplicates_a_chunk_stuck_at_another_provider():
    plan = schedule(1, ["stuck", "idle"])
    assert plan.next_chunk("stuck") == 0
    assert plan.next_chunk("idle") == 0  # queue empty: a copy of the stuck chunk
    plan.record("idle", 0, Outcome.STORED, seconds=0.01)
    assert plan.done
    plan.record("stuck", 0, Outcome.FAILED)  # its late answer changes nothing
    assert plan.done and plan.stored == 1


def test_a_chunk_nobody_has_fails_the_download_with_a_reason():
    plan = schedule(3, ["a", "b"])
    simulate(plan, lambda peer, index: (Outcome.NOT_FOUND if index == 2 else Outcome.STORED, 0.01))
    assert plan.finished and not plan.done and plan.stored == 2
    assert plan.failure() == "no remaining provider can serve chunk 2"  # both delivered chunks: only chunk 2 is lost


def test_a_provider_without_the_checkpoint_is_asked_once_not_for_every_chunk():
    plan = schedule(6, ["author", "empty"])
    log = simulate(plan, lambda peer, index: (Outcome.NOT_FOUND if peer == "empty" else Outcome.STORED, 0.01))
    assert plan.done and plan.stored == 6
    assert sum(peer == "empty" for peer, _, _ in log) <= plan.max_window  # the requests in flight when it said so
    assert plan.peers["empty"].dropped == "does not hold the checkpoint"


def test_resume_asks_only_for_the_missing_chunks():
    plan = DownloadSchedule({3: SIZE, 7: SIZE}, ["a"])
    log = simulate(plan, lambda peer, index: (Outcome.STORED, 0.01))
    assert sorted(index for _, index, _ in log) == [3, 7]


def test_recording_a_chunk_the_provider_was_not_given_is_a_bug():
    plan = schedule(2, ["a", "b"])
    plan.next_chunk("a")
    with pytest.raises(ValueError):
        plan.record("b", 0, Outcome.STORED)


@pytest.mark.parametrize("seed", range(5))
def test_random_mixes_of_behaviour_end_done_whenever_one_honest_provider_remains(seed):
    rng = random.Random(seed)
    plan = schedule(50, ["honest", "flaky", "liar", "busy"])
    behaviours = {
        "honest": lambda: Outcome.STORED,
        "flaky": lambda: rng.choice([Outcome.STORED, Outcome.FAILED]),
        "liar": lambda: rng.choice([Outcome.STORED, Outcome.BAD]),
        "busy": lambda: rng.choice([Outcome.STORED, Outcome.BUSY]),
    }
    simulate(plan, lambda peer, index: (behaviours[peer](), rng.uniform(0.001, 0.1)), seed=seed)
    assert plan.done
