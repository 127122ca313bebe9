"""Contribution scores (training/scoring.py): what a Δ does to the loss alone, and what they weigh."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from locomesh.training import attacks
from locomesh.training.attacks import AttackView
from locomesh.training.simulation import DiLoCoConfig, simulate_diloco
from locomesh.training.flat import flatten
from locomesh.training.inner import Worker
from locomesh.training.scoring import (
    Reputation, ScoringConfig, bar, excluded, relative, score_contributions, shrunk, weights,
)
from locomesh.training.tasks import get_task

from .test_simulation import INNER, TINY_TASK


@pytest.fixture(scope="module")
def trained():
    """A task, θ after a first round (from the initialisation any step helps, even backwards), and
    one worker's honest Δ of the second round."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    task = get_task("synthetic-lm", TINY_TASK)
    worker = Worker(task, 0, 0, 0, INNER)
    initial = flatten(worker.model).copy()
    theta = initial - worker.run_round(initial, 40).delta
    return task, theta, worker.run_round(theta, 20).delta


def test_an_honest_delta_scores_above_zero_a_zero_delta_zero_and_its_opposite_below(trained):
    task, theta, delta = trained
    scratch = task.build_model(0)
    scores = score_contributions(task, scratch, theta, {"honest": delta, "zero": np.zeros_like(delta), "flipped": -delta},
                                 seed=5, config=ScoringConfig())
    assert scores["honest"] > 0.005  # the tiny task is nearly learnt after one round: small, still above zero
    assert scores["zero"] == 0.0
    assert scores["flipped"] < -0.5


def test_scores_depend_on_the_rounds_seed_alone(trained):
    task, theta, delta = trained
    config = ScoringConfig(batches=2)
    first = score_contributions(task, task.build_model(0), theta, {"a": delta}, seed=5, config=config)
    again = score_contributions(task, task.build_model(1), theta, {"a": delta}, seed=5, config=config)
    other = score_contributions(task, task.build_model(0), theta, {"a": delta}, seed=6, config=config)
    assert first == again and first != other


def test_the_policy_decides_who_is_left_out():
    scores = {"a": 0.30, "b": 0.28, "c": 0.26, "d": 0.10, "e": -0.2, "nan": math.nan}
    assert excluded(scores, ScoringConfig(policy="report")) == {"nan"}
    assert bar({k: v for k, v in scores.items() if k != "nan"}, 0.5) == pytest.approx(0.13)  # half the median 0.26
    assert excluded(scores, ScoringConfig(policy="exclude", keep_ratio=0.5)) == {"d", "e", "nan"}
    flat = {"a": -0.02, "b": -0.01, "c": -0.04}  # nothing improved: the bar falls below the median
    assert bar(flat, 0.5) == pytest.approx(-0.03)
    assert excluded(flat, ScoringConfig(policy="exclude", keep_ratio=0.5)) == {"c"}


def test_reputation_leaves_out_an_author_whose_recent_relative_scores_average_under_the_bar():
    reputation = Reputation(ScoringConfig(policy="reputation", keep_ratio=0.9, history=2))
    assert reputation.excluded(["a", "b"]) == set()  # nobody scored yet: everyone is in
    reputation.record({"a": 1.0, "b": 1.1, "c": 0.5})  # median 1.0: relative 1.0, 1.1, 0.5
    assert reputation.excluded(["a", "b", "c"]) == {"c"}
    reputation.record({"a": 1.0, "b": 0.9, "c": 1.3})  # c's average (0.5 + 1.3) / 2 = 0.9: back in
    assert reputation.excluded(["a", "b", "c"]) == set()
    reputation.record({"a": 1.0, "b": 1.0, "c": 0.0})  # only the last 2 rounds count: c (1.3 + 0) / 2
    assert reputation.excluded(["a", "b", "c"]) == {"c"}
    assert relative({"a": -0.1, "b": 0.0, "c": 0.2}) == {}  # a round that improved nothing tells nothing
    reputation.record({"a": -0.1, "b": 0.0, "c": 0.2})
    assert reputation.relative["c"] == [1.3, 0.0]


def test_evading_reputation_spends_only_what_its_average_allows_and_rebuilds_it_when_out():
    def estimate(deltas):  # every step away from the honest mean costs; honest ones score about 0.78
        center = np.mean(deltas[:6], axis=0)
        return [1.0 - float(np.linalg.norm(d - center)) / 100.0 for d in deltas]

    mean_of = lambda rows, center=None: np.mean(np.stack(rows).astype(np.float64), axis=0)  # noqa: E731
    config = ScoringConfig(policy="reputation", keep_ratio=0.9, history=2)
    honest_mean = lambda view: np.mean(np.stack(view.honest_deltas).astype(np.float64), axis=0)  # noqa: E731
    out = dataclasses.replace(_evading_view(estimate, mean_of), scoring=config, reputation=[0.5])
    assert np.array_equal(attacks.evading_scores("random")(out), honest_mean(out).astype(np.float32))
    credit, no_credit = (dataclasses.replace(out, reputation=[value]) for value in (1.3, 0.9))
    far, near = (np.linalg.norm(attacks.evading_scores("random")(view) - honest_mean(view)) for view in (credit, no_credit))
    assert far > near  # credit banked buys a larger push


def test_scoring_settings_are_checked():
    for bad in ({"policy": "weigh"}, {"batches": 0}, {"keep_ratio": 1.5}, {"history": 0}):
        with pytest.raises(ValueError):
            ScoringConfig(**bad)


def test_in_a_run_colluders_pushing_against_descent_are_left_out_every_round():
    torch.set_num_threads(1)
    task = get_task("synthetic-lm", TINY_TASK)
    config = DiLoCoConfig(workers=5, rounds=3, inner_steps=8, inner=INNER, scoring=ScoringConfig(policy="exclude"))
    result = simulate_diloco(task, config, byzantine={3: attacks.sign_flip(1.0), 4: attacks.sign_flip(1.0)})
    for record in result.history:
        assert record.excluded == ["worker-3", "worker-4"]
        assert set(record.scores) == {f"worker-{i}" for i in range(5)}
        assert min(record.scores[f"worker-{i}"] for i in range(3)) > max(record.scores["worker-3"], record.scores["worker-4"])


def _evading_view(estimate, aggregate) -> AttackView:
    rng = np.random.default_rng(3)
    honest = [(1.0 + rng.standard_normal(500)).astype(np.float32) for _ in range(6)]
    return AttackView(
        round_index=0, honest_deltas=honest, past_honest_payloads=[], workers=8, byzantine=2,
        rng=np.random.default_rng(0), encode_non_finite=lambda value, numel: b"",
        previous=np.ones(500, np.float32), aggregate=aggregate,
        scoring=ScoringConfig(policy="exclude", keep_ratio=0.5), estimate_scores=estimate,
    )


def test_evading_the_scores_goes_as_far_as_the_estimated_bar_allows():
    def estimate(deltas):  # a stand-in for the loss: every step away from the honest mean costs
        center = np.mean(deltas[:6], axis=0)
        return [1.0 - float(np.linalg.norm(d - center)) / 20.0 for d in deltas]

    mean_of = lambda rows, center=None: np.mean(np.stack(rows).astype(np.float64), axis=0)  # noqa: E731
    view = _evading_view(estimate, mean_of)
    sent = attacks.evading_scores("random")(view).astype(np.float64)
    honest_scores = estimate(list(view.honest_deltas))
    assert estimate([*view.honest_deltas, sent])[-1] >= bar(dict(enumerate(honest_scores + [0.0] * 0)), 0.5) - 1e-6
    farther = sent + 0.5 * (sent - np.mean(view.honest_deltas, axis=0))  # one step further would fail
    assert estimate([*view.honest_deltas, farther.astype(np.float32)])[-1] < bar(
        dict(enumerate(honest_scores + [estimate([*view.honest_deltas, farther.astype(np.float32)])[-1]] * 2)), 0.5)
    nothing_passes = _evading_view(lambda deltas: [1.0] * 6 + [-1.0] * (len(deltas) - 6), mean_of)
    assert np.array_equal(attacks.evading_scores("random")(nothing_passes),
                          np.mean(np.stack(nothing_passes.honest_deltas).astype(np.float64), axis=0).astype(np.float32))
    with pytest.raises(ValueError, match="scoring"):
        attacks.evading_scores()(_evading_view(None, mean_of))


def test_weights_are_the_score_over_the_median_capped_at_one():
    assert weights({"a": 0.4, "b": 0.2, "c": 0.1, "d": -0.3, "e": float("nan")}) == pytest.approx({
        "a": 1.0, "b": 1.0, "c": 2 / 3, "d": 0.0, "e": 0.0})  # the median of the finite four is 0.15
    assert weights({"a": -0.01, "b": -0.02}) == {"a": 1.0, "b": 1.0}  # nothing improved: nothing told apart
    center = np.array([1.0, 1.0], np.float32)
    assert np.array_equal(shrunk(np.array([3.0, -1.0], np.float32), center, 0.5), np.array([2.0, 0.0], np.float32))
    assert np.array_equal(shrunk(np.array([3.0, -1.0], np.float32), None, 0.5), np.array([1.5, -0.5], np.float32))


def test_in_a_run_the_weight_policy_shrinks_colluders_and_leaves_honest_peers_whole():
    torch.set_num_threads(1)
    task = get_task("synthetic-lm", TINY_TASK)
    config = DiLoCoConfig(workers=5, rounds=2, inner_steps=8, inner=INNER, aggregator="mean",
                          scoring=ScoringConfig(policy="weight"))
    attacked = simulate_diloco(task, config, byzantine={4: attacks.sign_flip(100.0)})
    plain = simulate_diloco(task, DiLoCoConfig(workers=5, rounds=2, inner_steps=8, inner=INNER, aggregator="mean"),
                            byzantine={4: attacks.sign_flip(100.0)})
    for record in attacked.history:
        assert record.excluded == [] and record.scores["worker-4"] < 0  # weighed to zero, not left out
    assert attacked.loss < plain.loss - 0.5  # the plain mean is wrecked by sign_flip_x100; weighed, it is not
