"""The `llama` task: its config, its data (a round's shards, the held-out set), its initial weights
and its export, through the participant the daemon drives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from locomesh.node.datasets.store import load_index, load_shard, load_tokenizer
from locomesh.training.flat import flatten, unflatten_into
from locomesh.training.participant import Participant
from locomesh.training.run_settings import ParticipantError, RunSettingsError, check_task
from locomesh.training.tasks import TaskError, get_task
from tests.corpus import pack_corpus

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 32, "vocab_size": 128}
KEY = b"\x07" * 32


def body(task_config: dict, **hparams) -> dict:
    return {"task": "llama", "task_config": {**SMALL, **task_config}, "seed": 5,
            "hparams": {"inner_steps": 4, "batch_size": 4, "inner_lr": 3e-3, **hparams}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    packed = pack_corpus(store, tmp_path_factory.mktemp("corpus"), count=300, shard_tokens=256)
    index = load_index(store, packed.id)
    return {"store": store, "id": packed.id, "index": index,
            "train": [load_shard(store, index, shard) for shard in index.train],
            "heldout": [load_shard(store, index, shard) for shard in index.heldout]}


@pytest.mark.parametrize("config, message", [
    ({"hidden_layers": 2}, "unknown setting 'hidden_layers': did you mean 'num_hidden_layers'"),
    ({"preset": "huge"}, "unknown preset 'huge'"),
    ({"hidden_size": "64"}, "'hidden_size' must be int"),
    ({"tie_word_embeddings": 1}, "'tie_word_embeddings' must be bool"),
    ({"dataset": "abc"}, "dataset must be a 64-hex-digit ID"),
    ({"init": "zz" * 32}, "init must be a 64-hex-digit ID"),
    ({"sequence_length": 64}, "sequence_length 64 exceeds the model's context 32"),
    ({"num_attention_heads": 5}, "task 'llama'"),
])
def test_a_bad_config_is_refused_with_its_reason(config, message):
    with pytest.raises(RunSettingsError, match=message):
        check_task("llama", {**SMALL, **config})


def test_without_a_dataset_it_trains_on_a_markov_source_and_the_eval_loss_falls():
    participant = Participant.for_run(body({}, inner_steps=10, inner_lr=1e-2), KEY)
    before = participant.evaluate()
    for _ in range(3):
        contribution = participant.train()
        participant.aggregate({KEY: contribution.payload})
    after = participant.evaluate()
    assert after["loss"] < before["loss"] - 0.5, (before, after)
    assert after["floor"] is not None and after["loss"] > after["floor"]


def test_a_round_reads_its_shards_in_order_each_token_once_then_from_the_start():
    task = get_task("llama", SMALL)
    shards = [np.arange(i * 100, (i + 1) * 100, dtype=np.uint16) for i in range(2)]  # 200 tokens: 6 windows of 33
    batches = task.round_batches(shards, batch_size=2)
    seen = [next(batches) for _ in range(4)]
    windows = [torch.cat([inputs, targets[:, -1:]], dim=1) for inputs, targets in seen]
    flat = torch.cat([w.reshape(-1) for w in windows[:3]])
    assert flat.tolist() == list(range(198)), "three batches of two windows: the first 198 tokens in order"
    assert torch.equal(windows[3], windows[0]), "past the last whole batch, the round starts again"
    with pytest.raises(TaskError, match="less than one batch"):
        next(task.round_batches(shards[:1], batch_size=4))


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_before_training(dataset):
    participant = Participant.for_run(body({"dataset": dataset["id"].hex(), "vocab_size": 64}), KEY)
    assert dataset["index"].vocab_size > 64
    with pytest.raises(ParticipantError, match=f"tokenizer has {dataset['index'].vocab_size} tokens; the model embeds only 64"):
        participant.attach_data(dataset["index"], dataset["heldout"], None)


def test_with_a_dataset_it_trains_only_on_the_shards_it_is_given(dataset):
    participant = Participant.for_run(body({"dataset": dataset["id"].hex()}, inner_steps=20, inner_lr=1e-2), KEY)
    with pytest.raises(ParticipantError, match="needs the shards it assigned"):
        participant.train()
    participant.attach_data(dataset["index"], dataset["heldout"], None)
    assert participant.data_needs().tokens_per_round == 20 * 4 * 33
    before = participant.evaluate()
    assert before["floor"] is None
    for round_number in range(3):
        contribution = participant.train(data=dataset["train"][2 * round_number: 2 * round_number + 2])
        participant.aggregate({KEY: contribution.payload})
    assert participant.evaluate()["loss"] < before["loss"] - 1.0


def test_a_run_starts_from_the_initial_weights_it_is_given():
    participant = Participant.for_run(body({"init": "11" * 32}), KEY)
    model = get_task("llama", SMALL).build_model(99)
    tensors = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    assert set(tensors) == set(participant.task.weight_layout())
    limits = participant.data_needs().init_limits
    assert set(limits.tensors) == set(tensors) and limits.metadata["kind"] == "init"
    participant.attach_data(None, [], tensors)
    assert np.array_equal(participant.outer.theta, flatten(model))
    wrong = {**tensors, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ParticipantError, match="do not fit the model"):
        Participant.for_run(body({"init": "11" * 32}), KEY).attach_data(None, [], wrong)


def test_the_exported_model_loads_in_transformers_with_the_same_logits(dataset, tmp_path):
    participant = Participant.for_run(body({"dataset": dataset["id"].hex()}), KEY)
    participant.attach_data(dataset["index"], dataset["heldout"], None)
    participant.aggregate({KEY: participant.train(data=dataset["train"][:2]).payload})
    files = participant.export_files(load_tokenizer(dataset["store"], dataset["index"]))
    for name, contents in files.items():
        (tmp_path / name).write_bytes(contents)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ours = participant.task.build_model(0).eval()
    unflatten_into(ours, participant.outer.theta)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)("the quick fox")["input_ids"]
    inputs = torch.from_numpy(dataset["heldout"][0][:32].astype(np.int64))[None]
    with torch.no_grad():
        assert torch.allclose(theirs(inputs).logits, ours(inputs)[0], atol=1e-5)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
