"""Two daemon processes on loopback train the llama task on a dataset one of them packed.

The packer holds the whole dataset; the joiner fetches the index, its tokenizer, a held-out shard
and, round by round, the shards each round assigns it, from the packer, every chunk verified. The
test checks the round assignment itself (disjoint, and what training/data/assignment.py gives for
the run's seed, the round and its two members), that the joiner never holds more of the dataset
than its rounds needed, that the eval loss falls, that the exported model loads in transformers,
and that a run created from a checkpoint transformers wrote starts from exactly that model. Bad
data on the way: a corrupted chunk is refused and its sender struck, and the join it held up goes
through once the chunk is whole again; a dataset nobody provides is a clear join error.
"""

from __future__ import annotations

import time

import pytest
import torch
import transformers

from locomesh.cli.client import RpcCallError
from locomesh.cli.swarm_cmd import join, start_swarm, stop_swarm, wait_connected
from locomesh.node.datadir import CHECKPOINT_DIR, IDENTITY_FILE, load_or_create_identity
from locomesh.node.datasets.store import load_index
from locomesh.node.rounds.service import DATA_UNAVAILABLE
from locomesh.node.transfer.store import chunk_path, has_checkpoint, read_stored_manifest
from locomesh.training.data.assignment import assignment
from tests.corpus import pack_corpus

SEED = 11
MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 32, "vocab_size": 128}
HPARAMS = {"inner_steps": 6, "batch_size": 4, "inner_lr": 1e-2, "min_peers": 2, "round_deadline_s": 60.0}
ROUNDS = 3


def status(daemon, run_id):
    return daemon.rpc().call("run.status", {"run_id": run_id})


def trained_rounds(state) -> set[int]:
    return {record["round"] for record in state["history"] if not record["synced"]}


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def swarm(tmp_path):
    packed = pack_corpus(tmp_path / "node0" / CHECKPOINT_DIR, tmp_path / "corpus", count=400, shard_tokens=200)
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 2, log=log)
    try:
        wait_connected(daemons)
        yield daemons, packed, tmp_path
    finally:
        stop_swarm(daemons)
        log.close()


def corrupt_a_chunk(store, checkpoint_id) -> tuple:
    path = chunk_path(store, read_stored_manifest(store, checkpoint_id).chunks[0].hash)
    original = path.read_bytes()
    path.write_bytes(bytes(byte ^ 0xFF for byte in original))
    return path, original


def test_two_daemons_share_a_dataset_and_each_trains_only_its_assigned_shards(swarm):
    (packer, joiner), packed, root = swarm
    stores = [root / name / CHECKPOINT_DIR for name in ("node0", "node1")]
    keys = [load_or_create_identity(root / name / IDENTITY_FILE).public_key for name in ("node0", "node1")]
    settings = {**MODEL, **HPARAMS, "dataset": packed.id.hex()}
    admitted = [joiner.rpc().call("node.status")["peer_id"]]  # a say from its join: round 1 trains with it
    params = {"task": "llama", "settings": settings, "public": True, "name": "llama", "seed": SEED, "admitted": admitted}
    run_id = packer.rpc(timeout=60).call("run.create", params)["run_id"]
    join(packer, run_id)

    # The joiner's first held-out shard comes from the packer, whose copy is damaged: refused, struck.
    heldout = packed.index.heldout[0]
    path, original = corrupt_a_chunk(stores[0], heldout)
    with pytest.raises(RpcCallError) as refused:
        join(joiner, run_id)
    assert refused.value.code == DATA_UNAVAILABLE and heldout.hex() in str(refused.value)
    packer_id = packer.rpc().call("node.status")["peer_id"]
    assert joiner.rpc().call("checkpoint.peers")[packer_id]["strikes"] >= 1
    assert not has_checkpoint(stores[1], heldout)
    path.write_bytes(original)  # whole again: the same join now goes through
    join(joiner, run_id)

    daemons = [packer, joiner]
    wait_until(lambda: all(len(trained_rounds(status(d, run_id))) >= ROUNDS for d in daemons), 240, f"{ROUNDS} rounds")
    states = [status(d, run_id) for d in daemons]

    index = load_index(stores[0], packed.id)
    per_member = states[0]["data"]["shards_per_member"]
    assert per_member == -(-HPARAMS["inner_steps"] * HPARAMS["batch_size"] * 33 // 200)
    both = sorted(trained_rounds(states[0]) & trained_rounds(states[1]))
    assert len(both) >= ROUNDS - 1
    for round_number in both:
        expected = assignment(len(index.train), SEED, round_number, keys, per_member)
        used = [state["data"]["rounds"][str(round_number)] for state in states]
        for key, shards in zip(keys, used):
            assert shards == [index.train[position].hex() for position in expected[key]], round_number
        assert not set(used[0]) & set(used[1]), "two peers trained on the same shard in one round"

    held = [shard for shard in index.train if has_checkpoint(stores[1], shard)]
    rounds_seen = len(states[1]["data"]["rounds"]) + 2  # and the next round's, prefetched
    assert 0 < len(held) <= rounds_seen * per_member < len(index.train), "the joiner fetched only what it trained on"

    losses = [record["eval_loss"] for record in states[1]["history"] if record["eval_loss"] is not None]
    assert losses[-1] < states[1]["initial_eval_loss"] - 0.3, losses

    exported = joiner.rpc(timeout=60).call("run.export", {"run_id": run_id, "directory": str(root / "export")})
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(exported["files"])
    model = transformers.LlamaForCausalLM.from_pretrained(root / "export")
    assert model.config.hidden_size == MODEL["hidden_size"]

    # A run that starts from a checkpoint transformers wrote: its round-0 model is that checkpoint.
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32, vocab_size=128)
    torch.manual_seed(0)
    pretrained = transformers.LlamaForCausalLM(config).eval()
    pretrained.save_pretrained(root / "pretrained")
    init_params = {**params, "settings": {**HPARAMS, "dataset": packed.id.hex()}, "init": str(root / "pretrained")}
    started = packer.rpc(timeout=60).call("run.create", init_params)["run_id"]
    join(packer, started)
    packer.rpc(timeout=60).call("run.export", {"run_id": started, "directory": str(root / "round0")})
    reloaded = transformers.LlamaForCausalLM.from_pretrained(root / "round0").eval()
    tokens = torch.arange(32)[None]
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, pretrained(tokens).logits)

    # A dataset nobody provides: a clear error at join, before anything trains.
    unknown = {**settings, "dataset": "ab" * 32}
    other = packer.rpc(timeout=60).call("run.create", {**params, "settings": unknown})["run_id"]
    with pytest.raises(RpcCallError) as missing:
        join(packer, other)
    assert missing.value.code == DATA_UNAVAILABLE and "ab" * 32 in str(missing.value)
