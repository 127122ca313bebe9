"""Would this machine finish a round of a run in time? A few real inner steps, timed, and arithmetic.

`time_inner_steps` builds the run's task on the node's device and times real inner steps of it
(one to warm up, then as many as fit in `budget_s`, at least one), so the figure is this
machine's, with whatever else it runs. `predict` multiplies by the run's inner steps H and adds the
exchange: the bytes this node downloads in a round (`Footprint.exchange_bytes_down`: every other
contributor's payload in an allgather) over the bandwidth measured to the run's members. A round
must be done by the run's deadline (``round_deadline_s``): past it the others time the attempt out
and go on without this node (node/rounds/machine.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from locomesh.training.footprint import Footprint

BUDGET_S = 5.0  # of real training: enough to time a step, short enough to wait for
MARGIN = 0.8  # a round predicted to need more than this share of the deadline is too close to call safe


@dataclass(frozen=True)
class StepTiming:
    seconds_per_step: float
    steps: int  # timed, after the warm-up step
    device: str


def time_inner_steps(body: Mapping[str, Any], device: str, *, budget_s: float = BUDGET_S) -> StepTiming:
    """Time inner steps of the run of manifest body `body` on `device` (blocking; bounded by about
    `budget_s` after the first two steps). `ParticipantError`/`DeviceError` if it cannot train here."""
    import numpy as np

    from locomesh.training.devices import describe, resolve_device
    from locomesh.training.flat import flatten
    from locomesh.training.inner import InnerConfig, Worker
    from locomesh.training.run_settings import check_run_settings

    settings, task = check_run_settings(body["task"], body["task_config"], body["hparams"])
    resolved = resolve_device(device)
    worker = Worker(task, int(body["seed"]), int(body["seed"]), 0,
                    InnerConfig(lr=settings.inner_lr, batch_size=settings.batch_size), device=resolved)
    theta = flatten(worker.model)
    worker.run_round(np.copy(theta), steps=1)  # warm-up: allocations, kernel choice
    deadline = time.monotonic() + budget_s
    result = worker.run_round(np.copy(theta), steps=settings.inner_steps, stop=lambda: time.monotonic() >= deadline)
    return StepTiming(result.seconds / result.steps, result.steps, describe([resolved]))


@dataclass(frozen=True)
class Prediction:
    train_s: float
    exchange_s: float | None  # None: no bandwidth measured to any member
    deadline_s: float

    @property
    def total_s(self) -> float:
        return self.train_s + (self.exchange_s or 0.0)

    @property
    def verdict(self) -> str:
        """"in time", "close" (over `MARGIN` of the deadline) or "too slow"."""
        if self.total_s > self.deadline_s:
            return "too slow"
        return "close" if self.total_s > MARGIN * self.deadline_s else "in time"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_s": round(self.total_s, 3), "verdict": self.verdict}


def predict(footprint: Footprint, seconds_per_step: float, bandwidth: float | None) -> Prediction:
    """The round time of this machine: H inner steps at `seconds_per_step`, plus the allgather's
    download at `bandwidth` bytes/s (None: unknown, left out)."""
    exchange = None if not bandwidth else footprint.exchange_bytes_down("allgather") / bandwidth
    return Prediction(round(footprint.inner_steps * seconds_per_step, 3),
                      None if exchange is None else round(exchange, 3), footprint.round_deadline_s)
