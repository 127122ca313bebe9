"""`text-lm`: the GPT on the user's own text files, byte by byte.

The files are read in the order given and joined; the last `holdout_fraction` of the bytes is the
held-out set (fixed, evenly spaced windows), the rest is training text. A peer's batch for a step is
a set of windows at offsets drawn from (run seed, peer, step), so shards are deterministic and differ
between peers. The best achievable loss of real text is unknown: `floor` is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import MODEL_DEFAULTS, LanguageModelTask, TaskError, read_config, seeded_rng

TEXT_DEFAULTS: dict[str, Any] = {
    "paths": [],
    "holdout_fraction": 0.1,
    "eval_sequences": 128,
    **MODEL_DEFAULTS,
}


def _read_corpus(name: str, paths: list) -> np.ndarray:
    if not paths or not all(isinstance(path, str) for path in paths):
        raise TaskError(f"task {name!r}: config 'paths' must be a non-empty list of file paths")
    parts = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise TaskError(f"task {name!r}: cannot read {path!r}: {error.strerror}") from None
        if not data:
            raise TaskError(f"task {name!r}: file {path!r} is empty")
        parts.append(np.frombuffer(data, dtype=np.uint8))
    return np.concatenate(parts).astype(np.int64)


class TextLM(LanguageModelTask):
    name = "text-lm"
    vocab_size = 256

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = read_config(self.name, config, TEXT_DEFAULTS)
        corpus = _read_corpus(self.name, self.config["paths"])
        window = self.config["context"] + 1
        fraction = self.config["holdout_fraction"]
        if not 0.0 < fraction < 1.0:
            raise TaskError(f"task {self.name!r}: holdout_fraction must be in (0, 1), got {fraction}")
        split = len(corpus) - int(len(corpus) * fraction)
        self.train_text, held_out = corpus[:split], corpus[split:]
        if len(self.train_text) < window or len(held_out) < window:
            raise TaskError(
                f"task {self.name!r}: {len(corpus)} bytes of text is too little for a training and "
                f"a held-out window of {window} bytes each"
            )
        self.model_config()
        count = min(self.config["eval_sequences"], len(held_out) // window)
        starts = np.linspace(0, len(held_out) - window, num=max(count, 1)).astype(np.int64)
        self.eval_inputs, self.eval_targets = self._windows(held_out, starts)

    def _windows(self, text: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.config["context"] + 1
        sequences = torch.from_numpy(np.stack([text[start : start + window] for start in starts]))
        return sequences[:, :-1], sequences[:, 1:]

    def batch(self, run_seed: int, peer_index: int, step: int, batch_size: int):
        rng = seeded_rng(run_seed, peer_index, step)
        starts = rng.integers(0, len(self.train_text) - self.config["context"], size=batch_size)
        return self._windows(self.train_text, starts)

    def floor(self) -> None:
        return None
