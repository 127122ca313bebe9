"""Hugging Face checkpoints: transformers' Llama and ours load each other's files and agree on the
logits; malformed checkpoints and unsupported configs are refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from locomesh.training.llama import (
    Llama,
    LlamaCheckpointError,
    LlamaConfig,
    config_from_hf,
    config_to_hf,
    expected_layout,
    export_files,
    load_into,
    read_pretrained,
)

# GQA, a head_dim other than hidden/heads, and non-default theta and eps: each would show in the
# logits if it were read or applied wrongly.
CONFIG = LlamaConfig(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=24,
    rms_norm_eps=1e-6,
    rope_theta=500.0,
)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that every tensor (norms included) moves the logits visibly."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.3
            parameter.copy_(noise + 1.0 if parameter.dim() == 1 else noise)  # norms near 1


def _transformers_model(config: LlamaConfig, seed: int = 0) -> transformers.LlamaForCausalLM:
    kwargs = _transformers_kwargs(config)
    hf_config = transformers.LlamaConfig(**kwargs, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config)
    _randomise(model, seed)
    return model.eval()


def _transformers_kwargs(config: LlamaConfig) -> dict:
    """transformers.LlamaConfig arguments built by hand, independently of config_to_hf."""
    return {
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
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def _ours(config: LlamaConfig, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(config)
    _randomise(model, seed)
    return model.eval()


def _tokens(config: LlamaConfig = CONFIG) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    shape = (3, config.max_position_embeddings)
    return torch.randint(0, config.vocab_size, shape, generator=generator)


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, contents in files.items():
        (directory / name).write_bytes(contents)
    return directory


def _same_logits(ours: Llama, theirs: transformers.LlamaForCausalLM) -> None:
    tokens = _tokens(ours.config)
    with torch.no_grad():
        expected = theirs(tokens).logits
        actual = ours(tokens)[0]
    assert expected.abs().max() > 1.0  # a comparison of near-zero logits would prove little
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_checkpoint_loads_with_the_same_logits(tmp_path, tied):
    config = dataclasses.replace(CONFIG, tie_word_embeddings=tied)
    theirs = _transformers_model(config)
    theirs.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    read_config, tensors = read_pretrained(tmp_path)
    assert read_config == config
    assert list(tensors) == list(expected_layout(config))
    assert all(tensor.dtype == torch.float32 for tensor in tensors.values())
    ours = Llama(read_config).eval()
    load_into(ours, tensors)
    _same_logits(ours, theirs)


def test_sharded_checkpoint_reads_like_the_single_file(tmp_path):
    theirs = _transformers_model(CONFIG)
    theirs.save_pretrained(tmp_path / "single")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    _, single = read_pretrained(tmp_path / "single")
    _, sharded = read_pretrained(tmp_path / "sharded")
    assert list(sharded) == list(single)
    assert all(torch.equal(sharded[name], single[name]) for name in single)


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, tied):
    config = dataclasses.replace(CONFIG, tie_word_embeddings=tied)
    ours = _ours(config)
    files = export_files(ours, bos_token_id=1, eos_token_id=2)
    assert set(files) == {"config.json", "model.safetensors"}
    directory = _write(tmp_path, files)
    theirs = transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation="eager")
    theirs.eval()
    assert theirs.config.bos_token_id == 1 and theirs.config.eos_token_id == 2
    assert (theirs.lm_head.weight is theirs.model.embed_tokens.weight) == tied
    _same_logits(ours, theirs)
    # ...and our own reader takes it back, bit for bit.
    read_config, tensors = read_pretrained(tmp_path, config=config)
    assert read_config == config
    assert all(torch.equal(tensors[name], parameter) for name, parameter in ours.named_parameters())


def test_config_round_trips_and_transformers_4_style_config_reads(tmp_path):
    assert config_from_hf(config_to_hf(CONFIG)) == CONFIG
    # transformers 4 wrote rope_theta at the top level, rope_scaling null, torch_dtype, no head_dim.
    legacy = config_to_hf(dataclasses.replace(CONFIG, head_dim=None))
    for key in ("rope_parameters", "head_dim", "dtype", "rms_norm_eps"):
        del legacy[key]
    parsed = config_from_hf(legacy)
    assert parsed.rope_theta == 500.0 and parsed.resolved_head_dim == 8
    assert parsed.rms_norm_eps == 1e-6  # transformers' default when the key is absent


def test_tokenizer_files_are_included_and_load(tmp_path):
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(["the mesh trains the model"], trainer)
    document = tokenizer.to_str().encode()
    files = export_files(_ours(CONFIG), tokenizer_json=document)
    assert files["tokenizer.json"] == document
    directory = _write(tmp_path, files)
    expected = tokenizer.encode("the model trains").ids
    loaded = transformers.AutoTokenizer.from_pretrained(directory)
    assert loaded("the model trains", add_special_tokens=False).input_ids == expected
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    assert fast("the model trains").input_ids == expected
    with pytest.raises(ValueError, match="tokenizer_json"):
        export_files(_ours(CONFIG), tokenizer_json=b"not json")


def test_half_precision_tensors_are_returned_as_float32(tmp_path):
    layout = expected_layout(CONFIG)
    tensors = {name: torch.ones(shape, dtype=torch.bfloat16) / 3 for name, shape in layout.items()}
    save_file(tensors, tmp_path / "weights.safetensors")
    _, read = read_pretrained(tmp_path / "weights.safetensors", config=CONFIG)
    assert list(read) == list(layout)
    for name, tensor in read.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, tensors[name].float())


def _checkpoint(tmp_path: Path, config: LlamaConfig = CONFIG, **edits) -> dict[str, torch.Tensor]:
    """A valid checkpoint's tensors with `edits` applied (name -> tensor, or None to drop it)."""
    tensors = {name: p.detach().clone() for name, p in _ours(config).named_parameters()}
    for name, tensor in edits.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(config)))
    save_file(tensors, tmp_path / "model.safetensors")
    return tensors


@pytest.mark.parametrize(
    ("edits", "match"),
    [
        (
            {"model.layers.0.self_attn.rotary.weight": torch.zeros(3)},
            "unexpected tensor 'model.layers.0.self_attn.rotary.weight'",
        ),
        (
            {"model.layers.1.mlp.up_proj.weight": torch.zeros(40, 33)},
            r"'model.layers.1.mlp.up_proj.weight' has shape \(40, 33\), expected \(40, 32\)",
        ),
        ({"model.norm.weight": None}, "lacks 1 tensor.*'model.norm.weight'"),
        ({"model.norm.weight": torch.ones(32).double()}, "'model.norm.weight' has dtype F64"),
        (
            {"model.layers.0.self_attn.k_proj.bias": torch.zeros(32)},
            "unexpected tensor 'model.layers.0.self_attn.k_proj.bias'",
        ),
    ],
)
def test_malformed_tensors_are_refused_by_name(tmp_path, edits, match):
    _checkpoint(tmp_path, **edits)
    with pytest.raises(LlamaCheckpointError, match=match):
        read_pretrained(tmp_path)


def test_tied_head_may_be_present_only_as_a_copy_of_the_embedding(tmp_path):
    tied = dataclasses.replace(CONFIG, tie_word_embeddings=True)
    tensors = _checkpoint(tmp_path, tied)
    _checkpoint(tmp_path, tied, **{"lm_head.weight": tensors["model.embed_tokens.weight"].clone()})
    _, read = read_pretrained(tmp_path)
    assert "lm_head.weight" not in read
    _checkpoint(tmp_path, tied, **{"lm_head.weight": torch.zeros(61, 32)})
    with pytest.raises(LlamaCheckpointError, match="'lm_head.weight' differs"):
        read_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0}},
            "rope_parameters type 'llama3'",
        ),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear'"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"model_type": "mistral"}, "model_type"),
        ({"hidden_size": "32"}, "hidden_size"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_unsupported_configs_are_refused(tmp_path, changes, match):
    _checkpoint(tmp_path)
    document = {**config_to_hf(CONFIG), **changes}
    (tmp_path / "config.json").write_text(json.dumps(document))
    with pytest.raises(LlamaCheckpointError, match=match):
        read_pretrained(tmp_path)


def test_missing_config_keys_and_files_are_refused(tmp_path):
    document = config_to_hf(CONFIG)
    del document["num_hidden_layers"]
    with pytest.raises(LlamaCheckpointError, match="num_hidden_layers"):
        config_from_hf(document)
    with pytest.raises(LlamaCheckpointError, match="config.json"):
        read_pretrained(tmp_path)  # empty directory
    _checkpoint(tmp_path)
    with pytest.raises(LlamaCheckpointError, match="needs a config"):
        read_pretrained(tmp_path / "model.safetensors")
    with pytest.raises(LlamaCheckpointError, match="not the given"):
        read_pretrained(tmp_path, config=dataclasses.replace(CONFIG, rope_theta=10000.0))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(LlamaCheckpointError, match="model.safetensors: not a readable safetensors"):
        read_pretrained(tmp_path)


def test_sharded_index_is_checked(tmp_path):
    tensors = _checkpoint(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "shard-1.safetensors")
    weight_map = {name: "shard-1.safetensors" for name in tensors}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    assert list(read_pretrained(tmp_path)[1]) == list(tensors)
    escaping = {**weight_map, "model.norm.weight": "../shard-1.safetensors"}
    index.write_text(json.dumps({"weight_map": escaping}))
    with pytest.raises(LlamaCheckpointError, match="not a plain file name"):
        read_pretrained(tmp_path)
    del weight_map["model.norm.weight"]
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(LlamaCheckpointError, match="'model.norm.weight' is not assigned to this"):
        read_pretrained(tmp_path)


def test_load_into_is_strict_and_leaves_the_model_untouched_on_error():
    model = _ours(CONFIG)
    before = {name: parameter.clone() for name, parameter in model.named_parameters()}
    tensors = {name: torch.zeros_like(parameter) for name, parameter in model.named_parameters()}
    for bad, match in (
        ({**tensors, "lm_head.bias": torch.zeros(61)}, "unexpected"),
        ({name: t for name, t in tensors.items() if name != "lm_head.weight"}, "missing"),
        ({**tensors, "model.norm.weight": torch.zeros(31)}, "model.norm.weight"),
    ):
        with pytest.raises(LlamaCheckpointError, match=match):
            load_into(model, bad)
        assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
    load_into(model, tensors)
    assert all(not p.any() for p in model.parameters())
