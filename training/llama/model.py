"""A Llama-family decoder in plain torch, laid out exactly like transformers' `LlamaForCausalLM`.

Theory of operation. The module tree mirrors Hugging Face's, attribute for attribute, so that
`state_dict()` keys (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...,
`lm_head.weight`) and the `parameters()` order are the same as transformers': a checkpoint moves
between the two by name alone (see `hf.py`), and the flat DiLoCo vector (`training/flat.py`) has
the same coordinate order as transformers' parameters.

The numerics follow transformers' default Llama path: RMSNorm in float32, cast back to the input
dtype, then scaled; rotary embeddings with the rotate_half convention and
inv_freq = 1 / theta^(arange(0, head_dim, 2) / head_dim), computed in float32; SwiGLU MLP
down(silu(gate(x)) * up(x)); grouped-query attention by expanding the key/value heads, then
`scaled_dot_product_attention(is_causal=True)`. No biases, no dropout.

The rotary tables (cos and sin for every position up to the context) are non-persistent float32
buffers: they move with `.to(device)` and never appear in `state_dict()`. Keep the parameters in
float32 and use `torch.autocast` for bfloat16 compute; casting the whole module to a low precision
also casts these tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama model, with Hugging Face's field names and meanings.

    `max_position_embeddings` is the context length. `head_dim` None means
    hidden_size // num_attention_heads (`resolved_head_dim`); an explicit head_dim equal to that is
    stored as None, so configs of the same model compare equal and `dataclasses.replace` of
    hidden_size or num_attention_heads keeps the default. Raises ValueError, naming the field.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    head_dim: int | None = None
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in (field.name for field in fields(self)):
            value = getattr(self, name)
            if name == "tie_word_embeddings":
                if not isinstance(value, bool):
                    raise ValueError(f"{name} must be a bool, got {value!r}")
            elif name in ("rms_norm_eps", "rope_theta", "initializer_range"):
                _check_number(name, value, allow_zero=name == "initializer_range")
            elif not (name == "head_dim" and value is None):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive int, got {value!r}")
        # transformers refuses this even when head_dim is given; so do we, to stay loadable there.
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.head_dim == self.hidden_size // self.num_attention_heads:
            object.__setattr__(self, "head_dim", None)
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary pairs): {self.resolved_head_dim}")

    @property
    def resolved_head_dim(self) -> int:
        """The width of each attention head."""
        if self.head_dim is None:
            return self.hidden_size // self.num_attention_heads
        return self.head_dim

    def num_parameters(self) -> int:
        """Scalars in the model, a tied head counted once: `flat.param_count(Llama(self))`."""
        hidden, head_dim = self.hidden_size, self.resolved_head_dim
        attention = 2 * hidden * head_dim * (self.num_attention_heads + self.num_key_value_heads)
        layer = attention + 3 * hidden * self.intermediate_size + 2 * hidden
        embeddings = self.vocab_size * hidden * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + hidden


def _check_number(name: str, value: object, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        sign = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {sign}, got {value!r}")


LLAMA_PRESETS: dict[str, LlamaConfig] = {
    # 252,384 parameters: a byte-level model for tests.
    "tiny": LlamaConfig(
        vocab_size=256, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    ),
    # 19,996,928 parameters, deep and narrow; the tied embedding is 8.2M of them.
    "20m": LlamaConfig(
        vocab_size=32000, hidden_size=256, intermediate_size=704, num_hidden_layers=16,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # 149,840,640 parameters.
    "150m": LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=16,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
    ),
    # 1,100,048,384 parameters: TinyLlama-1.1B's shapes.
    "1b": LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
    ),
}


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even under autocast, then cast back before scaling: as transformers.
        input_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(input_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (max_position_embeddings, head_dim) float32, as transformers has them."""
    head_dim = config.resolved_head_dim
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.resolved_head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        hidden, head_dim = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=False)

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, kv_heads, time, head_dim) -> (batch, heads, time, head_dim): each kv head
        repeated for its group of consecutive query heads (transformers' repeat_kv)."""
        batch, kv_heads, time, head_dim = x.shape
        groups = self.num_heads // kv_heads
        if groups == 1:
            return x
        x = x[:, :, None].expand(batch, kv_heads, groups, time, head_dim)
        return x.reshape(batch, kv_heads * groups, time, head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # (batch, time, heads * head_dim) -> (batch, heads, time, head_dim)
        q = self.q_proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self._expand_kv(k), self._expand_kv(v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, time, -1))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        # Registration order is transformers' order, hence the parameters() (flat vector) order.
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder stack without the head: transformers' `LlamaModel` (the `model.` prefix)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layers = (LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.layers = nn.ModuleList(layers)
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)


class Llama(nn.Module):
    """Causal language model. Deterministic given `torch.manual_seed` before building.

    With `activation_checkpointing` (settable later) each decoder layer's activations are recomputed
    in the backward pass instead of stored, while training: same loss and gradients, less memory.
    """

    def __init__(self, config: LlamaConfig, *, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.config = config
        self.activation_checkpointing = activation_checkpointing
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # one Parameter, counted once
        self._init_weights()

    def _init_weights(self) -> None:
        """transformers' init: normal(0, initializer_range) for every matrix, ones for norms."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, self.config.initializer_range)
                elif isinstance(module, LlamaRMSNorm):
                    module.weight.fill_(1.0)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Float32 logits (batch, time, vocab) and, with `targets`, the mean cross-entropy in nats
        per token over `targets.reshape(-1)`. Raises ValueError if time exceeds the context."""
        _, time = idx.shape
        if time > self.config.max_position_embeddings:
            context = self.config.max_position_embeddings
            raise ValueError(f"sequence of {time} tokens exceeds the context {context}")
        cos, sin = self.model.rope_cos[:time], self.model.rope_sin[:time]
        x = self.model.embed_tokens(idx)
        checkpointing = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.model.layers:
            if checkpointing:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x)).float()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
