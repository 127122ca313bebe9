"""What a task is: model + data + eval behind one small interface, and the shared language-model part.

A `Task` builds its model from a seed, hands out the deterministic data shard for (run seed, peer,
step), and evaluates a model on a fixed held-out set. Everything a peer needs to agree on is in
`name` and `config`, which go into a run's genesis manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from ..model import GPT, GPTConfig


class TaskError(ValueError):
    """A task name, entry point or config that cannot be used; the message says why."""


class UnknownConfigKey(TaskError):
    """A config key the task does not know. It keeps the key and the task's keys, so that `run
    create` can list them beside the run's own settings and suggest the closest
    (training/run_settings.py)."""

    def __init__(self, task: str, key: str, known: list[str]) -> None:
        super().__init__(f"task {task!r}: unknown config key {key!r} (known: {known})")
        self.task, self.key, self.known = task, key, known


@runtime_checkable
class Task(Protocol):
    name: str
    config: Mapping[str, Any]

    def build_model(self, seed: int) -> nn.Module:
        """A freshly initialized model; the same seed gives bit-identical parameters."""
        ...

    def batch(
        self, run_seed: int, peer_index: int, step: int, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) for this peer and inner step of this run; deterministic."""
        ...

    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        """{"loss": mean held-out loss, "floor": best achievable loss or None if unknown}."""
        ...


MODEL_DEFAULTS: dict[str, Any] = {"context": 64, "n_layer": 2, "n_head": 4, "d_model": 64}


def read_config(name: str, config: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict:
    """`defaults` overlaid with `config`; unknown keys and wrongly typed values raise TaskError."""
    merged = dict(defaults)
    for key, value in (config or {}).items():
        if key not in defaults:
            raise UnknownConfigKey(name, key, sorted(defaults))
        merged[key] = _checked(name, key, value, type(defaults[key]))
    return merged


def _checked(name: str, key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise TaskError(f"task {name!r}: config {key!r} must be {kind.__name__}, got {value!r}")
    return value


def seeded_rng(*words: int) -> np.random.Generator:
    """A generator determined by `words` alone (each must be a non-negative int)."""
    return np.random.default_rng([int(word) for word in words])


class LanguageModelTask:
    """Next-token prediction with the GPT of `model.py`; subclasses supply data and the floor.

    Subclasses set `name`, `config`, `vocab_size`, `eval_inputs`/`eval_targets` (fixed held-out
    windows) and implement `batch` and `floor`.
    """

    name: str
    config: dict[str, Any]
    vocab_size: int
    eval_inputs: torch.Tensor
    eval_targets: torch.Tensor

    def model_config(self) -> GPTConfig:
        sizes = {key: self.config[key] for key in MODEL_DEFAULTS}
        try:
            return GPTConfig(vocab_size=self.vocab_size, **sizes)
        except ValueError as error:
            raise TaskError(f"task {self.name!r}: {error}") from None

    def build_model(self, seed: int) -> nn.Module:
        return seeded_build(seed, lambda: GPT(self.model_config()))

    def floor(self) -> float | None:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, batch_size: int = 64) -> dict[str, float | None]:
        return {"loss": held_out_loss(model, self.eval_inputs, self.eval_targets, batch_size), "floor": self.floor()}


def seeded_build(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """`make()` under `torch.manual_seed(seed)`, without disturbing the caller's global torch RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def held_out_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int) -> float:
    """The mean loss per token of `model` on the windows (`inputs`, `targets`), in batches of
    `batch_size`, on the model's device, in eval mode (the model's mode is restored)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device  # the held-out windows go where the model is
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size]
            _, loss = model(batch.to(device), targets[start : start + batch_size].to(device))
            total += float(loss) * batch.numel()
            count += batch.numel()
    model.train(was_training)
    return total / count
