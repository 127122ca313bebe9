"""Byzantine workers: what a malicious peer sends in place of an honest pseudo-gradient.

The threat model is the strongest one, an omniscient adversary: it sees every honest Δ of the
round before choosing its own, and it may collude (all attackers send the same thing). An attack is
a function of an `AttackView` returning either a Δ (which the attacker then encodes with the
run's codec, so it is a well-formed payload) or raw payload bytes (for attacks on the decoder).

| attack         | sends                                                                         |
|----------------|-------------------------------------------------------------------------------|
| sign_flip      | −1 × the honest mean (stands in for the attacker's own honest update)         |
| sign_flip_x100 | −100 × the honest mean                                                        |
| gaussian       | pure noise, N(0, σ²) per coordinate, σ = 10 × the honest coordinates' RMS     |
| alie           | μ − z·σ per coordinate ("A Little Is Enough", Baruch et al. 2019), z = z_max |
| ipm            | −ε × the honest mean (inner product manipulation, Xie et al. 2019), ε = 0.5   |
| nan, inf       | a payload whose values are NaN / +Inf: the decoder must reject it             |
| zero           | an all-zero Δ (a free rider that trains nothing)                              |
| replay         | an honest payload from an earlier round, resent unchanged                     |
| inside_*       | the centre + a·τ·u: inside CenteredClip's radius τ around its centre, along one |
|                | direction u for the whole run (`inside_radius`; Ozfatura et al. 2023)         |
| min_max        | μ + γ·p, the largest γ whose farthest honest distance is within the honest    |
|                | diameter (Shejwalkar & Houmansadr 2021), p = −μ/‖μ‖                           |
| min_sum        | μ + γ·p, the largest γ whose summed squared distances stay within the honest  |
|                | worst's (the same paper)                                                      |
| mimic          | a copy of the honest Δ farthest along the honest spread's top direction       |
|                | (Karimireddy, He & Jaggi 2022)                                                |
| alie_opt       | ALIE with z searched every round against the aggregator under test            |
| ipm_opt        | IPM with ε searched every round against the aggregator under test             |

ALIE at the paper's z_max is built to hide inside the honest spread, and it only bites when that
spread, summed over many steps, matters: it moves the plain mean by (f/n)·z_max·σ per coordinate,
which is 0, 0.08σ and 0.25σ at (n, f) = (8, 1), (8, 2), (9, 3), less than the noise σ/√(n−f) ≈
0.4σ of the honest mean itself. `alie(z)` takes any z ≥ 0 so that an omniscient adversary can also
choose the z that hurts the aggregator under test most (the "optimized attack" practice: ByzFL's
ALIE has an attack factor τ and an optimal variant that line-searches it against the aggregator,
as used by Allouah et al. 2023, "Fixing by Mixing"). bench/byzantine.py runs z_max and a grid of
larger z and reports, per aggregator, the worst one. A large z leaves the "hide in the spread"
regime: the attackers then sit z·‖σ‖ away from the honest mean, along −σ, and rely on the
aggregator not bounding their pull.

The adaptive attacks know the aggregator as well as the run does: its centre (`AttackView.previous`,
the previous round's aggregate, on which CenteredClip centres) and the aggregator itself
(`AttackView.aggregate`, with the run's options), which the searched ones (`alie_opt`, `ipm_opt`,
`inside_*_opt`) call on candidate rounds to pick, every round, the scale that moves the result most
from the honest mean (ByzFL's "optimal" attacks, Allouah et al. 2023). Colluders compute the same
vector: attacks that keep a direction draw it from a fixed seed, not from the shared `rng`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class AttackView:
    """What the omniscient adversary knows when it picks its round-`round_index` contribution."""

    round_index: int
    honest_deltas: Sequence[np.ndarray]  # this round's honest Δs, float32, in worker order
    past_honest_payloads: Sequence[Sequence[bytes]]  # [round][worker] payloads of earlier rounds
    workers: int  # N, honest and Byzantine together
    byzantine: int  # f
    rng: np.random.Generator
    encode_non_finite: Callable[[float, int], bytes]  # (value, numel) -> a payload full of `value`
    previous: np.ndarray | None = None  # the previous round's aggregate: CenteredClip's centre
    # The run's aggregator (its options and centre included) applied to float32 rows: what the
    # searched attacks try their candidates on. None where the attacker cannot run it.
    aggregate: Callable[..., np.ndarray] | None = None  # (rows, center=None) -> the aggregate
    # With the run's `peer_momentum` (training/outer.py): μ, and the run's momentum m before this round.
    peer_momentum: float | None = None
    momentum: np.ndarray | None = None
    # With contribution scoring (training/scoring.py): the run's policy, and the attacker's estimate of
    # the scores of any Δs (on batches of its own: the round's are drawn after it commits).
    scoring: Any = None  # a scoring.ScoringConfig
    estimate_scores: Callable[[list[np.ndarray]], list[float]] | None = None
    # With the "reputation" policy: the colluders' own relative scores of their last scored rounds.
    reputation: Sequence[float] | None = None


Attack = Callable[[AttackView], "np.ndarray | bytes"]


class AttackNotApplicable(ValueError):
    """The attack needs knowledge this run does not offer (e.g. evading scores in a run without scoring)."""


def _stack(view: AttackView) -> np.ndarray:
    return np.stack([np.asarray(delta, dtype=np.float64) for delta in view.honest_deltas])


def _honest_mean(view: AttackView) -> np.ndarray:
    return _stack(view).mean(axis=0)


def sign_flip(scale: float = 1.0) -> Attack:
    """−scale × the honest mean."""

    def attack(view: AttackView) -> np.ndarray:
        return (-scale * _honest_mean(view)).astype(np.float32)

    return attack


def gaussian(relative_sigma: float = 10.0) -> Attack:
    """Zero-mean noise whose per-coordinate σ is `relative_sigma` × the RMS of honest coordinates."""

    def attack(view: AttackView) -> np.ndarray:
        rms = float(np.sqrt(np.mean(_stack(view) ** 2)))
        size = view.honest_deltas[0].size
        return view.rng.normal(0.0, relative_sigma * rms, size=size).astype(np.float32)

    return attack


def alie_z(workers: int, byzantine: int) -> float:
    """Baruch et al.'s z_max: the largest shift that still leaves the attackers looking like the
    majority's side of the honest spread: s = floor(n/2 + 1) − f, z = Φ⁻¹((n − s) / n)."""
    supporters = workers // 2 + 1 - byzantine
    if not 0 < byzantine < workers or supporters < 1:
        raise ValueError(f"ALIE's z_max needs 0 < f ≤ n/2, got n={workers}, f={byzantine}")
    return statistics.NormalDist().inv_cdf((workers - supporters) / workers)


def alie(z: float | None = None) -> Attack:
    """μ − z·σ per coordinate, every round, from this round's honest Δs; `z` None uses the paper's
    z_max for this (n, f) (`alie_z`), a number (≥ 0, finite) is the omniscient attacker's choice.

    As in Baruch et al. 2019 (Algorithm 1) and the reference implementation of Karimireddy et al.
    (epfml/byzantine-robust-noniid-optimizer): μ and σ are the per-coordinate mean and sample
    standard deviation (ddof 1) of the honest updates, and every attacker sends the same vector.
    z_max is the paper's; that implementation counts only honest workers, Φ⁻¹((n−f−s)/(n−f)),
    which is smaller (0 at (8, 2)).
    At z_max the attack is built to hide inside the honest spread, not to be large: z_max is 0 for
    (n, f) = (8, 1), 0.32 for (8, 2) and 0.76 for (9, 3), and it moves the plain mean by
    (f/n)·z·σ per coordinate. Needs at least two honest Δs (σ of one is undefined).
    """
    if z is not None and not (math.isfinite(z) and z >= 0):
        raise ValueError(f"ALIE needs a finite z >= 0, got {z}")

    def attack(view: AttackView) -> np.ndarray:
        if len(view.honest_deltas) < 2:
            raise ValueError("ALIE needs at least two honest Δs to estimate their spread")
        stack = _stack(view)
        shift = alie_z(view.workers, view.byzantine) if z is None else z
        return (stack.mean(axis=0) - shift * stack.std(axis=0, ddof=1)).astype(np.float32)

    return attack


def ipm(epsilon: float = 0.5) -> Attack:
    """−ε × the honest mean: small enough to pass distance-based filters, aimed against descent."""
    return sign_flip(epsilon)


def non_finite(value: float) -> Attack:
    """A payload whose values are all `value` (NaN or ±Inf), made by the codec's own layout."""

    def attack(view: AttackView) -> bytes:
        return view.encode_non_finite(value, view.honest_deltas[0].size)

    return attack


def zero(view: AttackView) -> np.ndarray:
    """A free rider: claims to have trained, sends nothing useful."""
    return np.zeros(view.honest_deltas[0].size, dtype=np.float32)


def replay(age: int = 1) -> Attack:
    """Resend an honest payload from `age` rounds ago (the first honest worker's); a zero Δ while
    there is no such round yet."""

    def attack(view: AttackView) -> np.ndarray | bytes:
        if len(view.past_honest_payloads) < age:
            return zero(view)
        return view.past_honest_payloads[-age][0]

    return attack


def _center(view: AttackView) -> np.ndarray:
    """CenteredClip's centre as the attacker knows it: the previous aggregate, else (the first
    round) the honest coordinate median, which is where the aggregator starts then."""
    if view.previous is not None:
        return np.asarray(view.previous, dtype=np.float64)
    return np.median(_stack(view), axis=0)


def _radius(view: AttackView, center: np.ndarray) -> float:
    """CenteredClip's radius τ (the lower median of all n distances to the centre) when the f
    attackers sit inside it: they count as the smallest distances."""
    distances = sorted([0.0] * view.byzantine + [float(np.linalg.norm(x - center)) for x in _stack(view)])
    return distances[(view.workers - 1) // 2]


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def _fixed_direction(numel: int, seed: int) -> np.ndarray:
    """A unit vector drawn from `seed` alone, so that every colluder holds the same one."""
    return _unit(np.random.default_rng([seed, numel]).standard_normal(numel))


DIRECTIONS = ("random", "against", "orthogonal")


def _direction(view: AttackView, kind: str, seed: int) -> np.ndarray:
    """The unit direction an inside-the-radius attacker pushes along this round.

    random: one fixed random direction for the whole run. against: −(honest mean). orthogonal: the
    fixed random direction with its component along the honest mean removed, so the push neither
    helps nor visibly opposes descent (Ozfatura et al.'s relocated orthogonal perturbation)."""
    mean = _honest_mean(view)
    if kind == "against":
        return _unit(-mean)
    fixed = _fixed_direction(mean.size, seed)
    if kind == "random":
        return fixed
    along = _unit(mean)
    return _unit(fixed - float(np.dot(fixed, along)) * along)


def _searched(view: AttackView, candidate: Callable[[float], np.ndarray], scales: Sequence[float],
              harm: Callable[[np.ndarray], float]) -> np.ndarray:
    """The candidate whose round (honest Δs and f copies of it, through the run's aggregator) has the
    largest `harm`; ties go to the smaller scale."""
    if view.aggregate is None:
        raise AttackNotApplicable("a searched attack needs the run's aggregator (AttackView.aggregate)")
    honest = [np.asarray(delta, dtype=np.float32) for delta in view.honest_deltas]
    best, best_harm = None, -math.inf
    for scale in scales:
        sent = candidate(scale).astype(np.float32)
        result = np.asarray(view.aggregate([*honest, *[sent] * view.byzantine]), dtype=np.float64)
        score = harm(result) if np.isfinite(result).all() else -math.inf
        if score > best_harm:
            best, best_harm = sent, score
    assert best is not None, "no scales to search"
    return best


SEARCH_SCALES = tuple(0.25 * 1.5**k for k in range(17))  # 0.25 ... 164, ×1.5 apart
INSIDE_FRACTIONS = tuple(k / 8 for k in range(1, 17))  # 0.125 ... 2: inside the radius and out to 2τ


def inside_radius(fraction: float | None = 0.9, direction: str = "random", seed: int = 0) -> Attack:
    """The centre + fraction·τ·u: never clipped (fraction < 1), and held along one direction u
    (`DIRECTIONS`) so that its pull adds up through the outer momentum. `fraction` None searches
    it every round (`INSIDE_FRACTIONS`) for the largest pull along u through the aggregator.

    Against a run with `peer_momentum` it places its momentum instead: it tracks every honest
    author's momentum and its own (it sees every Δ), puts its own at the momentum aggregate's
    centre + fraction·τ_M·u, and sends the Δ that gets it there."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction is one of {DIRECTIONS}, got {direction!r}")
    if fraction is not None and not (math.isfinite(fraction) and fraction >= 0):
        raise ValueError(f"inside_radius needs a finite fraction >= 0, got {fraction}")
    tracked = _MomentumTracker()

    def attack(view: AttackView) -> np.ndarray:
        u = _direction(view, direction, seed)
        mean = _honest_mean(view)
        if view.peer_momentum is not None:
            return tracked.inside(view, u, fraction)
        center = _center(view)
        tau = _radius(view, center)
        if fraction is not None:
            return (center + fraction * tau * u).astype(np.float32)
        return _searched(view, lambda a: center + a * tau * u, INSIDE_FRACTIONS,
                         harm=lambda result: float(np.dot(result - mean, u)))

    return attack


class _MomentumTracker:
    """An omniscient attacker's copy of a `peer_momentum` run's per-author momenta: the honest
    authors' (from their Δs, in worker order) and its own (from what it sent)."""

    def __init__(self) -> None:
        self.round: int | None = None
        self.honest: list[np.ndarray] = []
        self.own: np.ndarray | None = None  # our momentum after the last round
        self.pending_own: np.ndarray | None = None  # ... after this one

    def inside(self, view: AttackView, u: np.ndarray, fraction: float | None) -> np.ndarray:
        if self.round != view.round_index:  # a tracker several colluders share advances once a round
            self._advance(view)
        mu = float(view.peer_momentum)
        run_momentum = np.asarray(view.momentum, dtype=np.float64)
        honest_aggregate = np.asarray(view.aggregate(list(view.honest_deltas)), dtype=np.float64)
        center = mu * run_momentum + honest_aggregate
        distances = sorted([0.0] * view.byzantine + [float(np.linalg.norm(m - center)) for m in self.honest])
        tau = distances[(view.workers - 1) // 2]
        own_before = run_momentum if self.own is None else self.own

        def placed(a: float) -> np.ndarray:
            return center + a * tau * u

        if fraction is None:
            honest_rows = [m.astype(np.float32) for m in self.honest]
            rows = lambda a: [*honest_rows, *[placed(a).astype(np.float32)] * view.byzantine]  # noqa: E731
            fraction = max(INSIDE_FRACTIONS, key=lambda a: float(np.dot(
                np.asarray(view.aggregate(rows(a), center=center.astype(np.float32)), dtype=np.float64) - center, u)))
        target = placed(fraction)
        self.pending_own = target
        return (target - mu * own_before).astype(np.float32)

    def _advance(self, view: AttackView) -> None:
        """Fold last round's Δs into the momenta (a new honest author starts from the run's m)."""
        mu = float(view.peer_momentum)
        run_momentum = np.asarray(view.momentum, dtype=np.float64)
        deltas = [np.asarray(d, dtype=np.float64) for d in view.honest_deltas]
        previous = self.honest + [run_momentum] * (len(deltas) - len(self.honest))
        self.honest = [mu * m + d for m, d in zip(previous, deltas)]
        self.own = self.pending_own
        self.round = view.round_index


def evading_scores(direction: str = "random", seed: int = 0) -> Attack:
    """The honest mean + a·τ·u along a held direction u, with a as large as the run's scoring lets
    through: every candidate fraction (`INSIDE_FRACTIONS`) whose estimated score clears the
    estimated bar (the honest estimates and f copies of it, `scoring.bar`) is tried through the
    aggregator, and the one that pulls most along u is sent; the honest mean if none clears it.
    Against the "weight" policy every candidate is tried with every contribution shrunk by its
    estimated weight, the attacker's own included (`_evading_weights`)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction is one of {DIRECTIONS}, got {direction!r}")

    def attack(view: AttackView) -> np.ndarray:
        if view.estimate_scores is None or view.scoring is None:
            raise AttackNotApplicable("evading the scores needs the run's scoring (AttackView.scoring, estimate_scores)")
        from .scoring import bar  # scoring imports torch; the other attacks need numpy only

        mean, u = _honest_mean(view), _direction(view, direction, seed)
        tau = _radius(view, _center(view))
        candidates = [mean + a * tau * u for a in INSIDE_FRACTIONS]
        estimates = view.estimate_scores([*view.honest_deltas, *[c.astype(np.float32) for c in candidates]])
        honest = estimates[: len(view.honest_deltas)]
        if view.scoring.policy == "weight":
            return _evading_weights(view, candidates, honest, estimates[len(honest):], mean, u)
        if view.scoring.policy == "reputation":
            return _evading_reputation(view, candidates, honest, estimates[len(honest):], mean, u, tau)
        passing = [a for a, score in zip(INSIDE_FRACTIONS, estimates[len(honest):])
                   if score >= bar(dict(enumerate(honest + [score] * view.byzantine)), view.scoring.keep_ratio)]
        if not passing:
            return mean.astype(np.float32)
        return _searched(view, lambda a: mean + a * tau * u, passing,
                         harm=lambda result: float(np.dot(result - mean, u)))

    return attack


def _evading_reputation(view: AttackView, candidates: list[np.ndarray], honest: list[float], estimated: list[float],
                        mean: np.ndarray, u: np.ndarray, tau: float) -> np.ndarray:
    """Against the "reputation" policy: while its average is under the bar, the honest mean (it is
    left out anyway, and the mean scores best: it buys the average back); while it is in, the
    candidate that pulls most along u among those whose estimated relative score keeps its average
    over the last rounds at the bar, so it stays in next round."""
    from .scoring import average, relative

    config, past = view.scoring, list(view.reputation or [])
    if past and average(past) < config.keep_ratio:
        return mean.astype(np.float32)
    kept = past[-(config.history - 1):] if config.history > 1 else []
    passing = []
    for a, score in zip(INSIDE_FRACTIONS, estimated):
        own = relative(dict(enumerate(honest + [score] * view.byzantine))).get(len(honest), -math.inf)
        if average([*kept, own]) >= config.keep_ratio:
            passing.append(a)
    if not passing:
        return mean.astype(np.float32)
    return _searched(view, lambda a: mean + a * tau * u, passing, harm=lambda result: float(np.dot(result - mean, u)))


def _evading_weights(view: AttackView, candidates: list[np.ndarray], honest: list[float], estimated: list[float],
                     mean: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Against the "weight" policy: the candidate whose round, every contribution shrunk by its
    estimated weight (`scoring.weights`, `scoring.shrunk`), pulls most along u."""
    from .scoring import shrunk, weights

    center = None if view.previous is None else np.asarray(view.previous, dtype=np.float32)
    best, best_pull = mean.astype(np.float32), -math.inf
    for candidate, score in zip(candidates, estimated):
        weight = weights(dict(enumerate(honest + [score] * view.byzantine)))
        rows = [shrunk(np.asarray(d, np.float32), center, weight[i]) for i, d in enumerate(view.honest_deltas)]
        sent = candidate.astype(np.float32)
        rows += [shrunk(sent, center, weight[len(honest)])] * view.byzantine
        pull = float(np.dot(np.asarray(view.aggregate(rows), dtype=np.float64) - mean, u))
        if pull > best_pull:
            best, best_pull = sent, pull
    return best


def _min_max_gamma(stack: np.ndarray, mean: np.ndarray, p: np.ndarray) -> float:
    """The largest γ with max_i ‖μ + γp − x_i‖ ≤ the honest diameter max_ij ‖x_i − x_j‖.

    Per honest x_i, ‖a + γp‖² = D² (a = μ − x_i) is a quadratic in γ; its larger root bounds γ,
    and the smallest of those bounds is the answer (≥ 0: γ = 0 is the mean, within the diameter)."""
    diameter2 = max(float(np.sum((x - y) ** 2)) for x in stack for y in stack)
    pp = float(np.dot(p, p))
    roots = []
    for x in stack:
        a = mean - x
        ap = float(np.dot(a, p))
        roots.append((-ap + math.sqrt(max(0.0, ap * ap - pp * (float(np.dot(a, a)) - diameter2)))) / pp)
    return min(roots)


def _min_sum_gamma(stack: np.ndarray, mean: np.ndarray, p: np.ndarray) -> float:
    """The largest γ with Σ_i ‖μ + γp − x_i‖² ≤ max_i Σ_j ‖x_i − x_j‖².

    Σ_i (μ − x_i) = 0, so the left side is Σ_i ‖μ − x_i‖² + n·γ²‖p‖²: γ in closed form."""
    sums = [float(np.sum((stack - x) ** 2)) for x in stack]
    spread = float(np.sum((stack - mean) ** 2))
    return math.sqrt(max(0.0, max(sums) - spread) / (len(stack) * float(np.dot(p, p))))


def min_max(view: AttackView) -> np.ndarray:
    """μ − γ·μ/‖μ‖ with γ as large as the honest diameter allows (AGR-agnostic min-max)."""
    stack, mean = _stack(view), _honest_mean(view)
    p = _unit(-mean)
    return (mean + _min_max_gamma(stack, mean, p) * p).astype(np.float32)


def min_sum(view: AttackView) -> np.ndarray:
    """μ − γ·μ/‖μ‖ with γ as large as the honest workers' worst summed distances allow (min-sum)."""
    stack, mean = _stack(view), _honest_mean(view)
    p = _unit(-mean)
    return (mean + _min_sum_gamma(stack, mean, p) * p).astype(np.float32)


def mimic(seed: int = 0) -> Attack:
    """Copy the honest Δ farthest along z, the honest spread's top direction (Karimireddy et al.
    2022): colluders then overweight one worker's data. z is refined by one power-iteration step
    per round from where it was, starting at a fixed random direction (their online estimate)."""
    state: dict[str, np.ndarray] = {}

    def attack(view: AttackView) -> np.ndarray:
        stack = _stack(view)
        centred = stack - stack.mean(axis=0)
        z = state.get("z")
        if z is None or z.size != stack.shape[1]:
            z = _fixed_direction(stack.shape[1], seed)
        z = _unit(centred.T @ (centred @ z))
        if not z.any():  # all honest Δs equal: any of them is the mean
            z = _fixed_direction(stack.shape[1], seed)
        state["z"] = z
        chosen = int(np.argmax(centred @ z))
        return np.asarray(view.honest_deltas[chosen], dtype=np.float32).copy()

    return attack


def alie_searched(view: AttackView) -> np.ndarray:
    """ALIE with z searched this round (`SEARCH_SCALES`) for the largest ‖result − honest mean‖."""
    stack = _stack(view)
    mean, std = stack.mean(axis=0), stack.std(axis=0, ddof=1)
    return _searched(view, lambda z: mean - z * std, SEARCH_SCALES,
                     harm=lambda result: float(np.linalg.norm(result - mean)))


def ipm_searched(view: AttackView) -> np.ndarray:
    """IPM with ε searched this round (`SEARCH_SCALES`) for the largest ‖result − honest mean‖."""
    mean = _honest_mean(view)
    return _searched(view, lambda epsilon: -epsilon * mean, SEARCH_SCALES,
                     harm=lambda result: float(np.linalg.norm(result - mean)))


ATTACKS: dict[str, Callable[[], Attack]] = {
    "sign_flip": lambda: sign_flip(1.0),
    "sign_flip_x100": lambda: sign_flip(100.0),
    "gaussian": gaussian,
    "alie": alie,
    "ipm": ipm,
    "nan": lambda: non_finite(float("nan")),
    "inf": lambda: non_finite(float("inf")),
    "zero": lambda: zero,
    "replay": replay,
    "min_max": lambda: min_max,
    "min_sum": lambda: min_sum,
    "mimic": mimic,
    "alie_opt": lambda: alie_searched,
    "ipm_opt": lambda: ipm_searched,
    **{f"inside_{d}_{a:g}": (lambda d=d, a=a: inside_radius(a, d)) for d in DIRECTIONS for a in (0.5, 0.95)},
    **{f"inside_{d}_opt": (lambda d=d: inside_radius(None, d)) for d in DIRECTIONS},
    **{f"evade_scores_{d}": (lambda d=d: evading_scores(d)) for d in DIRECTIONS},
}


def get_attack(name: str) -> Attack:
    """The attack called `name` (a key of ATTACKS) with its default strength."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; known: {sorted(ATTACKS)}")
    return ATTACKS[name]()
