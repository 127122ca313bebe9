"""Robust aggregators: many pseudo-gradients in, one out, the same bits on every CPU.

Every aggregator takes the contributions as flat float32 vectors already put in
a canonical order (`aggregate` does that: by the caller's keys, e.g. author
public keys, or by the SHA-256 of each vector's bytes), so arrival order never
matters, and computes only with `exact`'s rules: separate float32 ufuncs,
reductions over rows in row order, `exact.fixed_sum` for long sums, sorting
networks of elementwise min/max after -0.0 is made +0.0. Work is done slab by slab along the coordinate axis
(`exact.SLAB` coordinates of every contribution at a time) so that no temporary
is the size of all contributions.

Breakdown points (the largest fraction f/n of arbitrary contributions an
aggregator survives with a bounded error): mean 0; coordinate median and
trimmed mean(β) 1/2 and β per coordinate; geometric median 1/2; Krum needs
n ≥ 2f + 3; CenteredClip < 1/2 (see `centered_clip`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np

from . import exact
from .codec import QuantizedRow
from .exact import F32

Rows = Sequence[np.ndarray | QuantizedRow]  # read by slices: [start:stop] gives float32 values


class AggregatorError(ValueError):
    """Contributions or options that an aggregator cannot work with (a configuration error)."""


def mean(rows: Rows, *, previous: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """The plain average: breakdown point 0 (one contribution can move it anywhere)."""
    return exact.mean_rows(rows, out=out)


def coordinate_median(rows: Rows, *, previous: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Per coordinate, the median (the mean of the two middle values when n is even)."""
    k = len(rows)

    def middle(ordered: list[np.ndarray], out: np.ndarray) -> None:
        if k % 2:
            out[:] = ordered[k // 2]
            return
        # a/2 + b/2 rather than (a + b)/2: no overflow for values near the float32 limit.
        np.multiply(ordered[k // 2 - 1], F32(0.5), out=out)
        np.add(out, np.multiply(ordered[k // 2], F32(0.5), dtype=F32), out=out)

    return _per_coordinate_sorted(rows, middle, out)


def trimmed_mean(
    rows: Rows, *, previous: np.ndarray | None = None, beta: float = 0.1, out: np.ndarray | None = None
) -> np.ndarray:
    """Per coordinate, drop the floor(β·n) largest and smallest values and average the rest."""
    k = len(rows)
    if not 0.0 <= beta < 0.5:
        raise AggregatorError(f"trimmed_mean needs 0 <= beta < 0.5, got {beta}")
    cut = math.floor(beta * k)
    kept = k - 2 * cut

    def average_middle(ordered: list[np.ndarray], out: np.ndarray) -> None:
        np.add(ordered[cut], F32(0.0), out=out)
        for row in ordered[cut + 1 : k - cut]:
            np.add(out, row, out=out)
        np.divide(out, F32(kept), out=out)

    return _per_coordinate_sorted(rows, average_middle, out)


def geometric_median(
    rows: Rows,
    *,
    previous: np.ndarray | None = None,
    iterations: int = 8,
    eps: float = 1e-12,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Smoothed Weiszfeld (Pillutla et al., RFA) from the coordinate median, a fixed number of steps.

    v ← Σ w_i x_i / Σ w_i with w_i = 1 / max(eps, ‖x_i − v‖). Starting from the
    coordinate median (breakdown 1/2) instead of the mean matters: from the mean,
    far-away attackers are pulled back only geometrically slowly.
    """
    if iterations < 1 or not eps > 0:
        raise AggregatorError("geometric_median needs iterations >= 1 and eps > 0")

    def weiszfeld_coefficients(distances: list[float]) -> list[float]:
        weights = [1.0 / max(eps, d) for d in distances]
        total = math.fsum(weights)
        return [w / total for w in weights]

    return _weighted_steps(rows, coordinate_median(rows), weiszfeld_coefficients, iterations, out=out)


def centered_clip(
    rows: Rows,
    *,
    previous: np.ndarray | None = None,
    tau: float | None = None,
    iterations: int = 5,
    shell_ratio: float = 1.05,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """CenteredClip (Karimireddy, He & Jaggi 2021): v ← v + mean_i clip(x_i − v, τ), up to `iterations` times.

    Centre: the previous round's aggregate when there is one (honest
    pseudo-gradients change slowly from round to round), else the coordinate
    median.

    Radius: `tau` if given; otherwise, recomputed at every iteration, the lower
    median of the n distances ‖x_i − v‖ (the ⌈n/2⌉-th smallest). Why: with
    f ≤ (n−1)/2 attackers at least one honest distance is at or above it, so τ
    never exceeds the farthest honest contribution, whatever the attackers send;
    each attacker then moves v by at most τ/n per iteration. Recomputing it at
    each step lets τ shrink as v settles into the honest cluster. Breakdown
    point: just under 1/2.

    Early stop: a step taken from a centre that has every contribution in the
    shell τ/ρ ≤ ‖x_i − v‖ ≤ ρ·τ (ρ = `shell_ratio`) is the last one. Every clip
    factor is then at least 1/ρ, so the step is within a few percent of the
    unclipped mean step, and there is nothing for further steps to push away:
    no outlier beyond ρτ, and no cluster sitting on the centre within τ/ρ (a
    stale or replayed update sits near the previous aggregate). Honest
    contributions lie at nearly equal distances from any centre, the more so
    the larger the model, because their independent noise dominates: for
    millions of Gaussian coordinates so nearly that attack-free rounds of large
    models cost one step; on the small model of bench/byzantine.py far less so,
    and most rounds run all `iterations`. A larger ρ stops more often and gives
    up robustness against colluders hiding among the honest: identical replays
    that sit just inside a wider shell end the clipping early (docs/measurements.md).
    The test reads the exact distances, so every peer stops at the
    same step; `shell_ratio` 1 stops only when all distances are equal.
    """
    if iterations < 1:
        raise AggregatorError("centered_clip needs iterations >= 1")
    if tau is not None and not (math.isfinite(tau) and tau > 0):
        raise AggregatorError(f"centered_clip needs a finite tau > 0, got {tau}")
    if not (math.isfinite(shell_ratio) and shell_ratio >= 1):
        raise AggregatorError(f"centered_clip needs a finite shell_ratio >= 1, got {shell_ratio}")
    k = len(rows)

    def radius(distances: list[float]) -> float:
        return tau if tau is not None else sorted(distances)[(k - 1) // 2]

    def clip_coefficients(distances: list[float]) -> list[float]:
        r = radius(distances)
        return [(1.0 if d <= r else r / d) / k for d in distances]

    def in_shell(distances: list[float]) -> bool:
        r = radius(distances)
        return r <= shell_ratio * min(distances) and max(distances) <= shell_ratio * r

    center = coordinate_median(rows) if previous is None else _checked_previous(previous, rows[0].size)
    return _weighted_steps(rows, center, clip_coefficients, iterations, last_step=in_shell, out=out)


def multi_krum(
    rows: Rows, *, previous: np.ndarray | None = None, f: int, m: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Multi-Krum (Blanchard et al. 2017): average the m contributions with the lowest Krum scores.

    A score is the sum of a contribution's n − f − 2 smallest squared distances
    to the others. Needs n ≥ 2f + 3. Ties go to the earlier contribution in the
    canonical order.
    """
    k = len(rows)
    if f < 0 or k < 2 * f + 3:
        raise AggregatorError(f"krum with f={f} needs at least {2 * f + 3} contributions, got {k}")
    if not 1 <= m <= k - f:
        raise AggregatorError(f"multi_krum needs 1 <= m <= n - f = {k - f}, got m={m}")
    distances = _pairwise_squared_distances(rows)
    scores = []
    for i in range(k):
        nearest = sorted(distances[i][j] for j in range(k) if j != i)[: k - f - 2]
        scores.append(math.fsum(nearest))
    chosen = sorted(sorted(range(k), key=lambda i: (scores[i], i))[:m])
    return exact.mean_rows([rows[i] for i in chosen], out=out)


def krum(rows: Rows, *, previous: np.ndarray | None = None, f: int, out: np.ndarray | None = None) -> np.ndarray:
    """Krum: the one contribution with the lowest score (multi-Krum with m = 1)."""
    return multi_krum(rows, f=f, m=1, out=out)


Aggregator = Callable[..., np.ndarray]

AGGREGATORS: dict[str, Aggregator] = {
    "mean": mean,
    "coordinate_median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "geometric_median": geometric_median,
    "krum": krum,
    "multi_krum": multi_krum,
    "centered_clip": centered_clip,
}


def aggregate(
    name: str,
    contributions: Rows,
    *,
    keys: Sequence[bytes] | None = None,
    previous: np.ndarray | None = None,
    bucket_size: int | None = None,
    bucket_seed: bytes = b"",
    out: np.ndarray | None = None,
    **options,
) -> np.ndarray:
    """Aggregate `contributions` with the aggregator `name`; the result does not depend on their order.

    Contributions are first sorted by `keys` (distinct bytes, one per
    contribution, e.g. author public keys) or, without keys, by the SHA-256 of
    their bytes. With `bucket_size` s > 1 they are then shuffled by `bucket_seed`
    (the round's shared randomness), averaged in buckets of s (Karimireddy et al.
    2022), and the bucket means are aggregated. Returns a new float32 vector, or
    `out` (a float32 vector of the contributions' size that is none of them, nor
    `previous`) filled with it.
    """
    function = AGGREGATORS.get(name)
    if function is None:
        raise AggregatorError(f"unknown aggregator {name!r}; known: {sorted(AGGREGATORS)}")
    _check_options(name, function, options)
    rows = canonical_order(contributions, keys)
    if bucket_size is not None and bucket_size > 1:
        rows = bucket_means(rows, bucket_size, bucket_seed)
    return function(rows, previous=previous, out=out, **options)


def canonical_order(contributions: Rows, keys: Sequence[bytes] | None = None) -> list[np.ndarray]:
    """The contributions sorted by their keys (or content hashes), after checking their shapes."""
    if not contributions:
        raise AggregatorError("no contributions to aggregate")
    numel = _row_size(contributions[0])
    for row in contributions:
        if _row_size(row) != numel:
            raise AggregatorError("contributions differ in size")
    if keys is None:
        # Equal contents get equal keys, and then their relative order cannot matter.
        keys = [exact.content_key(row) for row in contributions]
    elif len(keys) != len(contributions) or len(set(keys)) != len(keys):
        raise AggregatorError("need exactly one distinct key per contribution")
    order = sorted(range(len(contributions)), key=lambda i: keys[i])
    return [contributions[i] for i in order]


def _row_size(row: np.ndarray | QuantizedRow) -> int:
    """The length of a contribution: a 1-D C-contiguous float32 vector, or a `QuantizedRow`
    (read slab by slab like one); ValueError for anything else."""
    return row.size if isinstance(row, QuantizedRow) else exact.as_flat_f32(row, what="a contribution").size


def bucket_means(rows: Rows, size: int, seed: bytes) -> list[np.ndarray]:
    """Shuffle rows by SHA-256(seed ‖ index) and average consecutive buckets of `size` (the last may be smaller)."""
    shuffle = sorted(range(len(rows)), key=lambda i: hashlib.sha256(bytes(seed) + i.to_bytes(4, "big")).digest())
    shuffled = [rows[i] for i in shuffle]
    return [exact.mean_rows(shuffled[start : start + size]) for start in range(0, len(shuffled), size)]


# -- building blocks ---------------------------------------------------------


def _per_coordinate_sorted(
    rows: Rows, reduce_sorted: Callable[[list[np.ndarray], np.ndarray], None], out: np.ndarray | None = None
) -> np.ndarray:
    """Sort every coordinate's n values (slab by slab) and let `reduce_sorted(sorted_rows, out)` pick from them.

    The sort is a sorting network (`sorting_network`): a fixed list of
    compare-exchanges, each an elementwise minimum and maximum of two rows, so it
    runs at SIMD speed across coordinates and is exact. Values are made
    canonical zeros first: then equal values are equal bits, and it cannot
    matter which of two equal values a minimum returns.
    """
    k, numel = len(rows), rows[0].size
    out = np.empty(numel, dtype=F32) if out is None else out
    block = np.empty((k + 1, exact.SLAB), dtype=F32)
    network = sorting_network(k)
    for start, stop in exact.slabs(numel):
        lines = [block[i, : stop - start] for i in range(k + 1)]
        for line, row in zip(lines, rows):
            exact.canonical_zeros(exact.read_slab(row, start, stop, line), out=line)
        ordered, spare = lines[:k], lines[k]
        for low, high in network:
            np.minimum(ordered[low], ordered[high], out=spare)
            np.maximum(ordered[low], ordered[high], out=ordered[high])
            ordered[low], spare = spare, ordered[low]
        reduce_sorted(ordered, out[start:stop])
    return out


@functools.cache
def sorting_network(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort for n inputs: compare-exchange pairs (low, high), in order.

    Built for the next power of two; pairs that touch a position ≥ n are left
    out, which is the same as padding with +∞ (a +∞ never moves down). About
    n·log²(n)/4 pairs: 63 for n = 16.
    """
    size = 1 << max(0, (n - 1).bit_length())
    pairs = []
    merged = 1
    while merged < size:
        stride = merged
        while stride >= 1:
            for first in range(stride % merged, size - stride, 2 * stride):
                for i in range(min(stride, size - first - stride)):
                    low, high = first + i, first + i + stride
                    if low // (2 * merged) == high // (2 * merged) and high < n:
                        pairs.append((low, high))
            stride //= 2
        merged *= 2
    return tuple(pairs)


def _weighted_steps(
    rows: Rows,
    center: np.ndarray,
    coefficients: Callable[[list[float]], list[float]],
    iterations: int,
    last_step: Callable[[list[float]], bool] = lambda distances: False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Iterate v ← v + Σ_i a_i (x_i − v), with a = coefficients(‖x_i − v‖ for all i); return the last v.

    At most `iterations` steps; a step whose distances make `last_step` true is the last.

    Both CenteredClip (a_i = clip factor / n) and Weiszfeld (a_i = w_i / Σ w)
    have this form, so every iterate is a linear combination of the centre and
    the contributions: v = w_c·c + Σ_i w_i x_i. Only the coefficients w are
    iterated; v itself is built once, at the end (`exact.linear_combination`).

    The distances come from one pass per step instead of two: with the step
    δ = v' − v (itself a combination of c and the x_i),
        ‖x_i − v'‖² = ‖x_i − v‖² − 2(⟨x_i, δ⟩ − ⟨v, δ⟩) + ‖δ‖²,
    and ⟨v, δ⟩ = w_c⟨c, δ⟩ + Σ_j w_j⟨x_j, δ⟩, so one pass computing ⟨·, δ⟩ for
    c and every x_i (`exact.combination_dots`) gives all n new distances.
    The price is cancellation: each dot is exact to about 1e-6·‖x_i‖‖δ‖
    (fixed_sum), and so is a new squared distance, which is negligible unless
    the contributions agree to about five digits (‖x_i‖ ≳ 1e5·‖x_i − v‖). The
    result is a deterministic function of the inputs either way.
    Passes over the contributions: 1 (distances to c) + 1 per further step +
    1 (building v).
    """
    points = [center, *rows]
    weights = [1.0] + [0.0] * len(rows)  # v = c
    squared = exact.squared_distances(rows, center)
    for iteration in range(iterations):
        distances = [math.sqrt(d) for d in squared]
        a = coefficients(distances)
        moved = math.fsum(a)
        step = [-moved * weights[0]] + [a_i - moved * w_i for a_i, w_i in zip(a, weights[1:])]  # δ's coefficients
        weights_before, weights = weights, [w + s for w, s in zip(weights, step)]
        if iteration == iterations - 1 or last_step(distances):
            break
        squared = _squared_distances_after_step(squared, weights_before, step, points)
    return exact.linear_combination(points, weights, out=out)


def _squared_distances_after_step(
    squared: list[float], weights: list[float], step: list[float], points: list[np.ndarray]
) -> list[float]:
    """‖x_i − (v + δ)‖² from ‖x_i − v‖², with v = Σ weights·points and δ = Σ step·points (points[0] = c)."""
    *point_dots, step_squared = exact.combination_dots(points, step)
    v_dot = math.fsum(w * d for w, d in zip(weights, point_dots))  # ⟨v, δ⟩
    # max(0, ·): the identity is exact, its rounded terms are not; a distance is never negative.
    return [max(0.0, s - 2.0 * (d - v_dot) + step_squared) for s, d in zip(squared, point_dots[1:])]


def _pairwise_squared_distances(rows: Rows) -> list[list[float]]:
    k = len(rows)
    table = [[0.0] * k for _ in range(k)]
    for i in range(k - 1):
        for j, d in zip(range(i + 1, k), exact.squared_distances(rows[i + 1 :], rows[i])):
            table[i][j] = table[j][i] = d
    return table


def _checked_previous(previous: np.ndarray, numel: int) -> np.ndarray:
    previous = exact.as_flat_f32(previous, what="the previous aggregate")
    if previous.size != numel or not np.isfinite(previous).all():
        raise AggregatorError("the previous aggregate must be finite and the size of the contributions")
    return previous


def _check_options(name: str, function: Aggregator, options: dict) -> None:
    accepted = set(inspect.signature(function).parameters) - {"rows", "previous", "out"}
    unknown = set(options) - accepted
    if unknown:
        raise AggregatorError(f"{name} takes no option(s) {sorted(unknown)}; it takes {sorted(accepted)}")
