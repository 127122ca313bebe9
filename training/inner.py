"""DiLoCo's inner loop: one worker's H AdamW steps from the shared θ_r on its own data shard.

A `Worker` owns a model and an AdamW optimizer whose state survives across rounds (as in DiLoCo:
only the parameters are reset to the new shared θ at each round). `run_round(theta)` loads θ_r,
trains for H steps or a time budget, and returns the pseudo-gradient Δ = θ_r − θ_i as one flat
float32 vector, the thing the codec encodes.

The worker trains on a device (`training.devices`): its model and AdamW state live there, each
step's batch is moved there, and forward and backward run under the device's `autocast` (bf16 on
a GPU, float32 on the CPU). θ comes in and Δ goes out as CPU float32 arrays, so the outer step
never sees the device: it stays bit-exact on every peer's CPU. On the CPU the arithmetic is the
plain float32 one, step for step the same on every build (tests pin it bit for bit); on a GPU
the inner steps take the fast kernels instead, since only the outer step must be bit-exact.
A node with several GPUs runs one such step per GPU on a slice of the batch
(`training.distributed.DataParallelWorker`, with the same `run_round`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch

from .devices import autocast
from .flat import flatten, unflatten_into
from .tasks import Task

if TYPE_CHECKING:
    from .distributed import DataParallelWorker


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
    """AdamW over `model`'s parameters, on their device: on the CPU the plain per-parameter loop
    (the same arithmetic on every build), on CUDA the fused kernel, on MPS the foreach one."""
    kind = next(model.parameters()).device.type
    speed = {"fused": True} if kind == "cuda" else {"foreach": kind == "mps"}
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
        **speed,
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


def forward_backward(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device, weight: float = 1.0,
) -> torch.Tensor:
    """Forward and backward of `model` (on `device`) on (inputs, targets), moved there, under the
    device's `autocast`; the gradient accumulates in the parameters. `weight` scales the loss before
    backward (a data-parallel rank's share of its batch). Returns the loss, unweighted and detached,
    still on the device."""
    inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
    with autocast(device):
        _, loss = model(inputs, targets)
    (loss if weight == 1.0 else loss * weight).backward()
    return loss.detach()


@dataclass(frozen=True)
class InnerResult:
    delta: np.ndarray  # θ_r − θ_i, float32, flat
    steps: int
    mean_loss: float
    seconds: float


Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]  # a round's (inputs, targets), on the CPU


def check_budget(steps: int | None, seconds: float | None) -> None:
    if steps is None and seconds is None:
        raise ValueError("give an inner step count, a time budget, or both")


def next_batch(worker: Worker | DataParallelWorker, batches: Batches | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The next of `batches` when given (None once they run out), else the task's batch for the
    worker's peer index and step."""
    if batches is not None:
        return next(batches, None)
    return worker.task.batch(worker.run_seed, worker.peer_index, worker.steps_done, worker.config.batch_size)


def check_trained(losses: list[float]) -> None:
    if not losses:
        raise ValueError("the round's batches gave not one batch to train on")


def round_over(losses: list[float], steps: int | None, seconds: float | None, started: float,
               stop: Callable[[], bool] | None) -> bool:
    """Does a round that took `losses` so far end here? At a non-finite loss (more steps cannot
    bring it back, and the caller refuses the result), at `steps`, after `seconds`, or at `stop()`."""
    return (not math.isfinite(losses[-1]) or (steps is not None and len(losses) >= steps)
            or (seconds is not None and time.monotonic() - started >= seconds)
            or (stop is not None and stop()))


class Worker:
    """One DiLoCo worker: a model replica, its AdamW state, and its place in the data (peer index),
    on one device (the CPU unless told)."""

    def __init__(
        self, task: Task, model_seed: int, run_seed: int, peer_index: int, config: InnerConfig,
        device: torch.device | str = "cpu",
    ) -> None:
        self.task = task
        self.device = torch.device(device)
        self.devices = [self.device]
        # Built on the CPU, then moved: the initial θ is the same bits whatever the device.
        self.model = task.build_model(model_seed).to(self.device)
        self.optimizer = make_optimizer(self.model, config)
        self.config = config
        self.run_seed = run_seed
        self.peer_index = peer_index
        self.steps_done = 0  # across rounds: picks the data shard and the lr schedule

    def run_round(
        self, theta: np.ndarray, steps: int | None = None, seconds: float | None = None,
        stop: Callable[[], bool] | None = None, batches: Batches | None = None,
    ) -> InnerResult:
        """Train from `theta` for `steps` inner steps, or until `seconds` have passed, or until
        `stop()` says yes (each at least one step), whichever comes first, or at the first non-finite
        loss; return Δ = theta − θ_i. Each step's batch is the next of `batches` when given (one
        per step taken; the round also ends when they run out), else the task's for this peer
        and step."""
        check_budget(steps, seconds)
        unflatten_into(self.model, theta)
        self.model.train()
        started = time.monotonic()
        losses: list[float] = []
        while (batch := next_batch(self, batches)) is not None:
            loss = forward_backward(self.model, *batch, self.device)
            optimizer_step(self.model, self.optimizer, self.config, self.steps_done)
            self.steps_done += 1
            losses.append(loss.item())
            if round_over(losses, steps, seconds, started, stop):
                break
        check_trained(losses)
        delta = flatten(self.model)  # a CPU copy of the device's parameters
        np.subtract(theta, delta, out=delta, dtype=np.float32)  # Δ = θ_r − θ_i, in the one new array
        return InnerResult(delta, len(losses), float(np.mean(losses)), time.monotonic() - started)

    def close(self) -> None:
        """Nothing to release: the worker lives in this process (a `DataParallelWorker` does not)."""
