"""DiLoCo's inner loop: one worker's H AdamW steps from the shared θ_r on its own data shard.

A `Worker` owns a model and an AdamW optimizer whose state survives across rounds (as in DiLoCo:
only the parameters are reset to the new shared θ at each round). `run_round(theta)` loads θ_r,
trains for H steps or a time budget, and returns the pseudo-gradient Δ = θ_r − θ_i as one flat
float32 vector, the thing the codec encodes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .flat import flatten, unflatten_into
from .tasks import Task


@dataclass(frozen=True)
class InnerConfig:
    """AdamW and schedule of the inner loop. `decay_steps` > 0 adds a cosine decay to
    `min_lr_ratio * lr`, counted in the worker's own steps across rounds."""

    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr_ratio: float = 0.1
    batch_size: int = 16

    def lr_at(self, step: int) -> float:
        """Learning rate for the worker's `step`-th update (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps <= 0:
            return self.lr
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.decay_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, config: InnerConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
        foreach=False,  # the plain per-parameter loop: same arithmetic on every build
    )


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: InnerConfig, step: int
) -> None:
    """Clip the accumulated gradient, set the scheduled lr, step and clear the gradient."""
    if config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class InnerResult:
    delta: np.ndarray  # θ_r − θ_i, float32, flat
    steps: int
    mean_loss: float
    seconds: float


class Worker:
    """One DiLoCo worker: a model replica, its AdamW state, and its place in the data (peer index)."""

    def __init__(
        self, task: Task, model_seed: int, run_seed: int, peer_index: int, config: InnerConfig
    ) -> None:
        self.task = task
        self.model = task.build_model(model_seed)
        self.optimizer = make_optimizer(self.model, config)
        self.config = config
        self.run_seed = run_seed
        self.peer_index = peer_index
        self.steps_done = 0  # across rounds: picks the data shard and the lr schedule

    def run_round(
        self, theta: np.ndarray, steps: int | None = None, seconds: float | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> InnerResult:
        """Train from `theta` for `steps` inner steps, or until `seconds` have passed, or until
        `stop()` says yes (each at least one step), whichever comes first, or at the first non-finite
        loss; return Δ = theta − θ_i."""
        if steps is None and seconds is None:
            raise ValueError("give an inner step count, a time budget, or both")
        unflatten_into(self.model, theta)
        self.model.train()
        started = time.monotonic()
        losses: list[float] = []
        while True:
            inputs, targets = self.task.batch(
                self.run_seed, self.peer_index, self.steps_done, self.config.batch_size
            )
            _, loss = self.model(inputs, targets)
            loss.backward()
            optimizer_step(self.model, self.optimizer, self.config, self.steps_done)
            self.steps_done += 1
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                break  # diverged: more steps cannot bring it back, and the caller refuses the result
            if steps is not None and len(losses) >= steps:
                break
            if seconds is not None and time.monotonic() - started >= seconds:
                break
            if stop is not None and stop():
                break
        delta = flatten(self.model)
        np.subtract(theta, delta, out=delta, dtype=np.float32)  # Δ = θ_r − θ_i, in the one new array
        return InnerResult(delta, len(losses), float(np.mean(losses)), time.monotonic() - started)
