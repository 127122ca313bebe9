"""What a run asks of a node: the memory its task needs here and the bytes it moves each round.

`run_footprint(body)` reads a run's signed manifest body (task, task config, hyperparameters) and
works from the task's own code, never from a table of guesses: the parameter count is the task's
model built on torch's ``meta`` device (its shapes, no storage, so a 7B model costs nothing to
count), the payload size is the run's codec's worst case for that count (`codec.max_payload_size`,
what every peer's limits allow), and the activations follow the task's model shape where the task
says it (the GPT of `model.py`, the Llama of `llama/`); a user task whose shape we cannot read gets
no activation term, and `activations_known` says so.

The parts, all float32 (the inner steps may run in bf16 on a GPU, so this is the upper side):

- training: the model, its gradients and AdamW's two moments (four vectors of the parameters),
  plus one batch's activations;
- outer step (CPU, bit-exact: training/outer.py): θ, momentum and the previous aggregate (the
  state), this round's Δ and the encoder's error-feedback residual, and the spare vectors the step
  writes into;
- payloads held in memory: this round's and the last round's, of every contributor (a payload is
  dropped a round after it was aggregated: node/transfer/held.py).

`memory_needed` is their sum; the node compares it with its ``memory_limit`` and the machine's
available memory before it joins (node/rounds/service.py) and ``locomesh doctor`` shows it.
No network, no files; torch is imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .codec import DEFAULT_BLOCK, max_payload_size
from .run_settings import RoundSettings, check_task

FLOAT32 = 4
ADAMW_VECTORS = 4  # parameters, gradients, first and second moment
OUTER_VECTORS = 7  # θ, momentum, previous aggregate, Δ, error-feedback residual, two spares
HELD_ROUNDS = 2  # payloads of the round under way and of the one before
LOGIT_COPIES = 3  # logits, their log-softmax, and its gradient
EXCHANGES = ("allgather", "sharded")


@dataclass(frozen=True)
class ModelShape:
    """What the activations of a transformer depend on."""

    width: int  # d_model / hidden_size
    layers: int
    heads: int
    context: int
    vocab: int
    ffn: int  # the MLP's inner width
    checkpointing: bool = False  # activation checkpointing: a layer keeps only its input

    def activation_bytes(self, batch_size: int) -> int:
        """The float32 activations one forward/backward of `batch_size` windows keeps alive."""
        tokens = batch_size * self.context
        # Per layer and token: the normalised inputs, q, k, v, the attention output and projection,
        # two residuals (8 widths), the MLP's up, activation and down input (3 inner widths), and the
        # attention weights when a kernel materialises them (2 per head and position).
        per_layer = 8 * self.width + 3 * self.ffn + 2 * self.heads * self.context
        if self.checkpointing:  # every layer keeps its input; one layer at a time is recomputed
            layers = self.layers * self.width + per_layer
        else:
            layers = self.layers * per_layer
        return FLOAT32 * tokens * (layers + LOGIT_COPIES * self.vocab)


@dataclass(frozen=True)
class Footprint:
    """A run's needs on one node, in bytes (see the module docstring for each part)."""

    task: str
    parameters: int
    codec: str
    payload_bytes: int  # the most bytes one payload of this run can have
    state_bytes: int  # θ, momentum, previous aggregate: what a checkpoint of the run holds
    training_bytes: int
    activation_bytes: int  # part of training_bytes
    activations_known: bool
    outer_bytes: int
    held_payload_bytes: int
    contributors: int
    inner_steps: int
    round_deadline_s: float

    @property
    def memory_needed(self) -> int:
        return self.training_bytes + self.outer_bytes + self.held_payload_bytes

    def exchange_bytes_down(self, exchange: str = "allgather") -> int:
        """What this node downloads in one round's exchange: every other contributor's payload
        (allgather), or about two payloads whatever the group's size (sharded: its shards' inputs,
        then every aggregated shard)."""
        if exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}")
        if exchange == "sharded":
            return 2 * self.payload_bytes
        return max(self.contributors - 1, 0) * self.payload_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory_needed": self.memory_needed}


def run_footprint(body: Mapping[str, Any], *, contributors: int = 1, task: Any = None) -> Footprint:
    """The footprint of the run whose genesis manifest body is `body`, with `contributors` peers
    sending payloads each round. `task`: the task already built from the body, if the caller has it.
    Raises `ParticipantError` (RunSettingsError) for settings or a task this node cannot use."""
    settings = RoundSettings.from_hparams(body["hparams"])
    task = task if task is not None else check_task(body["task"], body["task_config"])
    parameters = parameter_count(task)
    shape = model_shape(task)
    activations = 0 if shape is None else shape.activation_bytes(settings.batch_size)
    payload = max_payload_size(settings.codec, parameters, DEFAULT_BLOCK)
    contributors = max(int(contributors), 1)
    return Footprint(
        task=str(body["task"]),
        parameters=parameters,
        codec=settings.codec,
        payload_bytes=payload,
        state_bytes=3 * FLOAT32 * parameters,
        training_bytes=ADAMW_VECTORS * FLOAT32 * parameters + activations,
        activation_bytes=activations,
        activations_known=shape is not None,
        outer_bytes=OUTER_VECTORS * FLOAT32 * parameters,
        held_payload_bytes=HELD_ROUNDS * contributors * payload,
        contributors=contributors,
        inner_steps=settings.inner_steps,
        round_deadline_s=settings.round_deadline_s,
    )


def parameter_count(task: Any) -> int:
    """The scalars of `task`'s model, a tied matrix once: the model built on the meta device."""
    import torch

    from .flat import param_count

    with torch.device("meta"):
        model = task.build_model(0)
    return param_count(model)


def model_shape(task: Any) -> ModelShape | None:
    """The transformer shape of `task`'s model, for the tasks that say it; None for the others."""
    config = getattr(task, "model_config", None)
    if callable(config):  # LanguageModelTask: the GPT of model.py
        gpt = config()
        return ModelShape(gpt.d_model, gpt.n_layer, gpt.n_head, gpt.context, gpt.vocab_size, 4 * gpt.d_model)
    if config is not None and hasattr(config, "hidden_size"):  # the llama task
        checkpointing = bool(getattr(task, "config", {}).get("activation_checkpointing", False))
        return ModelShape(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                          int(getattr(task, "context", config.max_position_embeddings)), config.vocab_size,
                          config.intermediate_size, checkpointing)
    return None
