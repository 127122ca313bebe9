"""Issue #33, a day of churn in miniature: `sim soak` (netsim/scenarios/soak.py) drives restarts,
replacements, leaves and slow spells at random moments, from the seed, through the daemon's own
round code on simulated hosts. Whatever the interleaving, no honest member is banned, every live
member holds the same certified hash for every round, the run never waits out a deadline (no
round takes more than a slow member's round plus a window), and nothing is left hanging at the end."""

from __future__ import annotations

import pytest

from locomesh.netsim.scenarios import soak

SLOW_ROUND = 3.5  # a member in a slow spell trains 3x slower: a round waits for it at most this many medians


def _check(report: dict) -> None:
    summary = report["summary"]
    assert summary["honest members banned"] == 0
    criteria = {c["criterion"]: c for c in report["verdict"]["criteria"]}
    assert criteria["rounds whose certified hash differs between two live members: none"]["passed"], criteria
    assert summary["longest round s"] <= SLOW_ROUND * summary["median round s"], report["tables"][0]
    assert summary["round in flight at the end s"] <= 2 * summary["median round s"], summary
    # Two slow members of six are a third of the electorate: the quorum waits for one of them.
    assert summary["rounds certified"] >= 0.85 * summary["rounds allowed"], summary


@pytest.mark.slow  # a soak (50 s); test_netsim_train covers churn and crashes in the default suite
def test_ten_minutes_of_churn_among_six_members():
    report = soak.run(nodes=6, seed=1, hours=0.15, churn=4.0)
    assert sum(1 for row in report["tables"][1]["rows"] if row[4] == "—") >= 2  # churn did happen
    _check(report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4])
def test_half_an_hour_of_churn_over_seeds(seed):
    _check(soak.run(nodes=6, seed=seed, hours=0.5, churn=3.0))


@pytest.mark.slow
def test_a_partition_heals_into_one_history_without_bans():
    """Two halves of four cannot reach each other for 200 s; neither has a quorum alone, so neither
    certifies; once they meet again the run goes on, every member holding one history."""
    report = soak.run(nodes=4, seed=1, hours=0.2, churn=0.0, partition_at=60.0, partition_seconds=200.0)
    _check_partition(report)


def _check_partition(report: dict) -> None:
    summary = report["summary"]
    assert summary["honest members banned"] == 0
    criteria = {c["criterion"]: c for c in report["verdict"]["criteria"]}
    assert criteria["rounds whose certified hash differs between two live members: none"]["passed"], criteria
    assert summary["round in flight at the end s"] <= 2 * summary["median round s"], summary
    assert summary["rounds certified"] >= 20, summary  # the run went on after the heal
