"""Hugging Face-compatible Llama checkpoints: read transformers' safetensors, export what it loads.

Theory of operation. A checkpoint directory in transformers' layout holds `config.json` and either
`model.safetensors` or a sharded `model.safetensors.index.json` plus its shards. Our `Llama` has
transformers' parameter names, so a checkpoint maps onto it by name alone; the work here is
refusing, before any tensor data is read, everything that would not map exactly:

* `config_from_hf` accepts only what `Llama` computes (silu, no biases, default RoPE, no attention
  dropout) and raises `LlamaCheckpointError` for anything else, rather than load a model that
  would silently compute something different from the original.
* `read_pretrained` opens the safetensors files (never pickle), reads only their headers to check
  every tensor's name, shape and dtype against `expected_layout(config)`, and only then loads the
  data, as float32.
* With tied embeddings transformers writes no `lm_head.weight`; one that is present must equal the
  embedding, and is dropped.

`export_files` is the inverse: the bytes of the files of a directory that
`LlamaForCausalLM.from_pretrained` loads. It writes nothing: the caller writes each file
(atomically).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from .model import Llama, LlamaConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SUPPORTED_DTYPES = frozenset({"F32", "F16", "BF16"})
EMBEDDING = "model.embed_tokens.weight"
HEAD = "lm_head.weight"
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)


class LlamaCheckpointError(ValueError):
    """A checkpoint or config this model cannot load exactly; the message names the culprit."""


def config_to_hf(
    config: LlamaConfig, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    """The config.json transformers writes for a `LlamaForCausalLM` of `config`.

    RoPE is stated both ways: `rope_parameters` (transformers 5) and top-level `rope_theta`
    (transformers 4); each version reads its own and tolerates the other.
    """
    for name, token in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
        if token is not None and not (isinstance(token, int) and 0 <= token < config.vocab_size):
            raise ValueError(
                f"{name} must be None or a token id below {config.vocab_size}, got {token!r}"
            )
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.resolved_head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_word_embeddings,
        "initializer_range": config.initializer_range,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def config_from_hf(mapping: Mapping[str, Any]) -> LlamaConfig:
    """The `LlamaConfig` of a transformers Llama config.json (parsed).

    Keys transformers treats as optional take transformers' defaults (rms_norm_eps 1e-6,
    num_key_value_heads = num_attention_heads, rope_theta 10000, untied). Raises
    LlamaCheckpointError for a missing required key, a value of the wrong type, or a feature this
    model does not implement.
    """
    if not isinstance(mapping, Mapping):
        raise LlamaCheckpointError(f"config must be a JSON object, got {type(mapping).__name__}")
    missing = [key for key in _REQUIRED_KEYS if key not in mapping]
    if missing:
        raise LlamaCheckpointError(f"config lacks required key(s): {', '.join(missing)}")
    _refuse_unsupported(mapping)
    values = {key: mapping[key] for key in _REQUIRED_KEYS}
    kv_heads = mapping.get("num_key_value_heads")
    values["num_key_value_heads"] = mapping["num_attention_heads"] if kv_heads is None else kv_heads
    values["head_dim"] = mapping.get("head_dim")
    values["rms_norm_eps"] = mapping.get("rms_norm_eps", 1e-6)
    values["rope_theta"] = _rope_theta(mapping)
    values["tie_word_embeddings"] = mapping.get("tie_word_embeddings", False)
    values["initializer_range"] = mapping.get("initializer_range", 0.02)
    try:
        return LlamaConfig(**values)
    except ValueError as error:
        raise LlamaCheckpointError(f"config: {error}") from None


def _refuse_unsupported(mapping: Mapping[str, Any]) -> None:
    model_type = mapping.get("model_type", "llama")
    if model_type != "llama":
        raise LlamaCheckpointError(f"config: model_type must be 'llama', got {model_type!r}")
    hidden_act = mapping.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise LlamaCheckpointError(f"config: hidden_act {hidden_act!r} is not supported (silu is)")
    for key in ("attention_bias", "mlp_bias"):
        if mapping.get(key, False) is not False:
            raise LlamaCheckpointError(f"config: {key} must be false (no biases): {mapping[key]!r}")
    dropout = mapping.get("attention_dropout", 0.0)
    if isinstance(dropout, bool) or dropout not in (0, 0.0):
        raise LlamaCheckpointError(f"config: attention_dropout must be 0, got {dropout!r}")
    if mapping.get("partial_rotary_factor", 1.0) != 1.0:
        raise LlamaCheckpointError("config: partial_rotary_factor must be 1")
    for key in ("rope_scaling", "rope_parameters"):
        rope = mapping.get(key)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise LlamaCheckpointError(f"config: {key} must be an object or null, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise LlamaCheckpointError(
                f"config: {key} type {rope_type!r} is not supported (only the default RoPE)"
            )
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise LlamaCheckpointError(f"config: {key}.partial_rotary_factor must be 1")


def _rope_theta(mapping: Mapping[str, Any]) -> Any:
    """transformers' precedence: the RoPE dict's rope_theta, then the top-level one, then 10000."""
    rope = mapping.get("rope_scaling") or mapping.get("rope_parameters") or {}
    return rope.get("rope_theta", mapping.get("rope_theta", 10000.0))


def expected_layout(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of `config` holds, in `parameters()` order:
    exactly `Llama(config).named_parameters()`. With tied embeddings there is no
    `lm_head.weight`."""
    hidden, head_dim = config.hidden_size, config.resolved_head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    layout = {EMBEDDING: (config.vocab_size, hidden)}
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}."
        layout[prefix + "self_attn.q_proj.weight"] = (q_width, hidden)
        layout[prefix + "self_attn.k_proj.weight"] = (kv_width, hidden)
        layout[prefix + "self_attn.v_proj.weight"] = (kv_width, hidden)
        layout[prefix + "self_attn.o_proj.weight"] = (hidden, q_width)
        layout[prefix + "mlp.gate_proj.weight"] = (config.intermediate_size, hidden)
        layout[prefix + "mlp.up_proj.weight"] = (config.intermediate_size, hidden)
        layout[prefix + "mlp.down_proj.weight"] = (hidden, config.intermediate_size)
        layout[prefix + "input_layernorm.weight"] = (hidden,)
        layout[prefix + "post_attention_layernorm.weight"] = (hidden,)
    layout["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        layout[HEAD] = (config.vocab_size, hidden)
    return layout


def read_pretrained(
    path: str | os.PathLike[str], config: LlamaConfig | None = None
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """The config and float32 tensors (keys and order of `expected_layout`) of a checkpoint.

    `path` is a transformers checkpoint directory (config.json, then model.safetensors or a sharded
    index), or one .safetensors file, for which `config` is required. Given a directory, `config`,
    if given, must equal the one in config.json. Every tensor's name, shape and dtype (float32,
    float16 or bfloat16) is checked before any data is read. Raises LlamaCheckpointError.
    """
    path = Path(path)
    if path.is_dir():
        found = config_from_hf(_read_json(path / CONFIG_NAME))
        if config is not None and config != found:
            raise LlamaCheckpointError(
                f"{path / CONFIG_NAME} is not the given config: {_diff(found, config)}"
            )
        config, files = found, _weight_files(path)
    elif path.is_file():
        if config is None:
            raise LlamaCheckpointError(f"{path}: a single safetensors file needs a config")
        files = {path: None}
    else:
        raise LlamaCheckpointError(f"{path}: no such file or directory")
    with ExitStack() as stack:
        located = _locate(files, stack)
        _check_layout(config, located)
        tensors = {
            name: handle.get_tensor(name).to(torch.float32) for name, (_, handle) in located.items()
        }
    return config, _untie(config, tensors)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LlamaCheckpointError(f"{path}: not a readable JSON file: {error}") from None


def _weight_files(directory: Path) -> dict[Path, set[str] | None]:
    """Each safetensors file of a checkpoint directory -> the tensor names its index assigns it
    (None when there is no index: one unsharded file)."""
    if (directory / WEIGHTS_NAME).is_file():
        return {directory / WEIGHTS_NAME: None}
    if not (directory / INDEX_NAME).is_file():
        raise LlamaCheckpointError(
            f"{directory}: holds neither {WEIGHTS_NAME} nor {INDEX_NAME} "
            "(pickle formats are never read)"
        )
    index = _read_json(directory / INDEX_NAME)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise LlamaCheckpointError(
            f"{directory / INDEX_NAME}: weight_map must map tensor names to file names"
        )
    files: dict[Path, set[str] | None] = {}
    for name, shard in weight_map.items():
        # A shard is a file beside the index, never a path that leaves the directory.
        if shard != Path(shard).name or shard in ("", ".", ".."):
            raise LlamaCheckpointError(
                f"{directory / INDEX_NAME}: shard {shard!r} of {name!r} is not a plain file name"
            )
        files.setdefault(directory / shard, set()).add(name)
    return files


def _locate(files: Mapping[Path, set[str] | None], stack: ExitStack) -> dict[str, tuple[Path, Any]]:
    """Open every file (closed with `stack`); tensor name -> (file, open handle). Refuses a name in
    two files, or a file whose names differ from those its index assigns it."""
    located: dict[str, tuple[Path, Any]] = {}
    for file, assigned in files.items():
        try:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
        except Exception as error:  # noqa: BLE001 - safetensors raises its own SafetensorError, or OSError
            message = f"{file}: not a readable safetensors file: {error}"
            raise LlamaCheckpointError(message) from None
        names = set(handle.keys())
        for name in sorted(names):
            if name in located:
                raise LlamaCheckpointError(f"tensor {name!r} is in {located[name][0]} and {file}")
            if assigned is not None and name not in assigned:
                raise LlamaCheckpointError(
                    f"{file}: tensor {name!r} is not assigned to this shard by the index"
                )
            located[name] = (file, handle)
        lacking = sorted(assigned - names) if assigned is not None else []
        if lacking:
            raise LlamaCheckpointError(
                f"{file}: lacks tensor {lacking[0]!r}, which the index assigns it"
            )
    return located


def _check_layout(config: LlamaConfig, located: Mapping[str, tuple[Path, Any]]) -> None:
    layout = expected_layout(config)
    allowed = dict(layout)
    if config.tie_word_embeddings:
        allowed[HEAD] = layout[EMBEDDING]  # optional copy of the tied embedding
    for name, (file, handle) in located.items():
        if name not in allowed:
            raise LlamaCheckpointError(
                f"{file}: unexpected tensor {name!r} (not part of this Llama config)"
            )
        header = handle.get_slice(name)
        shape, dtype = tuple(header.get_shape()), header.get_dtype()
        if shape != allowed[name]:
            raise LlamaCheckpointError(
                f"{file}: tensor {name!r} has shape {shape}, expected {allowed[name]}"
            )
        if dtype not in SUPPORTED_DTYPES:
            raise LlamaCheckpointError(
                f"{file}: tensor {name!r} has dtype {dtype}, "
                f"expected one of {', '.join(sorted(SUPPORTED_DTYPES))}"
            )
    missing = [name for name in layout if name not in located]
    if missing:
        shown = ", ".join(repr(name) for name in missing[:5])
        raise LlamaCheckpointError(f"checkpoint lacks {len(missing)} tensor(s): {shown}")


def _untie(config: LlamaConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors in `expected_layout` order, less a tied head (which must equal the embedding)."""
    if config.tie_word_embeddings and HEAD in tensors:
        if not torch.equal(tensors[HEAD], tensors[EMBEDDING]):
            raise LlamaCheckpointError(
                f"tensor {HEAD!r} differs from {EMBEDDING!r}, but the embeddings are tied"
            )
    return {name: tensors[name] for name in expected_layout(config)}


def load_into(model: Llama, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` into `model`'s parameters. Strict: the names must be exactly those of
    `model.named_parameters()` (no tied `lm_head.weight`) and every shape must match; otherwise
    LlamaCheckpointError and `model` is left untouched."""
    parameters = dict(model.named_parameters())
    unexpected = sorted(set(tensors) - set(parameters))
    missing = [name for name in parameters if name not in tensors]
    if unexpected or missing:
        raise LlamaCheckpointError(
            f"tensors do not match the model: unexpected {unexpected[:5]}, missing {missing[:5]}"
        )
    for name, parameter in parameters.items():
        if tuple(tensors[name].shape) != tuple(parameter.shape):
            raise LlamaCheckpointError(
                f"tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"the model expects {tuple(parameter.shape)}"
            )
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(tensors[name])


def export_files(
    model: Llama,
    *,
    tokenizer_json: bytes | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, bytes]:
    """File name -> contents of a directory `transformers.LlamaForCausalLM.from_pretrained` loads:
    config.json and model.safetensors (contiguous float32, tied head omitted, as transformers
    saves it). With `tokenizer_json` (a tokenizers JSON document), also tokenizer.json and a
    minimal tokenizer_config.json, so that AutoTokenizer loads it as a fast tokenizer."""
    config = model.config
    tensors = {
        name: parameter.detach().to("cpu", torch.float32).contiguous()
        for name, parameter in model.named_parameters()
    }
    hf_config = config_to_hf(config, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    files = {
        CONFIG_NAME: _json_bytes(hf_config),
        WEIGHTS_NAME: save_safetensors(tensors, metadata={"format": "pt"}),
    }
    if tokenizer_json is not None:
        try:
            document = json.loads(tokenizer_json)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"tokenizer_json is not JSON: {error}") from None
        if not isinstance(document, dict):
            raise ValueError("tokenizer_json must be a JSON object (a tokenizers document)")
        files["tokenizer.json"] = bytes(tokenizer_json)
        files["tokenizer_config.json"] = _json_bytes(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": config.max_position_embeddings,
            }
        )
    return files


def _diff(found: LlamaConfig, given: LlamaConfig) -> str:
    """The fields in which two configs differ, as `name found != given`."""
    return ", ".join(
        f"{field.name} {getattr(found, field.name)!r} != {getattr(given, field.name)!r}"
        for field in fields(LlamaConfig)
        if getattr(found, field.name) != getattr(given, field.name)
    )


def _json_bytes(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
