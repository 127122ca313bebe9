"""netsim `train`: the daemon's round protocol on simulated nodes whose training costs virtual time."""

from __future__ import annotations

import hashlib
import json

import pytest

from locomesh.netsim.scenarios import SCENARIOS, train
from locomesh.node.exchange.allgather import FETCH_TIMEOUT
from locomesh.node.rounds.machine import MIN_COLLECT_SECONDS
from locomesh.netsim.sim_participant import JUNK_MARK, SimCost, SimParticipant
from locomesh.node.transfer.store import load_state, write_state
from locomesh.training.checkpoint_manifest import LimitError
from .repeatable import output_of_fresh_process

# 2 s of compute per round and a 1 s join window keep 8 nodes x 3 rounds at seconds of wall time.
SMALL = {"rounds": 3, "inner_steps": 4, "step_seconds": 0.5, "join_window": 1.0, "payload_bytes": 8 * 1024}
BODY = {"hparams": {"inner_steps": 4}, "seed": 7}
COST = SimCost(step_seconds=0.5, payload_bytes=1024, state_bytes=256)
RUN = bytes(32)


def _run_in_a_fresh_process() -> dict:
    """The report of 8 nodes, seed 3, as `locomesh sim` makes it: a process of its own
    (`output_of_fresh_process`: a run is repeatable from a fresh process, a second run in one
    process is not)."""
    code = (
        "import json, logging, sys; logging.disable(logging.CRITICAL); "
        "from locomesh.netsim.scenarios import train; "
        f"json.dump(train.run(nodes=8, seed=3, **{SMALL!r}), sys.stdout)"
    )
    return json.loads(output_of_fresh_process(code))


@pytest.fixture(scope="module")
def small_report() -> dict:
    return _run_in_a_fresh_process()


def test_every_node_ends_with_the_same_state(small_report):
    hashes = small_report["hashes"]
    assert len(hashes) == 8 and len(set(hashes.values())) == 1
    assert small_report["summary"]["nodes that reached the last round"] == 8
    rounds = small_report["tables"][0]["rows"]
    assert [row[0] for row in rounds] == [1, 2, 3]
    assert all(row[-1] == 8 and row[4] >= 5 for row in rounds)  # every node done; contributors above half


def test_compute_share_is_training_over_elapsed(small_report):
    for row in small_report["tables"][1]["rows"]:
        name, kind, end, done, synced, compute_seconds, share, _held, _banned = row
        assert end == "up" and done == 3
        assert compute_seconds >= 3 * 2.0  # three rounds of 4 x 0.5 s, at least
        assert 0 < share < 1


def test_the_same_seed_gives_the_same_report(small_report):
    assert _run_in_a_fresh_process() == small_report


def test_delayed_updates_overlap_training_with_the_exchange():
    """With one-round-delayed outer updates a round takes the longer of its compute (here 6 s) and
    its exchange (at least the 2 s cutoff window), not their sum; the nodes still end on one state."""
    compute = SMALL["inner_steps"] * 1.5
    delayed = train.run(nodes=8, seed=3, delayed_updates=True, **{**SMALL, "step_seconds": 1.5})
    assert len(delayed["hashes"]) == 8 and len(set(delayed["hashes"].values())) == 1
    assert delayed["summary"]["nodes that reached the last round"] == 8
    round_times = [row[3] for row in delayed["tables"][0]["rows"][1:]]
    # Each round takes less than compute plus the cutoff window, their sum without the overlap (the
    # keepers' run cards, published to the DHT as the members join, cost round 2 a quarter second).
    # One certificate may come less than `compute` after the one before (that round's training
    # started ahead, before it), but the rounds cannot outrun the compute on average.
    assert all(seconds < compute + MIN_COLLECT_SECONDS for seconds in round_times), round_times
    assert sum(round_times) / len(round_times) >= compute - 0.5, round_times
    # Without the overlap at most 3 x 6 s of compute in 3 x (6 + 2) s: a share of 0.75.
    assert delayed["summary"]["compute share min"] > 0.78  # 0.82 measured


def test_with_delayed_updates_a_node_that_crashes_after_its_commit_costs_less_than_a_fetch_timeout():
    """Delayed updates commit a round as soon as it starts, so a crash now often follows a commit.
    The payload of an author that is gone is given up after one failed try, not after FETCH_TIMEOUT,
    and a proposer we hold no connection to gets one window, not PATIENCE windows."""
    result = train.run(nodes=10, seed=5, byzantine=2, churn=2, churn_round=2, delayed_updates=True, **SMALL)
    kinds = {row[0]: row[1] for row in result["tables"][1]["rows"]}
    honest = {name: h for name, h in result["hashes"].items() if kinds[name] != "byzantine"}
    assert len(honest) == 8 and len(set(honest.values())) == 1
    round_two = result["tables"][0]["rows"][1]
    assert round_two[3] < FETCH_TIMEOUT / 3, round_two  # 10 s measured: one failed try; 61 s before


def test_crashes_every_absent_rounds_rounds_do_not_pile_up_in_the_electorate():
    # Three waves (rounds 2, 5, 8) crash one node each in a run of 4, and a newcomer the creator
    # admits takes each one's place: a crashed member is named by no commit or precommit for
    # `absent_rounds` (3) rounds and leaves the electorate (crdt/membership.py), so that the next
    # wave finds three live members of four, a quorum. Were crashed members kept, the second wave
    # would leave three live members of five: no quorum, every round to the recovery wait.
    result = train.run(nodes=4, seed=5, churn=1, churn_every=3, run_timeout=600.0, round_deadline_s=60,
                       **{**SMALL, "rounds": 8})
    rows = {row[0]: row for row in result["tables"][1]["rows"]}
    live = {name for name, row in rows.items() if row[2] == "up"}
    assert sum(row[2] == "crashed" for row in rows.values()) == 3
    assert set(result["hashes"]) == live and len(set(result["hashes"].values())) == 1
    assert rows["n0000"][3] == 8  # the creator trained every round
    assert result["summary"]["virtual seconds"] < 180, result["summary"]  # no round waited for a recovery


def test_scenario_is_registered():
    assert SCENARIOS["train"] is train.run


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        train.run(nodes=6, churn=2)
    with pytest.raises(TypeError):
        train.run(nodes=6, no_such_option=1)


# --- SimParticipant -------------------------------------------------------------------------------


def _payloads(round_number: int, keys: list[bytes]) -> dict[bytes, bytes]:
    payloads = {}
    for key in keys:
        peer = SimParticipant(BODY, key, COST)
        peer.round = round_number
        payloads[key] = peer.train().payload
    return payloads


def test_training_costs_modelled_time_and_is_repeatable():
    peer = SimParticipant(BODY, b"a" * 32, COST)
    contribution = peer.train()
    assert peer.take_pending_seconds() == contribution.seconds == 4 * 0.5
    assert peer.take_pending_seconds() == 0.0
    assert len(contribution.payload) == 1024 and peer.is_valid(contribution.payload)
    assert contribution.payload == SimParticipant(BODY, b"a" * 32, COST).train().payload
    assert contribution.payload != SimParticipant(BODY, b"b" * 32, COST).train().payload


def test_same_set_same_state_and_junk_changes_nothing():
    keys = [bytes([i]) * 32 for i in range(4)]
    payloads = _payloads(0, keys)
    forward, backward = SimParticipant(BODY, keys[0], COST), SimParticipant(BODY, keys[1], COST)
    forward.aggregate(payloads)
    backward.aggregate(dict(reversed(payloads.items())))
    assert forward.state == backward.state and forward.round == backward.round == 1

    byzantine = SimParticipant(BODY, b"z" * 32, COST, byzantine=True)
    junk = byzantine.train().payload
    assert junk[0] == JUNK_MARK and not byzantine.is_valid(junk)
    with_junk = SimParticipant(BODY, keys[2], COST)
    with_junk.aggregate({**payloads, b"z" * 32: junk, b"y" * 32: b"short"})
    assert with_junk.state == forward.state

    fewer = SimParticipant(BODY, keys[3], COST)
    fewer.aggregate(dict(list(payloads.items())[:3]))
    assert fewer.state != forward.state
    with pytest.raises(ValueError):
        SimParticipant(BODY, keys[3], COST).aggregate({b"z" * 32: junk})


def test_save_and_load_carry_the_state(tmp_path):
    keys = [bytes([i]) * 32 for i in range(3)]
    ahead = SimParticipant(BODY, keys[0], COST)
    ahead.aggregate(_payloads(0, keys))
    manifest = write_state(tmp_path, ahead.snapshot(), RUN)
    assert manifest.state_hash == write_state(tmp_path, ahead.snapshot(), RUN).state_hash

    behind = SimParticipant(BODY, keys[1], COST)
    assert load_state(tmp_path, manifest.id, behind, RUN).state_hash == manifest.state_hash
    assert behind.state == ahead.state and behind.round == 1
    with pytest.raises(LimitError):
        load_state(tmp_path, manifest.id, behind, b"\x01" * 32)
    other = SimParticipant(BODY, keys[1], SimCost(state_bytes=128))
    with pytest.raises(LimitError):
        load_state(tmp_path, manifest.id, other, RUN)
    assert hashlib.sha256(behind.state).digest() == hashlib.sha256(ahead.state).digest()


@pytest.mark.slow
def test_byzantine_slow_and_churned_nodes_do_not_split_the_honest_ones():
    result = train.run(nodes=10, seed=5, byzantine=2, slow=2, churn=2, churn_round=2, **SMALL)
    kinds = {row[0]: row[1] for row in result["tables"][1]["rows"]}
    honest = {name: h for name, h in result["hashes"].items() if kinds[name] != "byzantine"}
    assert len(honest) == 8 and len(set(honest.values())) == 1  # 10 - 2 crashed, the 2 joiners included
    assert result["summary"]["nodes that reached the last round"] >= 8
