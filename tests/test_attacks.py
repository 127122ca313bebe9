"""Each attack sends what it says; non-finite payloads are refused by the decoder, not aggregated."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locomesh.training import attacks
from locomesh.training.attacks import AttackView, alie_z, get_attack
from locomesh.training.codec import CodecError, Encoder, decode, non_finite_payload
from locomesh.training.simulation import DiLoCoConfig, simulate_diloco
from locomesh.training.inner import InnerConfig
from locomesh.training.tasks import get_task

from .test_simulation import TINY_TASK

NUMEL = 3000


def _view(round_index: int = 1, past=(), workers: int = 8, byzantine: int = 2) -> AttackView:
    rng = np.random.default_rng(7)
    honest = [rng.standard_normal(NUMEL).astype(np.float32) + 1.0 for _ in range(workers - byzantine)]
    return AttackView(
        round_index=round_index,
        honest_deltas=honest,
        past_honest_payloads=list(past),
        workers=workers,
        byzantine=byzantine,
        rng=np.random.default_rng(0),
        encode_non_finite=lambda value, numel: non_finite_payload("int8", value, numel),
    )


def _honest(view: AttackView) -> np.ndarray:
    return np.stack(view.honest_deltas).astype(np.float64)


@pytest.mark.parametrize("name, scale", [("sign_flip", 1.0), ("sign_flip_x100", 100.0), ("ipm", 0.5)])
def test_scaled_negative_mean(name, scale):
    view = _view()
    sent = get_attack(name)(view)
    assert sent.dtype == np.float32 and sent.shape == (NUMEL,)
    np.testing.assert_allclose(sent, -scale * _honest(view).mean(axis=0), rtol=1e-6)


def test_alie_is_mean_minus_z_std():
    view = _view()
    # n = 8, f = 2: s = floor(8/2 + 1) - 2 = 3, z = Φ⁻¹(5/8) ≈ 0.3186
    assert alie_z(8, 2) == pytest.approx(0.318639, abs=1e-6)
    sent = get_attack("alie")(view)
    honest = _honest(view)
    np.testing.assert_allclose(sent, honest.mean(0) - alie_z(8, 2) * honest.std(0, ddof=1), rtol=1e-5)
    fixed = attacks.alie(z=1.5)(view)
    np.testing.assert_allclose(fixed, honest.mean(0) - 1.5 * honest.std(0, ddof=1), rtol=1e-5)


@pytest.mark.parametrize("workers, byzantine, z", [(8, 1, 0.0), (8, 2, 0.318639), (9, 3, 0.764710), (50, 12, 0.582842)])
def test_alie_z_max_follows_baruch_et_al(workers, byzantine, z):
    # s = floor(n/2 + 1) − f supporters, z = Φ⁻¹((n − s)/n): Φ⁻¹(1/2), Φ⁻¹(5/8), Φ⁻¹(7/9), Φ⁻¹(36/50)
    assert alie_z(workers, byzantine) == pytest.approx(z, abs=1e-6)


@pytest.mark.parametrize("workers, byzantine", [(8, 0), (8, 5), (9, 8)])
def test_alie_z_max_is_undefined_without_attackers_or_past_half(workers, byzantine):
    with pytest.raises(ValueError, match="z_max"):
        alie_z(workers, byzantine)


def test_alie_moves_the_mean_by_f_over_n_z_sigma():
    view = _view(workers=8, byzantine=2)
    honest = _honest(view)
    sent = attacks.alie(z=16.0)(view).astype(np.float64)
    mean_with_attackers = (honest.sum(0) + 2 * sent) / 8
    np.testing.assert_allclose(mean_with_attackers, honest.mean(0) - (2 / 8) * 16 * honest.std(0, ddof=1), rtol=1e-4)


@pytest.mark.parametrize("z", [-1.0, float("nan"), float("inf")])
def test_alie_refuses_a_negative_or_non_finite_z(z):
    with pytest.raises(ValueError, match="finite z >= 0"):
        attacks.alie(z)


def test_alie_needs_two_honest_deltas():
    with pytest.raises(ValueError, match="two honest"):
        attacks.alie()(_view(workers=3, byzantine=2))


def test_gaussian_is_zero_mean_noise_scaled_to_the_honest_rms():
    view = _view()
    sent = get_attack("gaussian")(view)
    rms = np.sqrt(np.mean(_honest(view) ** 2))
    assert abs(sent.mean()) < 0.05 * 10 * rms
    assert sent.std() == pytest.approx(10 * rms, rel=0.05)


def test_zero_and_replay():
    assert not get_attack("zero")(_view()).any()
    assert not get_attack("replay")(_view(round_index=0)).any()  # nothing to replay yet
    past = [[b"round-0 worker 0", b"round-0 worker 1"], [b"round-1 worker 0", b"round-1 worker 1"]]
    assert get_attack("replay")(_view(round_index=2, past=past)) == b"round-1 worker 0"
    assert attacks.replay(age=2)(_view(round_index=2, past=past)) == b"round-0 worker 0"


@pytest.mark.parametrize("mode", ["int8", "int4", "fp32"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_payloads_are_rejected_by_the_decoder(mode, value):
    payload = non_finite_payload(mode, value, NUMEL)
    with pytest.raises(CodecError):
        decode(payload, NUMEL, modes=(mode,))


@pytest.mark.parametrize("name", ["nan", "inf"])
def test_nan_and_inf_attacks_make_undecodable_payloads(name):
    payload = get_attack(name)(_view())
    assert isinstance(payload, bytes)
    with pytest.raises(CodecError):
        decode(payload, NUMEL)
    honest = Encoder("int8", error_feedback=False).encode(_view().honest_deltas[0])
    assert decode(honest, NUMEL).shape == (NUMEL,)


def test_unknown_attack():
    with pytest.raises(ValueError, match="unknown attack"):
        get_attack("polite")


def _run(aggregator: str, attack: str | attacks.Attack | None):
    torch.set_num_threads(1)
    task = get_task("synthetic-lm", TINY_TASK)
    config = DiLoCoConfig(
        workers=5, rounds=2, inner_steps=8, inner=InnerConfig(lr=1e-2, batch_size=8),
        aggregator=aggregator,
    )
    if attack is None:
        return simulate_diloco(task, config), task
    made = get_attack(attack) if isinstance(attack, str) else attack
    return simulate_diloco(task, config, byzantine={4: made}), task


def test_in_a_run_nan_is_rejected_and_sign_flip_x100_breaks_mean_not_centered_clip():
    result, task = _run("centered_clip", "nan")
    assert all(record.rejected == ["worker-4"] for record in result.history)
    assert np.isfinite(result.theta).all()
    initial = task.evaluate(task.build_model(0))["loss"]
    broken, _ = _run("mean", "sign_flip_x100")
    robust, _ = _run("centered_clip", "sign_flip_x100")
    assert robust.loss < initial - 0.1
    assert broken.loss > initial + 0.5


def test_in_a_run_alie_at_a_large_z_undoes_training_with_mean_not_with_centered_clip():
    # One attacker of five at z = 64 pulls the mean 12.8 honest standard deviations along −σ.
    broken, task = _run("mean", attacks.alie(64.0))
    initial = task.evaluate(task.build_model(0))["loss"]
    robust, _ = _run("centered_clip", attacks.alie(64.0))
    clean, _ = _run("centered_clip", None)
    assert clean.loss < initial - 0.5  # training works here ...
    assert broken.loss > initial  # ... and the attack on the mean undoes all of it
    assert robust.loss < clean.loss * 1.01


# -- adaptive attacks: they know the aggregator, its centre and radius -----------------------


def _adaptive_view(aggregate=None, previous=None, round_index: int = 1, seed: int = 7) -> AttackView:
    view = _view(round_index=round_index)
    rng = np.random.default_rng(seed)
    honest = [(rng.standard_normal(NUMEL) + 1.0).astype(np.float32) for _ in view.honest_deltas]
    return AttackView(**{**view.__dict__, "honest_deltas": honest, "previous": previous, "aggregate": aggregate})


def test_min_max_goes_exactly_as_far_as_the_honest_diameter_allows():
    view = _adaptive_view()
    sent, honest = attacks.min_max(view).astype(np.float64), _honest(view)
    mean = honest.mean(0)
    diameter = max(np.linalg.norm(x - y) for x in honest for y in honest)
    farthest = max(np.linalg.norm(sent - x) for x in honest)
    assert farthest == pytest.approx(diameter, rel=1e-5)
    direction = (sent - mean) / np.linalg.norm(sent - mean)
    np.testing.assert_allclose(direction, -mean / np.linalg.norm(mean), atol=1e-5)  # along −μ


def test_min_sum_sums_to_exactly_the_worst_honest_sum():
    view = _adaptive_view()
    sent, honest = attacks.min_sum(view).astype(np.float64), _honest(view)
    worst = max(sum(np.sum((x - y) ** 2) for y in honest) for x in honest)
    assert sum(np.sum((sent - x) ** 2) for x in honest) == pytest.approx(worst, rel=1e-5)
    assert np.linalg.norm(sent - honest.mean(0)) > 1.0


def test_mimic_copies_the_honest_delta_farthest_along_the_spread():
    rng = np.random.default_rng(3)
    axis = rng.standard_normal(NUMEL)
    along = [-3.0, 5.0, 1.0, -2.0, 0.5, -1.5]  # worker 1 is the farthest along the axis
    view = _view()
    honest = [(a * axis + 0.01 * rng.standard_normal(NUMEL)).astype(np.float32) for a in along]
    view = AttackView(**{**view.__dict__, "honest_deltas": honest})
    attack = attacks.mimic()
    sent = attack(view)
    assert any(np.array_equal(sent, h) for h in honest)
    chosen = next(i for i, h in enumerate(honest) if np.array_equal(sent, h))
    assert chosen in (1, 0)  # the top direction's sign is arbitrary: one end of the spread or the other
    assert np.array_equal(attack(view), sent)  # the direction is kept from round to round


@pytest.mark.parametrize("direction", attacks.DIRECTIONS)
def test_inside_the_radius_sits_at_its_fraction_of_the_radius_along_a_held_direction(direction):
    previous = np.full(NUMEL, 0.9, np.float32)
    view = _adaptive_view(previous=previous)
    honest = _honest(view)
    distances = sorted([0.0, 0.0] + [float(np.linalg.norm(x - previous)) for x in honest])
    tau = distances[(8 - 1) // 2]  # CenteredClip's lower median, the two attackers counted inside
    sent = attacks.inside_radius(0.5, direction)(view).astype(np.float64)
    offset = sent - previous
    assert np.linalg.norm(offset) == pytest.approx(0.5 * tau, rel=1e-5)
    mean = honest.mean(0)
    cosine = float(np.dot(offset, mean)) / (np.linalg.norm(offset) * np.linalg.norm(mean))
    assert cosine == pytest.approx({"against": -1.0, "orthogonal": 0.0}.get(direction, cosine), abs=1e-5)
    other_round = attacks.inside_radius(0.5, direction)(_adaptive_view(previous=previous, round_index=2, seed=8))
    other = other_round.astype(np.float64) - previous
    held = float(np.dot(offset, other)) / (np.linalg.norm(offset) * np.linalg.norm(other))
    if direction != "against":  # (that one follows this round's honest mean)
        assert held > 0.9  # the same direction, round after round


def _refusing_far_points(limit: float):
    """A toy aggregator that drops every row farther than `limit` from the rows' median (a detector)."""
    def aggregate(rows, center=None):
        stack = np.stack(rows).astype(np.float64)
        median = np.median(stack, axis=0)
        kept = [row for row in stack if np.linalg.norm(row - median) <= limit]
        return np.mean(kept, axis=0).astype(np.float32)
    return aggregate


def test_searched_alie_picks_the_largest_scale_the_aggregator_still_lets_through():
    view = _adaptive_view()
    honest = _honest(view)
    mean, std = honest.mean(0), honest.std(0, ddof=1)
    limit = 4.0 * float(np.linalg.norm(std))
    sent = attacks.alie_searched(AttackView(**{**view.__dict__, "aggregate": _refusing_far_points(limit)}))
    z = float(np.dot(mean - sent, std) / np.dot(std, std))

    def let_through(scale: float) -> bool:
        candidate = (mean - scale * std).astype(np.float32).astype(np.float64)
        median = np.median(np.vstack([honest, candidate, candidate]), axis=0)
        return bool(np.linalg.norm(candidate - median) <= limit)

    assert not let_through(max(attacks.SEARCH_SCALES))  # the detector has teeth ...
    assert z == pytest.approx(max(s for s in attacks.SEARCH_SCALES if let_through(s)), rel=1e-3)  # ... and is probed to its edge

    def mean_of(rows, center=None):
        return np.mean(rows, axis=0)

    unbounded = attacks.alie_searched(AttackView(**{**view.__dict__, "aggregate": mean_of}))
    assert float(np.dot(mean - unbounded, std) / np.dot(std, std)) == pytest.approx(max(attacks.SEARCH_SCALES), rel=1e-3)


def test_searched_attacks_need_the_aggregator():
    with pytest.raises(ValueError, match="aggregator"):
        attacks.ipm_searched(_adaptive_view())
