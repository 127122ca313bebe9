"""`synthetic-lm`, the default task: the GPT on text from a seeded Markov chain of known entropy.

No download: the chain is built from `source_seed`, and the best achievable held-out loss
(`floor`, nats/token) is computed exactly, so a run's eval loss reads as "this far above optimal".

Sizes: the default model has about 105k parameters (d_model 64, 2 layers, context 64) and trains
in minutes on a laptop CPU; {"alphabet": 32, "context": 128, "n_layer": 8, "n_head": 8,
"d_model": 512} is a 25.3M-parameter model of the same family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .base import MODEL_DEFAULTS, LanguageModelTask, TaskError, read_config, seeded_rng
from .markov import MarkovSource

SYNTHETIC_DEFAULTS: dict[str, Any] = {
    "alphabet": 16,
    "order": 2,
    "concentration": 0.2,
    "source_seed": 0,
    "eval_sequences": 256,
    **MODEL_DEFAULTS,
}

_TRAIN_TAG = 0x5452  # "TR": keeps training streams apart from the held-out set
_EVAL_TAG = 0x4556  # "EV"


class SyntheticLM(LanguageModelTask):
    name = "synthetic-lm"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = read_config(self.name, config, SYNTHETIC_DEFAULTS)
        try:
            self.source = MarkovSource(
                self.config["alphabet"],
                self.config["order"],
                self.config["concentration"],
                self.config["source_seed"],
            )
        except ValueError as error:
            raise TaskError(f"task {self.name!r}: {error}") from None
        if self.config["eval_sequences"] < 1 or self.config["source_seed"] < 0:
            raise TaskError(f"task {self.name!r}: eval_sequences >= 1 and source_seed >= 0 needed")
        self.vocab_size = self.config["alphabet"]
        self.model_config()  # validate the model sizes now, not at the first build
        eval_rng = seeded_rng(self.config["source_seed"], _EVAL_TAG)
        self.eval_inputs, self.eval_targets = self._windows(eval_rng, self.config["eval_sequences"])
        self._floor = self.source.window_floor(self.config["context"])

    def _windows(self, rng, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        sequences = torch.from_numpy(self.source.sample(rng, count, self.config["context"] + 1))
        return sequences[:, :-1], sequences[:, 1:]

    def batch(self, run_seed: int, peer_index: int, step: int, batch_size: int):
        rng = seeded_rng(self.config["source_seed"], _TRAIN_TAG, run_seed, peer_index, step)
        return self._windows(rng, batch_size)

    def floor(self) -> float:
        """Exact best mean loss over a context window (slightly above the entropy rate)."""
        return self._floor

    def entropy_rate(self) -> float:
        return self.source.entropy_rate()
