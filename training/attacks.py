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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


Attack = Callable[[AttackView], "np.ndarray | bytes"]


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
}


def get_attack(name: str) -> Attack:
    """The attack called `name` (a key of ATTACKS) with its default strength."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; known: {sorted(ATTACKS)}")
    return ATTACKS[name]()
