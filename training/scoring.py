"""Contribution scores: what each contribution does to the loss when it is applied alone.

score(Δ) = L(θ) − L(θ − Δ), the mean loss over batches drawn from the round's randomness (a seed
fixed only once the round's contributions are committed, so nobody can prepare for them). θ − Δ
is the contributor's own model (Δ = θ_r − θ_i): an honest Δ lowers the loss and scores above
zero; a free rider's zero Δ scores 0; a replayed Δ, one pushed along a direction of its own, or
one aimed against descent does less or raises the loss. This is Zeno's suspicion score (Xie,
Koyejo & Gupta 2019) with the contribution's whole step in place of a first-order estimate.

What scores weigh is the run's choice (`POLICIES`): "report" only records them; "exclude" leaves
out of the aggregate every contribution scoring below `keep_ratio` of the median score;
"reputation" leaves out of round r the authors whose relative scores (score over the round's
median) averaged over their last `history` scored rounds before r are below `keep_ratio` (a daemon
can agree on those before round r: they are facts of earlier rounds; one round's honest relative
scores are noisy, their average over rounds is not, so a bar honest peers clear on average holds
a steady attacker's push down without dropping honest contributions); "weight"
shrinks each contribution's offset from the aggregator's centre by its score over the median
(capped at 1: `weights`), so a contribution half as useful as the median pulls half as far. Why the
median: with fewer than half the contributors Byzantine it is an honest score or lies between two,
so colluders cannot lift the bar over honest peers or lower it under themselves.

Scores come from torch forward passes, which are not bit-exact across CPUs; a run that weighs by
them must agree on them first (signed facts of a scoring committee) and aggregate by the agreed
ones. Here the simulator computes them in one process.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Hashable, TypeVar

import numpy as np
import torch

from .flat import unflatten_into
from .tasks import Task

POLICIES = ("report", "exclude", "reputation", "weight")
SCORING_PEER = 1 << 16  # the data stream scoring batches come from: no worker has this index


@dataclass(frozen=True)
class ScoringConfig:
    policy: str = "report"
    batches: int = 4
    batch_size: int = 16
    keep_ratio: float = 0.5  # "exclude": the bar is this fraction of the median score
    history: int = 4  # "reputation": rounds of relative scores averaged

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"scoring policy is one of {POLICIES}, got {self.policy!r}")
        if self.batches < 1 or self.batch_size < 1:
            raise ValueError("scoring needs at least one batch of at least one sequence")
        if not 0.0 <= self.keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio is in [0, 1], got {self.keep_ratio}")
        if self.history < 1:
            raise ValueError(f"history is at least 1 round, got {self.history}")


@torch.no_grad()
def score_contributions(
    task: Task,
    scratch: torch.nn.Module,
    theta: np.ndarray,
    deltas: Mapping[Hashable, np.ndarray],
    *,
    seed: int,
    config: ScoringConfig,
) -> dict[Hashable, float]:
    """Every contribution's score on `config.batches` batches drawn from `seed` (the round's
    randomness), computed in the model `scratch` (its parameters are overwritten)."""
    return dict(scored(task, scratch, theta, deltas.items(), seed=seed, batches=config.batches,
                       batch_size=config.batch_size))


Key = TypeVar("Key")


@torch.no_grad()
def scored(task: Task, scratch: torch.nn.Module, theta: np.ndarray, deltas: Iterable[tuple[Key, np.ndarray]], *,
           seed: int, batches: int, batch_size: int) -> Iterator[tuple[Key, float]]:
    """`score_contributions` one contribution at a time, as `deltas` yields them (so a caller that
    decodes each Δ on demand holds one in memory at a time)."""
    drawn = [task.batch(seed, SCORING_PEER, k, batch_size) for k in range(batches)]
    base = _mean_loss(scratch, theta, drawn)
    for author, delta in deltas:
        yield author, base - _mean_loss(scratch, theta - delta, drawn)


def bar(scores: Mapping[Hashable, float], keep_ratio: float) -> float:
    """The lowest score "exclude" keeps: `keep_ratio` of the median when the median is above zero;
    when it is not (the round improved nothing), the median itself less (1 − keep_ratio) of its size."""
    median = statistics.median(scores.values())
    return median - (1.0 - keep_ratio) * abs(median)


def excluded(scores: Mapping[Hashable, float], config: ScoringConfig) -> set[Hashable]:
    """The contributions the run's policy leaves out of this round's aggregate (none for "report";
    a non-finite score is always out)."""
    out = {author for author, score in scores.items() if not math.isfinite(score)}
    finite = {author: score for author, score in scores.items() if math.isfinite(score)}
    if config.policy == "exclude" and finite:
        threshold = bar(finite, config.keep_ratio)
        out |= {author for author, score in finite.items() if score < threshold}
    return out


def relative(scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Each finite score over the round's median; nothing when the median is not above zero (the
    round improved nothing: its scores tell nobody apart)."""
    finite = {author: score for author, score in scores.items() if math.isfinite(score)}
    median = statistics.median(finite.values()) if finite else 0.0
    if median <= 0:
        return {}
    return {author: (score / median if math.isfinite(score) else -math.inf) for author, score in scores.items()}


class Reputation:
    """"reputation": every author's relative scores of its last `history` scored rounds."""

    def __init__(self, config: ScoringConfig) -> None:
        self.config = config
        self.relative: dict[Hashable, list[float]] = {}

    def excluded(self, authors: Iterable[Hashable]) -> set[Hashable]:
        """The authors whose average is below the bar (an author with no scored round yet is in)."""
        return {author for author in authors
                if self.relative.get(author) and average(self.relative[author]) < self.config.keep_ratio}

    def record(self, scores: Mapping[Hashable, float]) -> None:
        for author, value in relative(scores).items():
            self.relative[author] = [*self.relative.get(author, []), value][-self.config.history:]


def average(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def weights(scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """"weight": each contribution's score over the median, in [0, 1]; all 1 when the median is not
    above zero (the round improved nothing: the scores tell nothing apart), 0 for a non-finite one."""
    over_median = relative(scores)
    return {author: (0.0 if not math.isfinite(score) else min(1.0, max(0.0, over_median[author])) if over_median else 1.0)
            for author, score in scores.items()}


def shrunk(delta: np.ndarray, center: np.ndarray | None, weight: float) -> np.ndarray:
    """`delta` moved towards the aggregator's centre (zero before there is one) to `weight` of its offset."""
    origin = np.zeros_like(delta) if center is None else center.astype(delta.dtype)
    return (origin + np.float32(weight) * (delta - origin)).astype(np.float32)


def _mean_loss(model: torch.nn.Module, theta: np.ndarray, batches) -> float:
    unflatten_into(model, np.ascontiguousarray(theta, dtype=np.float32))
    model.eval()
    device = next(model.parameters()).device  # float32 there, no autocast: a score is a small difference of losses
    losses = [float(model(inputs.to(device), targets.to(device))[1]) for inputs, targets in batches]
    return math.fsum(losses) / len(losses)
