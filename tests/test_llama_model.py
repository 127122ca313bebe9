"""The Llama decoder: it learns; its shapes, parameter count, checkpointing and config checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from locomesh.training.flat import flatten, param_count, unflatten_into
from locomesh.training.llama import LLAMA_PRESETS, Llama, LlamaConfig

SMALL = LlamaConfig(
    vocab_size=48,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)


def _model(config: LlamaConfig = SMALL, seed: int = 0, **kwargs) -> Llama:
    torch.manual_seed(seed)
    return Llama(config, **kwargs)


def _batch(config: LlamaConfig = SMALL, seed: int = 1, batch: int = 4, time: int = 16):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch, time + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def test_tiny_model_learns_a_periodic_stream():
    # A fixed random period-12 sequence: after one period the next token is fully determined,
    # so a working causal model drives the loss far below the uniform log(vocab).
    config = LLAMA_PRESETS["tiny"]
    period = torch.randint(0, config.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    stream = period.repeat(40)
    starts = torch.arange(0, 8 * 13, 13)
    windows = torch.stack([stream[start : start + 33] for start in starts.tolist()])
    inputs, targets = windows[:, :-1], windows[:, 1:]
    model = _model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(30):
        _, loss = model(inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(np.log(config.vocab_size), abs=0.3)
    assert losses[-1] < 1.0  # from about 5.5: the model has learned the stream


def test_logits_shape_and_loss_contract():
    model = _model()
    inputs, targets = _batch()
    logits, loss = model(inputs, targets)
    assert logits.shape == (4, 16, SMALL.vocab_size) and logits.dtype == torch.float32
    flat_logits = logits.reshape(-1, SMALL.vocab_size)
    expected = torch.nn.functional.cross_entropy(flat_logits, targets.reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert model(inputs)[1] is None


def test_grouped_query_attention_shapes_and_causality():
    config = dataclasses.replace(SMALL, num_attention_heads=8, num_key_value_heads=2, head_dim=6)
    model = _model(config).eval()
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (8 * 6, 32)
    assert attention.k_proj.weight.shape == attention.v_proj.weight.shape == (2 * 6, 32)
    assert attention.o_proj.weight.shape == (32, 8 * 6)
    inputs, _ = _batch(config)
    changed = inputs.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % config.vocab_size
    with torch.no_grad():
        before, after = model(inputs)[0], model(changed)[0]
    assert torch.equal(before[:, :10], after[:, :10])  # the past does not see the future
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_kv_heads_are_shared_by_consecutive_query_heads():
    # With one kv head per pair of query heads, query heads 2j and 2j+1 read kv head j, as in
    # transformers' repeat_kv (the layout its checkpoints were trained with).
    attention = _model().model.layers[0].self_attn
    kv = torch.randn(1, 2, 5, SMALL.resolved_head_dim, generator=torch.Generator().manual_seed(0))
    expanded = attention._expand_kv(kv)
    assert expanded.shape == (1, 4, 5, SMALL.resolved_head_dim)
    for head in range(4):
        assert torch.equal(expanded[:, head], kv[:, head // 2])


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_matches_config_and_tied_head_is_one_parameter(tied):
    config = dataclasses.replace(SMALL, tie_word_embeddings=tied)
    model = _model(config)
    assert param_count(model) == config.num_parameters()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    names = [name for name, _ in model.named_parameters()]
    assert ("lm_head.weight" in names) == (not tied)
    assert "lm_head.weight" in model.state_dict()  # transformers' state_dict keeps the alias too
    assert not any("rope" in key for key in model.state_dict())


def test_state_dict_keys_follow_transformers_names():
    keys = list(_model().state_dict())
    layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    expected = ["model.embed_tokens.weight"]
    expected += [f"model.layers.{i}.{name}" for i in range(2) for name in layer]
    expected += ["model.norm.weight", "lm_head.weight"]
    assert keys == expected


@pytest.mark.parametrize("name", sorted(LLAMA_PRESETS))
def test_presets_parameter_counts(name):
    expected = {"tiny": 252_384, "20m": 19_996_928, "150m": 149_840_640, "1b": 1_100_048_384}
    assert LLAMA_PRESETS[name].num_parameters() == expected[name]
    with torch.device("meta"):  # shapes without memory: even the 1b preset builds instantly
        assert param_count(Llama(LLAMA_PRESETS[name])) == expected[name]


def test_initialisation_is_deterministic_and_follows_transformers():
    first, second = flatten(_model(seed=7)), flatten(_model(seed=7))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, flatten(_model(seed=8)))
    config = dataclasses.replace(SMALL, vocab_size=4096, initializer_range=0.05)
    model = _model(config)
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert torch.equal(model.model.norm.weight, torch.ones(config.hidden_size))


def test_activation_checkpointing_gives_same_loss_and_gradients():
    inputs, targets = _batch()
    results = []
    for checkpointing in (False, True):
        model = _model(activation_checkpointing=checkpointing)
        _, loss = model(inputs, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_plain, grads_plain), (loss_ckpt, grads_ckpt) = results
    torch.testing.assert_close(loss_ckpt, loss_plain)
    for plain, ckpt in zip(grads_plain, grads_ckpt, strict=True):
        torch.testing.assert_close(ckpt, plain, rtol=1e-5, atol=1e-7)


def test_activation_checkpointing_recomputes_layers_in_backward():
    calls = []
    model = _model(activation_checkpointing=True)
    # A pre-hook: non-reentrant recomputation stops as soon as the last saved tensor is rebuilt,
    # before the module's forward returns.
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    inputs, targets = _batch()
    model(inputs, targets)[1].backward()
    assert len(calls) == 2  # forward, then the recomputation
    model.activation_checkpointing = False
    calls.clear()
    model(inputs, targets)[1].backward()
    assert len(calls) == 1


def test_bfloat16_autocast_gives_float32_logits_close_to_float32():
    model = _model().eval()
    inputs, targets = _batch()
    with torch.no_grad():
        reference = model(inputs)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = model(inputs, targets)
    assert logits.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(logits, reference, atol=0.05, rtol=0.05)


def test_context_overflow_raises():
    model = _model()
    with pytest.raises(ValueError, match="exceeds the context 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    assert model(torch.zeros(1, 32, dtype=torch.long))[0].shape == (1, 32, SMALL.vocab_size)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_size": -32}, "hidden_size"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
        ({"intermediate_size": True}, "intermediate_size"),
        ({"num_attention_heads": 5}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"head_dim": 7}, "head_dim"),
        ({"head_dim": 0}, "head_dim"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"rope_theta": float("inf")}, "rope_theta"),
        ({"initializer_range": -0.1}, "initializer_range"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ],
)
def test_config_validation_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(SMALL, **changes)


def test_head_dim_defaults_to_hidden_over_heads():
    assert SMALL.head_dim is None and SMALL.resolved_head_dim == 8
    assert dataclasses.replace(SMALL, head_dim=8) == SMALL  # the default, spelled out
    assert dataclasses.replace(SMALL, hidden_size=64).resolved_head_dim == 16
    assert dataclasses.replace(SMALL, head_dim=16).resolved_head_dim == 16


def test_flat_round_trip():
    model, other = _model(seed=0), _model(seed=1)
    vector = flatten(model)
    assert vector.size == SMALL.num_parameters()
    unflatten_into(other, vector)
    np.testing.assert_array_equal(flatten(other), vector)
    inputs, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(other(inputs)[0], model(inputs)[0], rtol=0, atol=0)


def test_rope_tables_follow_the_module_and_stay_out_of_the_state_dict():
    model = _model()
    buffers = dict(model.named_buffers())
    assert set(buffers) == {"model.rope_cos", "model.rope_sin"}
    assert buffers["model.rope_cos"].shape == (32, 8)
    assert buffers["model.rope_cos"].dtype == torch.float32
    model.to("meta")
    assert model.model.rope_cos.device.type == "meta"
