"""netsim `directory`: nodes that know no run ID find every public run's card, published by its keepers."""

from __future__ import annotations

import pytest

from locomesh.netsim import report as reports
from locomesh.netsim.scenarios import SCENARIOS, directory

# A small network keeps the default suite quick on a shared 2-core machine (each node is a full
# py-libp2p host); the 200-node case is the slow test below.
SMALL = {"runs": 2, "members": 5, "browsers": 2, "join_window": 5.0, "settle": 10.0, "publish_wait": 12.0}


@pytest.fixture(scope="module")
def small_report() -> dict:
    return directory.run(nodes=16, seed=3, **SMALL)


def check(report: dict, runs: int, browsers: int) -> None:
    summary = report["summary"]
    assert reports.passed(report), reports.verdict_line(report["verdict"])
    assert summary["public runs"] == runs and summary["manifest publish failures"] == 0
    assert summary["browses"] == browsers and summary["browses that found every run"] == browsers
    assert summary["member counts right"] == runs * browsers
    assert all(3 <= keepers <= 4 for keepers in summary["card keepers per run"])  # a few members, not all


def test_every_browse_finds_every_public_run(small_report):
    check(small_report, 2, 2)


def findings(report: dict) -> tuple:
    """What the browses found and who kept which card: everything but the browses' timings."""
    summary = {key: value for key, value in report["summary"].items() if "latency" not in key and key != "virtual seconds"}
    browses, keepers = report["tables"]
    return summary, [row[:4] + row[5:] for row in browses["rows"]], keepers["rows"]


@pytest.mark.slow  # a second run of the whole simulation
def test_the_same_seed_finds_the_same_runs_through_the_same_keepers(small_report):
    # Not the whole report: a browse's latency differs by up to a few tenths of a second between runs
    # of one seed, even in fresh processes (the cause is not found: not the rate caps' pacing, not the
    # cards' footprints); who keeps which card, and what every browse finds, do not.
    assert findings(directory.run(nodes=16, seed=3, **SMALL)) == findings(small_report)


def test_registered_for_locomesh_sim():
    assert SCENARIOS["directory"] is directory.run
    with pytest.raises(ValueError):
        directory.run(nodes=10)


@pytest.mark.slow  # 200 py-libp2p hosts
def test_two_hundred_nodes():
    check(directory.run(nodes=200, seed=1), 4, 3)
