"""`llama`: a Llama-family decoder (training/llama/) on a tokenized dataset shared peer to peer.

The task config names the model and its data:

- the model: a preset of `LLAMA_PRESETS` (``preset``, default "tiny") whose fields any config key
  of the same Hugging Face name overrides (``hidden_size``, ``num_hidden_layers``, ``vocab_size``,
  ...); ``sequence_length`` is the training window (0: the model's whole context);
- ``dataset``: the hex ID of a packed dataset (`locomesh data pack`). Without one the task trains on
  a seeded Markov source over the first ``alphabet`` tokens, as `synthetic-lm` does: a way to try a
  model size with no data at all;
- ``init``: the hex ID of the checkpoint of weights round 0 starts from (`run create --init FILE`
  stores a safetensors file as one); without one, a fresh init from the run's seed.

What a dataset or an initial state holds comes from peers, so the task never fetches anything:
the node resolves both (node/datasets/) and hands them over with `attach_dataset` and
`initial_tensors`, each checked against the model first (a tokenizer whose vocabulary the model
cannot embed is refused before any training). A round's training windows come from the shards the
round assigned this peer (`round_batches`, in order: each token of them once), never from `batch`;
with a dataset `batch` draws windows of the held-out shards the node attached, which is what
scoring and evaluation read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from torch import nn

from ..llama.hf import expected_layout, export_files
from ..llama.model import LLAMA_PRESETS, Llama, LlamaConfig
from .base import TaskError, UnknownConfigKey, held_out_loss, seeded_build, seeded_rng
from .markov import MarkovSource

_MODEL_KEYS = tuple(field.name for field in fields(LlamaConfig) if field.name != "initializer_range")
_TASK_DEFAULTS: dict[str, Any] = {
    "preset": "tiny",
    "sequence_length": 0,
    "dataset": "",
    "init": "",
    "activation_checkpointing": False,
    "eval_sequences": 64,
    "alphabet": 16,  # the Markov source's, without a dataset
}
_TRAIN_TAG, _EVAL_TAG = 0x5452, 0x4556  # as synthetic-lm: training draws never meet the held-out set
_ID_HEX = 64


def _checked_id(name: str, value: Any) -> bytes | None:
    if value == "":
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != _ID_HEX // 2:
        raise TaskError(f"task 'llama': {name} must be a {_ID_HEX}-hex-digit ID, not {str(value)[:80]!r}")
    return raw


class LlamaTask:
    """Next-token prediction with the Llama of training/llama/ (see the module docstring)."""

    name = "llama"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = _read_config(dict(config or {}))
        self.model_config = _model_config(self.config)
        self.context = self.config["sequence_length"] or self.model_config.max_position_embeddings
        if self.context > self.model_config.max_position_embeddings:
            raise TaskError(f"task 'llama': sequence_length {self.context} exceeds the model's context "
                            f"{self.model_config.max_position_embeddings}")
        if self.config["eval_sequences"] < 1:
            raise TaskError("task 'llama': eval_sequences must be at least 1")
        self.dataset_id = _checked_id("dataset", self.config["dataset"])
        self.init_id = _checked_id("init", self.config["init"])
        self.dataset: Any = None  # the dataset's index, once `attach_dataset` ran
        self.held_out: np.ndarray | None = None
        self.source: MarkovSource | None = None
        if self.dataset_id is None:
            self._use_markov_source()

    # --- the model ------------------------------------------------------------------------------

    def build_model(self, seed: int) -> nn.Module:
        checkpointing = self.config["activation_checkpointing"]
        return seeded_build(seed, lambda: Llama(self.model_config, activation_checkpointing=checkpointing))

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each of the model's parameters (a tied head is the embedding's)."""
        return expected_layout(self.model_config)

    # --- the data -------------------------------------------------------------------------------

    def _use_markov_source(self) -> None:
        alphabet = self.config["alphabet"]
        if not 2 <= alphabet <= self.model_config.vocab_size:
            raise TaskError(f"task 'llama': alphabet must be in [2, vocab_size {self.model_config.vocab_size}]")
        self.source = MarkovSource(alphabet, 2, 0.2, 0)
        rng = seeded_rng(_EVAL_TAG)
        self.eval_inputs, self.eval_targets = _split(torch.from_numpy(
            self.source.sample(rng, self.config["eval_sequences"], self.context + 1)))

    def attach_dataset(self, index: Any, held_out: Sequence[np.ndarray]) -> None:
        """Train on the dataset of `index` (a `DatasetIndex`), evaluating on the `held_out` shards'
        tokens. `TaskError` if the model cannot embed its tokenizer's vocabulary, or the held-out
        tokens make no window."""
        self.check_vocabulary(index)
        tokens = np.concatenate([np.asarray(shard) for shard in held_out]).astype(np.int64)
        window = self.context + 1
        if len(tokens) < window:
            raise TaskError(f"the held-out shards hold {len(tokens)} tokens, less than one window of {window}")
        count = min(self.config["eval_sequences"], len(tokens) // window)
        starts = np.linspace(0, len(tokens) - window, num=count).astype(np.int64)
        self.eval_inputs, self.eval_targets = _split(torch.from_numpy(np.stack([tokens[s : s + window] for s in starts])))
        self.dataset, self.held_out, self.source = index, tokens, None

    def check_vocabulary(self, index: Any) -> None:
        """`TaskError` unless the model embeds every token of the dataset of `index`."""
        if index.vocab_size > self.model_config.vocab_size:
            raise TaskError(f"the dataset's tokenizer has {index.vocab_size} tokens; the model embeds only "
                            f"{self.model_config.vocab_size} (set vocab_size to at least {index.vocab_size})")

    def tokens_per_round(self, inner_steps: int, batch_size: int) -> int:
        """Tokens one member's round of `inner_steps` steps of `batch_size` windows reads."""
        return inner_steps * batch_size * (self.context + 1)

    def round_batches(self, shards: Sequence[np.ndarray], batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The training batches of a round on `shards` (the ones assigned this peer, in order):
        consecutive windows, each token once, starting again at the first after the last (a round
        that outlasts its shards, on a time budget)."""
        tokens = torch.from_numpy(np.concatenate([np.asarray(shard) for shard in shards]).astype(np.int64))
        window = self.context + 1
        if len(tokens) < window * batch_size:
            raise TaskError(f"the round's shards hold {len(tokens)} tokens, less than one batch of {batch_size} windows")
        windows = tokens[: len(tokens) // window * window].view(-1, window)
        start = 0
        while True:
            if start + batch_size > len(windows):
                start = 0
            yield _split(windows[start : start + batch_size])
            start += batch_size

    def batch(self, run_seed: int, peer_index: int, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows drawn from (run seed, peer, step): of the Markov source without a dataset, of the
        held-out tokens with one (scoring's draws; training reads `round_batches`)."""
        rng = seeded_rng(_TRAIN_TAG, run_seed, peer_index, step)
        if self.source is not None:
            return _split(torch.from_numpy(self.source.sample(rng, batch_size, self.context + 1)))
        if self.held_out is None:
            raise TaskError("task 'llama': its dataset is not attached yet")
        starts = rng.integers(0, len(self.held_out) - self.context, size=batch_size)
        return _split(torch.from_numpy(np.stack([self.held_out[s : s + self.context + 1] for s in starts])))

    def export_files(self, model: nn.Module, tokenizer_json: bytes | None) -> dict[str, bytes]:
        """`model` as the files of a directory transformers' `LlamaForCausalLM` loads (with the
        dataset's tokenizer, when given)."""
        eos = None if self.dataset is None else self.dataset.eos_id
        return export_files(model, tokenizer_json=tokenizer_json, eos_token_id=eos)

    # --- evaluation -----------------------------------------------------------------------------

    def evaluate(self, model: nn.Module, batch_size: int = 16) -> dict[str, float | None]:
        floor = None if self.source is None else self.source.window_floor(self.context)
        return {"loss": held_out_loss(model, self.eval_inputs, self.eval_targets, batch_size), "floor": floor}


def _split(sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return sequences[:, :-1], sequences[:, 1:]


def _read_config(config: dict[str, Any]) -> dict[str, Any]:
    known = {**_TASK_DEFAULTS, **{key: None for key in _MODEL_KEYS}}
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise UnknownConfigKey("llama", unknown[0], sorted(known))
    merged = {**known, **config}
    for key, default in _TASK_DEFAULTS.items():
        if isinstance(default, bool) != isinstance(merged[key], bool) or not isinstance(merged[key], type(default)):
            raise TaskError(f"task 'llama': config {key!r} must be {type(default).__name__}, got {merged[key]!r:.80}")
    if merged["preset"] not in LLAMA_PRESETS:
        raise TaskError(f"task 'llama': unknown preset {merged['preset']!r:.80} (known: {', '.join(LLAMA_PRESETS)})")
    return merged


def _model_config(config: Mapping[str, Any]) -> LlamaConfig:
    preset = LLAMA_PRESETS[config["preset"]]
    overrides = {key: config[key] for key in _MODEL_KEYS if config[key] is not None}
    for key, value in overrides.items():
        wanted = type(getattr(preset, key)) if getattr(preset, key) is not None else int
        if wanted is float and isinstance(value, int) and not isinstance(value, bool):
            overrides[key] = value = float(value)
        if isinstance(value, bool) != (wanted is bool) or not isinstance(value, wanted) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise TaskError(f"task 'llama': config {key!r} must be {wanted.__name__}, got {value!r:.80}")
    try:
        return LlamaConfig(**{**{f.name: getattr(preset, f.name) for f in fields(LlamaConfig)}, **overrides})
    except ValueError as error:
        raise TaskError(f"task 'llama': {error}") from None
