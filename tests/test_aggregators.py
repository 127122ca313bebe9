"""Robust aggregators hold their bounds against attackers within their breakdown point, and the
fixed-order arithmetic under them computes what `exact`'s docstring says, independent of input order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from locomesh.training import exact
from locomesh.training.codec import decode, decode_row, encode
from locomesh.training.aggregators import (
    AGGREGATORS,
    AggregatorError,
    aggregate,
    bucket_means,
    _squared_distances_after_step,
    canonical_order,
    sorting_network,
)

NUMEL = 70_001  # more than one slab, and not a multiple of a chunk
HONEST, BYZANTINE = 9, 4  # f < n/2, and n >= 2f + 3 for Krum
SPREAD = 0.1


def honest_rows(seed: int = 0, count: int = HONEST, numel: int = NUMEL) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    center = rng.standard_normal(numel).astype(np.float32)
    return [center + (SPREAD * rng.standard_normal(numel)).astype(np.float32) for _ in range(count)]


def huge_attackers(seed: int = 1, count: int = BYZANTINE, numel: int = NUMEL) -> list[np.ndarray]:
    """Colluding attackers, all at the same far point (the hardest case for distance filters)."""
    direction = np.random.default_rng(seed).standard_normal(numel)
    return [(1e4 * direction / np.linalg.norm(direction) * math.sqrt(numel)).astype(np.float32)] * count


def honest_mean(rows: list[np.ndarray]) -> np.ndarray:
    return np.mean(np.stack(rows).astype(np.float64), axis=0)


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b))


def radius(rows: list[np.ndarray]) -> float:
    """The largest distance of an honest contribution from the honest mean."""
    mu = honest_mean(rows)
    return max(distance(row, mu) for row in rows)


ATTACKED = {
    "mean": {},
    "coordinate_median": {},
    "trimmed_mean": {"beta": 0.35},
    "geometric_median": {},
    "krum": {"f": BYZANTINE},
    "multi_krum": {"f": BYZANTINE, "m": HONEST},
    "centered_clip": {},
}


@pytest.fixture(scope="module")
def attacked_results():
    honest = honest_rows()
    rows = honest + huge_attackers()
    return honest, {name: aggregate(name, rows, **options) for name, options in ATTACKED.items()}


def test_the_attack_is_live_against_the_mean(attacked_results):
    honest, results = attacked_results
    assert distance(results["mean"], honest_mean(honest)) > 1000 * radius(honest)


@pytest.mark.parametrize("name", ["coordinate_median", "trimmed_mean"])
def test_coordinatewise_aggregators_stay_inside_the_honest_range(attacked_results, name):
    honest, results = attacked_results
    stack = np.stack(honest)
    assert np.all(results[name] >= stack.min(axis=0)) and np.all(results[name] <= stack.max(axis=0))


def test_geometric_median_within_its_breakdown_bound(attacked_results):
    honest, results = attacked_results
    alpha = BYZANTINE / (HONEST + BYZANTINE)
    # Minsker (2015): ‖gm − μ‖ ≤ (2 − 2α)/(1 − 2α) · max_i ‖x_i − μ‖ for the exact geometric median.
    bound = (2 - 2 * alpha) / (1 - 2 * alpha) * radius(honest)
    assert distance(results["geometric_median"], honest_mean(honest)) <= bound


def test_centered_clip_stays_near_the_honest_mean(attacked_results):
    honest, results = attacked_results
    # Each attacker moves v by at most τ/n per iteration, and τ never exceeds the farthest honest
    # distance: far tighter than the geometric median's bound.
    assert distance(results["centered_clip"], honest_mean(honest)) <= radius(honest)


def test_centered_clip_from_a_previous_aggregate_stays_near_the_honest_mean():
    honest = honest_rows(3)
    previous = (honest_mean(honest) + 5 * SPREAD).astype(np.float32)  # last round's, a bit off
    result = aggregate("centered_clip", honest + huge_attackers(4), previous=previous)
    assert distance(result, honest_mean(honest)) <= radius(honest)


def test_krum_picks_an_honest_contribution(attacked_results):
    honest, results = attacked_results
    assert any(np.array_equal(results["krum"], row) for row in honest)


def test_multi_krum_averages_exactly_the_honest(attacked_results):
    honest, results = attacked_results
    expected = exact.mean_rows(canonical_order(honest))
    assert exact.params_hash(results["multi_krum"]) == exact.params_hash(expected)


def test_without_attackers_robust_aggregators_agree_with_the_mean():
    honest = honest_rows(5)
    mu = honest_mean(honest)
    for name in ("centered_clip", "geometric_median"):
        assert distance(aggregate(name, honest), mu) < 0.2 * radius(honest)


# -- order independence and determinism -----------------------------------------


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_bit_identical_under_any_input_order(name):
    rows = honest_rows(7, count=7, numel=20_000) + huge_attackers(8, count=2, numel=20_000)
    options = {"krum": {"f": 2}, "multi_krum": {"f": 2, "m": 3}}.get(name, {})
    rng = np.random.default_rng(9)
    keys = [bytes([7 * i % 11]) for i in range(len(rows))]  # the caller's keys, permuted alongside
    by_content, by_key = set(), set()
    for _ in range(3):
        order = rng.permutation(len(rows))
        by_content.add(exact.params_hash(aggregate(name, [rows[i] for i in order], **options)))
        by_key.add(exact.params_hash(aggregate(name, [rows[i] for i in order], keys=[keys[i] for i in order], **options)))
    assert len(by_content) == 1 and len(by_key) == 1


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
@pytest.mark.parametrize("bucket_size", [None, 2])
def test_quantized_rows_aggregate_to_the_bits_of_their_decoded_vectors(name, bucket_size):
    """What the outer step hands the aggregators (`QuantizedRow`s, read slab by slab) gives the
    same bits as the float32 vectors they decode to."""
    rows = honest_rows(10, count=7, numel=NUMEL) + huge_attackers(11, count=2, numel=NUMEL)
    payloads = [encode(row, "int8") for row in rows]
    quantized = [decode_row(payload, NUMEL) for payload in payloads]
    decoded = [decode(payload, NUMEL) for payload in payloads]
    options = {"krum": {"f": 1}, "multi_krum": {"f": 1, "m": 3}}.get(name, {})  # 5 buckets of 2 allow f = 1
    previous = honest_rows(12, count=1, numel=NUMEL)[0]
    keys = [bytes([i]) for i in range(len(rows))]
    hashes = {
        exact.params_hash(aggregate(name, given, keys=keys, previous=previous, bucket_size=bucket_size,
                                    bucket_seed=b"round 3", **options))
        for given in (quantized, decoded)
    }
    assert len(hashes) == 1


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_an_aggregate_written_into_out_has_the_bits_of_a_new_one(name):
    rows = honest_rows(4, count=7, numel=20_000) + huge_attackers(5, count=2, numel=20_000)
    options = {"krum": {"f": 2}, "multi_krum": {"f": 2, "m": 3}}.get(name, {})
    previous = honest_rows(6, count=1, numel=20_000)[0]
    out = np.full(20_000, np.nan, dtype=np.float32)  # stale contents must not leak into the result
    written = aggregate(name, rows, previous=previous, out=out, **options)
    assert written is out
    assert exact.params_hash(out) == exact.params_hash(aggregate(name, rows, previous=previous, **options))


def test_signed_zeros_do_not_change_sorting_results():
    plus = np.zeros(4, np.float32)
    minus = -plus
    for name in ("coordinate_median", "trimmed_mean"):
        mixed = aggregate(name, [minus, plus, minus, plus.copy() + 1], keys=[b"a", b"b", b"c", b"d"])
        flipped = aggregate(name, [plus, minus, plus, plus.copy() + 1], keys=[b"a", b"b", b"c", b"d"])
        assert mixed.tobytes() == flipped.tobytes()


def test_bucketing_is_seeded_and_still_robust():
    honest = honest_rows(10, count=12, numel=5000)
    rows = honest + huge_attackers(11, count=2, numel=5000)
    first = aggregate("centered_clip", rows, bucket_size=2, bucket_seed=b"round-1")
    again = aggregate("centered_clip", rows[::-1], bucket_size=2, bucket_seed=b"round-1")
    other = aggregate("centered_clip", rows, bucket_size=2, bucket_seed=b"round-2")
    assert first.tobytes() == again.tobytes() and first.tobytes() != other.tobytes()
    assert distance(first, honest_mean(honest)) <= radius(honest)
    assert len(bucket_means(rows, 3, b"s")) == 5  # 14 rows in buckets of 3: the last holds 2


def test_bad_calls_raise_aggregator_error():
    rows = honest_rows(12, count=4, numel=100)
    with pytest.raises(AggregatorError):
        aggregate("nope", rows)
    with pytest.raises(AggregatorError):
        aggregate("mean", rows, beta=0.1)  # an option mean does not take
    with pytest.raises(AggregatorError):
        aggregate("krum", rows, f=1)  # needs 2f + 3 = 5 contributions
    with pytest.raises(AggregatorError):
        aggregate("trimmed_mean", rows, beta=0.5)
    with pytest.raises(AggregatorError):
        aggregate("mean", rows, keys=[b"a", b"a", b"b", b"c"])
    with pytest.raises(AggregatorError):
        aggregate("mean", [rows[0], rows[1][:50].copy()])
    with pytest.raises(AggregatorError):
        aggregate("mean", [])
    with pytest.raises(AggregatorError):
        aggregate("centered_clip", rows, previous=np.full(100, np.nan, np.float32))
    with pytest.raises(ValueError):
        aggregate("mean", [rows[0].astype(np.float64)])


# -- the fixed-order arithmetic ---------------------------------------------------


def reference_fixed_sum(terms: np.ndarray) -> float:
    """`exact.fixed_sum` written out with explicit loops, straight from its specification."""
    padded = np.zeros(-(-terms.size // exact.CHUNK) * exact.CHUNK, np.float32)
    padded[: terms.size] = terms
    lanes = np.zeros(exact.LANES, np.float64)
    for chunk in padded.reshape(-1, exact.ROWS, exact.LANES):
        lane_sums = chunk[0].copy()
        for row in chunk[1:]:
            lane_sums = np.add(lane_sums, row, dtype=np.float32)
        lanes = np.add(lanes, lane_sums.astype(np.float64))
    width = exact.LANES
    while width > 1:
        width //= 2
        lanes[:width] = np.add(lanes[:width], lanes[width : 2 * width])
    return float(lanes[0])


@pytest.mark.parametrize("numel", [1, 7, exact.CHUNK, exact.CHUNK + 1, 3 * exact.SLAB + 5])
def test_fixed_sum_follows_its_specification(numel):
    rng = np.random.default_rng(numel)
    terms = (rng.standard_normal(numel) * 10.0 ** rng.uniform(-3, 3, numel)).astype(np.float32)
    assert exact.fixed_sum(terms) == reference_fixed_sum(terms)
    assert math.isclose(exact.fixed_sum(terms), math.fsum(terms.tolist()), rel_tol=1e-5, abs_tol=1e-3)


def test_slabwise_distances_equal_whole_vector_norms():
    rows = honest_rows(13, count=3, numel=2 * exact.SLAB + 123)
    center = rows[0] * np.float32(0.5)
    expected = [exact.squared_norm(np.subtract(row, center, dtype=np.float32)) for row in rows]
    assert exact.squared_distances(rows, center) == expected
    assert exact.dot(rows[1], rows[1]) == exact.squared_norm(rows[1])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11, 13, 16, 17, 33])
def test_sorting_network_sorts(n):
    """Exhaustively over 0/1 inputs where that is small (the 0-1 principle), else on random values."""
    if n <= 13:
        values = ((np.arange(1 << n)[None, :] >> np.arange(n)[:, None]) & 1).astype(np.float32)
    else:
        values = np.random.default_rng(n).standard_normal((n, 4000)).astype(np.float32)
    lines = list(values.copy())
    for low, high in sorting_network(n):
        lines[low], lines[high] = np.minimum(lines[low], lines[high]), np.maximum(lines[low], lines[high])
    assert np.array_equal(np.stack(lines), np.sort(values, axis=0))


# -- the iteration engine under CenteredClip and Weiszfeld --------------------------


def test_linear_combination_and_its_dots_follow_their_definitions():
    rows = honest_rows(14, count=4, numel=exact.SLAB + 4321)
    weights = [0.25, -1.5, 0.0, 3.0]
    expected = np.zeros(rows[0].size, np.float32)
    for row, weight in zip(rows, weights):
        if weight:
            expected = np.add(expected, np.multiply(row, np.float32(weight)), dtype=np.float32)
    combination = exact.linear_combination(rows, weights)
    assert combination.tobytes() == (expected + np.float32(0.0)).tobytes()
    dots = exact.combination_dots(rows, weights)
    assert dots == [exact.dot(row, combination) for row in rows] + [exact.squared_norm(combination)]


def test_distances_after_a_step_match_direct_distances():
    """The one-pass update ‖x_i − v'‖² = ‖x_i − v‖² − 2(⟨x_i, δ⟩ − ⟨v, δ⟩) + ‖δ‖² is accurate."""
    rows = honest_rows(15, count=5, numel=30_000) + huge_attackers(16, count=2, numel=30_000)
    center = honest_mean(rows[:5]).astype(np.float32) + np.float32(3 * SPREAD)
    points = [center, *rows]
    weights = [0.4] + [0.6 / len(rows)] * len(rows)  # v, a combination of the centre and the rows
    step = [-0.1] + [0.02 * (i + 1) for i in range(len(rows))]  # δ
    v = exact.linear_combination(points, weights)
    moved = exact.linear_combination(points, [w + s for w, s in zip(weights, step)])
    updated = _squared_distances_after_step(exact.squared_distances(rows, v), weights, step, points)
    for fast, direct in zip(updated, exact.squared_distances(rows, moved)):
        assert math.isclose(fast, direct, rel_tol=1e-4)


def test_centered_clip_stops_early_only_when_every_contribution_is_in_the_shell():
    """Honest rows are nearly equidistant from the centre: one step. Far attackers, or a cluster
    sitting on the centre (replays of last round), keep it iterating."""
    honest = honest_rows(17, count=8, numel=20_000)
    previous = (honest_mean(honest) + 2 * SPREAD).astype(np.float32)

    def steps_agree(rows, iterations, shell_ratio=1.2) -> bool:
        """Whether up to 3 steps with the shell test give the same bits as exactly `iterations` steps."""
        result = aggregate("centered_clip", rows, previous=previous, iterations=3, shell_ratio=shell_ratio)
        capped = aggregate("centered_clip", rows, previous=previous, iterations=iterations, shell_ratio=1.0)
        return result.tobytes() == capped.tobytes()

    assert steps_agree(honest, 1) and not steps_agree(honest, 3)
    assert steps_agree(honest, 3, shell_ratio=1.0)
    far = honest + huge_attackers(18, count=3, numel=20_000)
    assert steps_agree(far, 3) and not steps_agree(far, 1)
    assert distance(aggregate("centered_clip", far, previous=previous), honest_mean(honest)) <= radius(honest)
    on_centre = honest + [previous.copy() for _ in range(3)]
    assert steps_agree(on_centre, 3) and not steps_agree(on_centre, 1)
    with pytest.raises(AggregatorError):
        aggregate("centered_clip", honest, shell_ratio=0.5)
