"""netsim `checkpoint`: a real checkpoint spreads from one seeder through the DHT-found swarm; k providers add up."""

from __future__ import annotations


import pytest

from locomesh.netsim.scenarios import SCENARIOS, checkpoint

# Small enough for the default suite: a 0.2 MB model in 13 chunks, a 1 MiB probe in 32 chunks. (The
# figure, >= 0.8 k at k <= 4, needs a checkpoint large enough to hide a download's fixed round trips:
# bench/netsim_checkpoint.py.)
SMALL = {"model_width": 128, "chunk_size": 16 * 1024, "join_window": 10.0, "probe_size": 1024 * 1024,
         "probe_chunk_size": 32 * 1024}


@pytest.fixture(scope="module")
def small_report() -> dict:
    return checkpoint.run(nodes=8, seed=4, **SMALL)


def test_every_joiner_gets_the_checkpoint_mostly_from_other_joiners(small_report):
    summary = small_report["summary"]
    assert summary["joiners"] == 7 and summary["joiners done"] == 7
    # Joiners that finished provide it too: later ones find several providers, the seeder serves a minority.
    assert summary["providers per download (mean)"] > 2
    assert summary["share of chunks served by the seeder"] < 0.5


def test_more_providers_download_faster(small_report):
    rows = small_report["tables"][1]["rows"]
    assert [row[0] for row in rows] == [1, 2, 3, 4]
    rates = [row[2] for row in rows]
    assert rates == sorted(rates) and rates[3] > 1.5 * rates[0]
    # Every provider served a share (the schedule spreads the chunks).
    assert all(min(int(n) for n in row[5].split(" / ")) > 0 for row in rows)


def test_registered_for_locomesh_sim():
    assert SCENARIOS["checkpoint"] is checkpoint.run
    with pytest.raises(ValueError):
        checkpoint.run(nodes=1)
