"""netsim `dht`: real Kademlia lookups (values and providers) keep succeeding while a fifth of the nodes churn."""

from __future__ import annotations

import pytest

from locomesh.netsim import report as reports
from locomesh.netsim.scenarios import SCENARIOS, dht

# 20 nodes keep the default suite quick on a shared 2-core machine (each node is a full py-libp2p host);
# the figure at 1,000 nodes is bench/netsim_dht.py's.
SMALL = {"lookups": 24, "join_window": 10.0, "settle": 20.0, "lookup_window": 60.0, "session": 40.0, "downtime": 15.0}


@pytest.fixture(scope="module")
def small_report() -> dict:
    return dht.run(nodes=20, seed=2, **SMALL)


def test_lookups_succeed_under_churn(small_report):
    summary = small_report["summary"]
    assert summary["churning nodes"] == round(17 * 0.2)
    assert summary["crashes"] > 0 and summary["restarts"] > 0  # the churn really happened
    assert summary["runs published"] == 5 and summary["publish failures"] == 0
    assert summary["lookups"] >= 20 and summary["lookup success rate"] >= 0.95
    kinds = {row[0]: row for row in small_report["tables"][0]["rows"]}
    assert set(kinds) == {"value", "providers", "all"}
    assert kinds["all"][9] > 0  # requests were counted


def test_the_same_seed_gives_the_same_report(small_report):
    assert reports.to_json(dht.run(nodes=20, seed=2, **SMALL)) == reports.to_json(small_report)


def test_registered_for_locomesh_sim():
    assert SCENARIOS["dht"] is dht.run
    with pytest.raises(ValueError):
        dht.run(nodes=4)
