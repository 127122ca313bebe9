"""The attacks of issue #18 against real nodes in netsim (`locomesh sim train` options): the
daemon's own services on simulated links, attackers built from the same services with one
behaviour turned hostile (netsim/adversaries.py). Pure round logic: tests/test_attacks_rounds.py."""

from __future__ import annotations

import pytest

from locomesh.netsim.scenarios import train
from locomesh.node.exchange.allgather import FETCH_TIMEOUT

SMALL = {"rounds": 4, "inner_steps": 4, "step_seconds": 0.5, "join_window": 1.0, "payload_bytes": 8 * 1024}
ATTACKS = {"withholding": 2, "restarters": 1, "sybils": 3, "bombers": 2, "spammers": 1}


def _nodes(report: dict) -> dict[str, list]:
    return {row[0]: row for row in report["tables"][1]["rows"]}


def _honest_hashes(report: dict) -> set[str]:
    kinds = {name: row[1] for name, row in _nodes(report).items()}
    return {h for name, h in report["hashes"].items() if kinds[name] not in train.HOSTILE}


def test_members_that_withhold_their_payloads_cost_a_round_seconds_not_a_fetch_timeout():
    """Two members serve round 1 (earning a say, and turns as proposer), then commit and never
    serve a payload. On bfb477a each such payload held every round for FETCH_TIMEOUT (60 s), and
    a withholder that was first proposer held the round for ever."""
    report = train.run(nodes=8, seed=1, withholding=2, **SMALL)
    assert report["summary"]["nodes that reached the last round"] == 8
    assert len(_honest_hashes(report)) == 1
    round_times = [row[3] for row in report["tables"][0]["rows"][1:]]
    # 8.2, 19.2 (a withholder proposed first: its set is given up after ABANDON_AFTER failed fetches), 7.8
    assert all(seconds < FETCH_TIMEOUT / 2 for seconds in round_times), round_times
    assert all(row[4] == 6 for row in report["tables"][0]["rows"][1:])  # the withheld payloads left out


@pytest.mark.slow
def test_sixteen_honest_nodes_keep_training_through_every_attack_at_once():
    """16 honest nodes (one of them killed right after a commit and restarted on its data dir)
    against withholding members, Sybil attesters, payload bombers and an op spammer: every round
    is certified, every honest node ends on one state, and none holds more than a quarter above what
    it held in the same run without attackers. (Data-plane squatters need real sockets:
    tests/test_attacks_dataplane.py.)"""
    clean = train.run(nodes=16, seed=2, **SMALL)
    attacked = train.run(nodes=16 + ATTACKS["withholding"], seed=2, **SMALL, **ATTACKS)
    assert attacked["summary"]["nodes that reached the last round"] == 16 + ATTACKS["withholding"]
    assert len(_honest_hashes(attacked)) == 1
    assert all(row[2] == "up" for row in _nodes(attacked).values())  # the restarted one is back, not banned
    clean_held = max(row[7] for row in _nodes(clean).values())
    honest = [row for row in _nodes(attacked).values() if row[1] not in train.HOSTILE]
    assert len(honest) == 16
    # A half: the payloads a node holds (in memory, released a round later) no longer dilute the
    # ops it holds, of which the attacked run has more (its hostile members' and intruders' ops,
    # within their caps, and the votes of the attempts a withholding proposer costs): 308.9 KiB
    # clean against 407.6 attacked at seed 2 (2026-12-08; netsim runs vary a little between runs).
    # What this guards against is orders of magnitude more (bfb477a: bombs +3.1 GiB, spam +182 MiB).
    assert max(row[7] for row in honest) <= 1.5 * clean_held, (clean_held, [row[7] for row in honest])
