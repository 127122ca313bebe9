"""Tokenized datasets as checkpoints: packing, loading back verified, the CLI, and untrusted indexes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from locomesh.cli.main import main
from locomesh.node.datasets.store import load_index, load_shard, load_tokenizer, write_dataset
from locomesh.node.transfer.store import chunk_path, checkpoint_ids, has_checkpoint, is_missing, read_stored_manifest
from locomesh.protocol import pack
from locomesh.training.checkpoint_manifest import CheckpointError, LimitError
from locomesh.training.data.index import (
    MAX_INDEX_BYTES, MAX_NAME, MAX_SHARDS, DatasetError, DatasetIndex, dtype_for, read_index, shard_tensors,
    shard_tokens_of,
)

from .full_disk import FullDisk, files_under

SHARD = 64
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex one jolly box".split()


def _documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(count)]


def _train_tokenizer(path, special_tokens: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(_documents(50, 1), trainers.BpeTrainer(vocab_size=120, special_tokens=special_tokens))
    tokenizer.save(str(path))
    return tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A trained tokenizer (with EOS ``</s>``) and a corpus: three .txt files, a .jsonl file with a
    blank line, a .json file; and the documents in the order packing reads them."""
    root = tmp_path_factory.mktemp("corpus")
    tokenizer = _train_tokenizer(root / "tokenizer.json", ["<unk>", "</s>"])
    docs = _documents(40, 2)
    files = []
    for i in range(3):
        (root / f"doc{i}.txt").write_text(docs[i], encoding="utf-8")
        files.append(root / f"doc{i}.txt")
    lines = [json.dumps({"text": doc, "id": n}) for n, doc in enumerate(docs[3:30])]
    (root / "more.jsonl").write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n", encoding="utf-8")
    (root / "rest.json").write_text("".join(json.dumps({"body": doc}) + "\n" for doc in docs[30:]), encoding="utf-8")
    files += [root / "more.jsonl", root / "rest.json"]
    return {"root": root, "tokenizer": tokenizer, "path": root / "tokenizer.json", "files": files, "docs": docs}


def _pack(corpus, directory, **options):
    options = {"shard_tokens": SHARD, "holdout_fraction": 0.2, "text_field": "text", **options}
    files = corpus["files"][:-1] if options["text_field"] == "text" else corpus["files"]
    return write_dataset(directory, files, corpus["path"], **options)


def _expected_stream(tokenizer: Tokenizer, docs: list[str], eos: int | None) -> list[int]:
    stream = []
    for doc in docs:
        stream += tokenizer.encode(doc, add_special_tokens=False).ids + ([] if eos is None else [eos])
    return stream


@pytest.fixture(scope="module")
def packed(corpus, tmp_path_factory):
    directory = tmp_path_factory.mktemp("store")
    return directory, _pack(corpus, directory, name="tiny")


def test_shards_hold_exactly_the_documents_tokens_with_eos_between(corpus, packed):
    directory, dataset = packed
    eos = corpus["tokenizer"].token_to_id("</s>")
    expected = _expected_stream(corpus["tokenizer"], corpus["docs"][:30], eos)
    index = load_index(directory, dataset.id)
    assert index == dataset.index and index.name == "tiny" and index.eos_id == eos and index.dtype == "uint16"
    shards = [load_shard(directory, index, shard_id) for shard_id in index.shards]
    assert all(shard.dtype == np.uint16 and shard.shape == (SHARD,) for shard in shards)
    assert np.concatenate(shards).tolist() == expected[: len(shards) * SHARD]
    assert dataset.dropped_tokens == len(expected) - len(shards) * SHARD < SHARD
    assert dataset.documents == 30 and index.tokens == len(shards) * SHARD
    assert len(index.heldout) == round(0.2 * len(shards)) and index.heldout == index.shards[-len(index.heldout):]
    assert load_tokenizer(directory, index) == corpus["path"].read_bytes()
    assert all(has_checkpoint(directory, shard_id) for shard_id in index.shards)


def test_the_dataset_id_is_the_same_for_the_same_inputs(corpus, packed, tmp_path):
    _directory, dataset = packed
    assert _pack(corpus, tmp_path / "again", name="tiny").id == dataset.id
    assert _pack(corpus, tmp_path / "other", name="tiny", shard_tokens=SHARD + 1).id != dataset.id
    assert _pack(corpus, tmp_path / "renamed", name="other").id != dataset.id


def test_another_text_field_and_an_explicit_eos(corpus, tmp_path):
    """--text-field reads another field (here the .json file's), --eos picks the separator."""
    (tmp_path / "only.json").write_text("".join(json.dumps({"body": d}) + "\n" for d in corpus["docs"]), encoding="utf-8")
    only = [tmp_path / "only.json"]
    dataset = write_dataset(tmp_path / "s", only, corpus["path"], shard_tokens=SHARD, text_field="body", eos="<unk>")
    expected = _expected_stream(corpus["tokenizer"], corpus["docs"], corpus["tokenizer"].token_to_id("<unk>"))
    shards = [load_shard(tmp_path / "s", dataset.index, shard_id) for shard_id in dataset.index.shards]
    assert np.concatenate(shards).tolist() == expected[: len(shards) * SHARD]


def test_a_tokenizer_without_eos_concatenates_documents(corpus, tmp_path):
    path = tmp_path / "no-eos.json"
    tokenizer = _train_tokenizer(path, ["<unk>"])
    dataset = write_dataset(tmp_path / "s", corpus["files"][:3], path, shard_tokens=16)
    assert dataset.index.eos_id is None
    shards = [load_shard(tmp_path / "s", dataset.index, shard_id) for shard_id in dataset.index.shards]
    assert np.concatenate(shards).tolist() == _expected_stream(tokenizer, corpus["docs"][:3], None)[: len(shards) * 16]


def test_the_cli_prints_the_dataset_id_and_writes_to_the_data_dirs_store(corpus, packed, tmp_path, capsys):
    _directory, dataset = packed
    files = [str(path) for path in corpus["files"][:-1]]
    args = ["data", "pack", *files, "--tokenizer", str(corpus["path"]), "--shard-tokens", str(SHARD),
            "--holdout", "0.2", "--name", "tiny", "--data-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == dataset.id.hex() and "30 documents" in out
    assert dataset.id in checkpoint_ids(tmp_path / "checkpoints")
    assert main([*args, "--out", str(tmp_path / "elsewhere"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dataset_id"] == dataset.id.hex() and result["train_shards"] == len(dataset.index.train)
    assert dataset.id in checkpoint_ids(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    "lines, where",
    [(['{"text": "fine"}', '{"txt": "no text"}'], ":2:"), (['{"text": 3}'], ":1:"), (["[1, 2]"], ":1:"), (["{oops"], ":1:")],
)
def test_a_bad_json_line_is_named(corpus, tmp_path, capsys, lines, where):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=f"bad.jsonl{where}") as raised:
        write_dataset(tmp_path / "s", [*corpus["files"][:3], bad], corpus["path"], shard_tokens=16)
    assert raised.value.code == "bad-input"
    assert main(["data", "pack", str(bad), "--tokenizer", str(corpus["path"]), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert f"bad.jsonl{where}" in err and err.count("\n") == 1


def test_bad_inputs_fail_before_anything_is_written(corpus, tmp_path, capsys):
    store, tokenizer = tmp_path / "s", str(corpus["path"])
    cases = [
        (["data", "pack", str(tmp_path / "missing.txt"), "--tokenizer", tokenizer], "no such file"),
        (["data", "pack", str(corpus["files"][0]), "--tokenizer", str(corpus["files"][0])], "not a tokenizer.json"),
        (["data", "pack", str(corpus["files"][0]), "--tokenizer", str(tmp_path / "nope.json")], "cannot read the tokenizer"),
        (["data", "pack", str(corpus["files"][0]), "--tokenizer", tokenizer, "--eos", "<nope>"], "no token '<nope>'"),
        (["data", "pack", str(corpus["files"][0]), "--tokenizer", tokenizer], "use a smaller --shard-tokens"),
        (["data", "pack", *map(str, corpus["files"]), "--tokenizer", tokenizer, "--shard-tokens", "4"], "outside"),
        (["data", "pack", *map(str, corpus["files"]), "--tokenizer", tokenizer, "--holdout", "1"], "between 0 and 1"),
        (["data", "pack", str(corpus["files"][0]), "--tokenizer", tokenizer, "--name", "x" * (MAX_NAME + 1)], "name"),
    ]
    for args, message in cases:
        assert main([*args, "--out", str(store)]) == 2, message
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not store.exists()


def test_a_corpus_of_too_many_shards_is_refused_as_it_is_packed(corpus, tmp_path, monkeypatch):
    from locomesh.node.datasets import store

    monkeypatch.setattr(store, "MAX_SHARDS", 3)
    with pytest.raises(DatasetError, match="over 3 shards of 64: use a larger --shard-tokens"):
        _pack(corpus, tmp_path)
    assert files_under(tmp_path) == set()  # the 3 shards written are taken back: no orphan to announce


def test_a_full_disk_fails_the_pack_in_one_line_and_takes_back_what_it_wrote(corpus, tmp_path, monkeypatch, capsys):
    store, scratch = tmp_path / "store", tmp_path / "scratch"
    kept = _pack(corpus, store, name="kept")  # already there, and sharing its tokenizer with the next
    before = files_under(store)
    args = ["data", "pack", *map(str, corpus["files"][:-1]), "--tokenizer", str(corpus["path"]), "--shard-tokens", "32"]
    assert main([*args, "--out", str(scratch)]) == 0
    size = sum(path.stat().st_size for path in scratch.rglob("*") if path.is_file())
    capsys.readouterr()
    disk = FullDisk(store, free=size // 2)  # full halfway through the next dataset
    monkeypatch.setattr(os, "write", disk.write)
    assert main([*args, "--out", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"locomesh: no space left on device: {store}; free some space or use --out DIR on "
                                "another disk (nothing of this dataset was kept)"]
    assert disk.written > 0  # it did write part of the dataset...
    assert files_under(store) == before  # ...and took it all back, temporaries included; the kept one is whole
    assert all(has_checkpoint(store, checkpoint) for checkpoint in (kept.id, kept.index.tokenizer, *kept.index.shards))


def test_a_corrupted_or_missing_shard_chunk_is_refused(corpus, tmp_path):
    dataset = _pack(corpus, tmp_path)
    shard_id = dataset.index.train[0]
    path = chunk_path(tmp_path, read_stored_manifest(tmp_path, shard_id).chunks[0].hash)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as raised:
        load_shard(tmp_path, dataset.index, shard_id)
    assert raised.value.code == "bad-chunk"
    path.unlink()
    assert not has_checkpoint(tmp_path, shard_id)
    with pytest.raises(CheckpointError) as raised:
        load_shard(tmp_path, dataset.index, shard_id)
    assert is_missing(raised.value)


def test_a_checkpoint_that_is_not_what_the_index_says_is_refused(corpus, packed, tmp_path):
    directory, dataset = packed
    with pytest.raises(LimitError):  # a shard is no index
        load_index(directory, dataset.index.train[0])
    with pytest.raises(LimitError):  # a shard of another length
        load_shard(directory, dataclasses.replace(dataset.index, shard_tokens=SHARD * 2, tokens=dataset.index.tokens * 2),
                   dataset.index.train[0])
    with pytest.raises(DatasetError, match="not in the dataset"):
        load_shard(directory, dataset.index, dataset.index.tokenizer)
    with pytest.raises(DatasetError) as raised:
        load_tokenizer(directory, dataclasses.replace(dataset.index, tokenizer_hash=bytes(32)))
    assert raised.value.code == "wrong-tokenizer"
    with pytest.raises(CheckpointError) as raised:
        load_index(tmp_path, dataset.id)
    assert is_missing(raised.value)


# --- untrusted indexes --------------------------------------------------------------------------


def _valid_fields(**changes) -> dict:
    fields = {
        "version": 1, "name": "n", "tokenizer": b"t" * 32, "tokenizer_hash": b"h" * 32, "vocab_size": 1000,
        "eos_id": 1, "shard_tokens": 64, "dtype": "uint16", "train": [b"a" * 32, b"b" * 32], "heldout": [b"c" * 32],
        "tokens": 192,
    }
    return {**fields, **changes}


@pytest.mark.parametrize(
    "data",
    [
        b"", b"\xc1", pack(1), pack({}), pack([]), pack(_valid_fields())[:-1], pack(_valid_fields()) + b"\x00",
        pack(_valid_fields(version=2)), pack(_valid_fields(extra=1)), pack(_valid_fields(name=b"bytes")),
        pack(_valid_fields(name="x" * (MAX_NAME + 1))), pack(_valid_fields(tokenizer=b"short")),
        pack(_valid_fields(vocab_size=True)), pack(_valid_fields(vocab_size=0)), pack(_valid_fields(eos_id=1000)),
        pack(_valid_fields(eos_id=-1)), pack(_valid_fields(shard_tokens=8, tokens=24)), pack(_valid_fields(dtype="int32")),
        pack(_valid_fields(dtype="uint32")), pack(_valid_fields(vocab_size=70000)), pack(_valid_fields(train=[])),
        pack(_valid_fields(heldout=[], tokens=128)), pack(_valid_fields(heldout=[b"a" * 32])), pack(_valid_fields(tokens=191)),
        pack(_valid_fields(train=(b"a" * 32,) * MAX_SHARDS, tokens=64 * (MAX_SHARDS + 1))),
        pack(_valid_fields(train=[b"a" * 31, b"b" * 32])), b"\x80" * (MAX_INDEX_BYTES + 1),
    ],
)
def test_read_index_refuses_bad_bytes(data):
    with pytest.raises(DatasetError) as raised:
        read_index(data)
    assert raised.value.code in ("bad-index", "too-large")


def test_an_index_round_trips_and_the_largest_fits_the_cap():
    assert read_index(pack(_valid_fields())).encode() == pack(_valid_fields())
    assert read_index(pack(_valid_fields(eos_id=None, vocab_size=70000, dtype="uint32"))).dtype == "uint32"
    largest = DatasetIndex(
        name="\U0001f600" * MAX_NAME, tokenizer=b"t" * 32, tokenizer_hash=b"h" * 32, vocab_size=2**32, eos_id=2**32 - 1,
        shard_tokens=2**24, dtype="uint32", heldout=[b"z" * 32], tokens=2**24 * MAX_SHARDS,
        train=[hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(MAX_SHARDS - 1)],
    )
    assert len(largest.encode()) <= MAX_INDEX_BYTES and read_index(largest.encode()) == largest


@given(st.binary(max_size=400))
def test_read_index_raises_only_dataset_errors_on_garbage(data):
    try:
        read_index(data)
    except DatasetError:
        pass


@given(st.integers(0, 2000), st.integers(0, 255))
def test_read_index_on_a_flipped_byte_is_valid_or_refused(position, value):
    data = bytearray(pack(_valid_fields()))
    data[position % len(data)] = value
    try:
        assert read_index(bytes(data)).encode() == bytes(data)
    except DatasetError:
        pass


def test_token_ids_travel_as_little_endian_bytes_of_the_index_dtype():
    assert (dtype_for(2**16), dtype_for(2**16 + 1)) == ("uint16", "uint32")
    index = read_index(pack(_valid_fields(vocab_size=2**32, eos_id=None, dtype="uint32")))
    tokens = np.array([0, 1, 2**16, 2**32 - 1] * 16, dtype=np.uint32)
    data = shard_tensors(tokens, "uint32")["tokens"]
    assert data.dtype == np.uint8 and data.tobytes() == tokens.astype("<u4").tobytes()
    assert shard_tokens_of(data, index).tolist() == tokens.tolist()


def test_the_help_states_the_defaults_write_dataset_applies(capsys):
    from locomesh.training.data.pack import DEFAULT_HOLDOUT, DEFAULT_SHARD_TOKENS

    with pytest.raises(SystemExit):
        main(["data", "pack", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default 2**20 = {DEFAULT_SHARD_TOKENS}" in help_text and f"default {DEFAULT_HOLDOUT};" in help_text
    assert DEFAULT_SHARD_TOKENS == 2**20
