"""The node's checkpoint store (node/transfer/store.py): round trips through files, deterministic
IDs, shared chunks, damaged and missing files, the downloader's verify-then-store, atomic writes."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

from locomesh.node.transfer.store import (
    checkpoint_ids, chunk_path, load_checkpoint, manifest_path, missing_chunks, read_stored_chunk, store_chunk,
    write_checkpoint,
)
from locomesh.training.checkpoint_manifest import MIN_CHUNK_SIZE, CheckpointError, verify_chunk
from locomesh.training.state_chunks import FAST_LEVEL, checkpoint_manifest, decode_chunk

from .test_checkpoint import META, SMALL_CHUNK, assert_same_state, mixed_state


@pytest.fixture
def written(tmp_path):
    state = mixed_state()
    manifest = write_checkpoint(tmp_path, state, META, chunk_size=SMALL_CHUNK)
    return tmp_path, state, manifest


# --- round trips and IDs --------------------------------------------------------------------


def test_round_trip_is_bit_exact_for_every_dtype(written):
    directory, state, manifest = written
    assert len(manifest.chunks) > 3  # the state really spans several chunks
    tensors, metadata = load_checkpoint(directory, manifest.id)
    assert_same_state(tensors, state)
    assert metadata == META
    assert load_checkpoint(directory, manifest.id.hex())[1] == META


def test_a_write_gives_the_manifest_computed_without_writing(written):
    _, state, manifest = written
    assert checkpoint_manifest(state, META, chunk_size=SMALL_CHUNK) == manifest


def test_zero_dim_and_empty_state_round_trip(tmp_path):
    scalar = {"s": torch.tensor(-3, dtype=torch.int8)}
    manifest = write_checkpoint(tmp_path, scalar, {"round": 0, "run": b""})
    tensors, _ = load_checkpoint(tmp_path, manifest.id)
    assert tensors["s"].shape == () and tensors["s"].item() == -3
    empty = write_checkpoint(tmp_path, {}, {"round": 0, "run": b""})
    assert load_checkpoint(tmp_path, empty.id) == ({}, {"round": 0, "run": b""})


def test_ids_are_deterministic_and_chunks_are_reused(tmp_path):
    state = mixed_state()
    first = write_checkpoint(tmp_path / "a", state, META, chunk_size=SMALL_CHUNK)
    reordered = dict(reversed(list(mixed_state().items())))
    second = write_checkpoint(tmp_path / "b", reordered, dict(reversed(list(META.items()))), chunk_size=SMALL_CHUNK)
    assert first.id == second.id
    assert first.encode() == second.encode()

    chunk_files = sorted((tmp_path / "a" / "chunks").iterdir())
    before = {path: path.stat().st_mtime_ns for path in chunk_files}
    again = write_checkpoint(tmp_path / "a", state, META, chunk_size=SMALL_CHUNK)
    assert again.id == first.id
    assert {path: path.stat().st_mtime_ns for path in chunk_files} == before

    other_meta = write_checkpoint(tmp_path / "a", state, {**META, "round": 8}, chunk_size=SMALL_CHUNK)
    assert other_meta.id != first.id and other_meta.chunks == first.chunks
    state["weird"] = state["weird"].clone()
    state["weird"][3] = 0.0  # -0.0 -> +0.0: equal as numbers, different bits, different checkpoint
    assert write_checkpoint(tmp_path / "a", state, META, chunk_size=SMALL_CHUNK).id != first.id


def test_damaged_chunk_is_rewritten_on_the_next_write(written):
    directory, state, manifest = written
    path = chunk_path(directory, manifest.chunks[0].hash)
    path.write_bytes(b"garbage")
    write_checkpoint(directory, state, META, chunk_size=SMALL_CHUNK)
    assert hashlib.sha256(path.read_bytes()).digest() == manifest.chunks[0].hash


# --- damaged or missing chunks --------------------------------------------------------------


def test_flipped_byte_in_a_chunk_is_detected(written):
    directory, _, manifest = written
    ref = manifest.chunks[2]
    path = chunk_path(directory, ref.hash)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its hash"):
        verify_chunk(manifest, 2, bytes(data))
    with pytest.raises(CheckpointError, match=ref.hash.hex()) as error:
        load_checkpoint(directory, manifest.id)
    assert error.value.code == "bad-chunk"


def test_truncated_chunk_is_detected(written):
    directory, _, manifest = written
    path = chunk_path(directory, manifest.chunks[-1].hash)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="chunk 1?[0-9]+ .* bytes, expected") as error:
        load_checkpoint(directory, manifest.id)
    assert error.value.code == "bad-chunk"


def test_missing_chunk_is_named(written):
    directory, _, manifest = written
    chunk_path(directory, manifest.chunks[1].hash).unlink()
    assert missing_chunks(directory, manifest) == [1]
    with pytest.raises(CheckpointError, match=f"chunk 1 \\({manifest.chunks[1].hash.hex()}\\)") as error:
        load_checkpoint(directory, manifest.id)
    assert error.value.code == "missing-chunk"


def test_missing_manifest_and_bad_ids(written):
    directory, _, manifest = written
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(directory, bytes(32))
    assert error.value.code == "missing-manifest"
    for bad_id in ("zz", "abcd", b"short"):
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(directory, bad_id)
        assert error.value.code == "wrong-id"
    other = manifest_path(directory, bytes(32))
    other.write_bytes(manifest.encode())  # a manifest filed under a name it does not hash to
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(directory, bytes(32))
    assert error.value.code == "wrong-id"


def test_downloader_path_verifies_before_storing(written, tmp_path):
    directory, state, manifest = written
    mirror = tmp_path / "mirror"
    (mirror / "manifests").mkdir(parents=True)
    manifest_path(mirror, manifest.id).write_bytes(manifest.encode())
    assert missing_chunks(mirror, manifest) == list(range(len(manifest.chunks)))
    for index, ref in enumerate(manifest.chunks):
        data = chunk_path(directory, ref.hash).read_bytes()
        with pytest.raises(CheckpointError):
            store_chunk(mirror, manifest, index, data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(CheckpointError):
            verify_chunk(manifest, (index + 1) % len(manifest.chunks), data)
        store_chunk(mirror, manifest, index, data)
        assert len(decode_chunk(manifest, index, data)) == ref.raw_size
    assert missing_chunks(mirror, manifest) == []
    assert_same_state(load_checkpoint(mirror, manifest.id)[0], state)
    for index in (-1, len(manifest.chunks), True, "0"):
        with pytest.raises(CheckpointError):
            verify_chunk(manifest, index, b"")


# --- atomic writes ----------------------------------------------------------------------------


def test_crash_before_rename_leaves_no_partial_file(written, monkeypatch):
    directory, state, manifest = written
    listing = {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}

    def crash(src, dst):
        raise OSError("simulated crash between the temporary write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    changed = {**state, "embed.weight": state["embed.weight"] + 1}
    with pytest.raises(OSError, match="simulated crash"):
        write_checkpoint(directory, changed, META, chunk_size=SMALL_CHUNK)
    monkeypatch.undo()
    after = {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert after == listing  # no temporary file left behind, no file changed
    assert_same_state(load_checkpoint(directory, manifest.id)[0], state)


def test_the_fast_level_stores_the_same_state_uncompressed(tmp_path):
    weights = {"theta": np.random.default_rng(5).standard_normal(300_000).astype(np.float32)}
    meta = {"round": 2, "run": b""}
    packed = write_checkpoint(tmp_path / "packed", weights, meta, chunk_size=MIN_CHUNK_SIZE)
    fast = write_checkpoint(tmp_path / "fast", weights, meta, chunk_size=MIN_CHUNK_SIZE, level=FAST_LEVEL)
    assert fast.state_hash == packed.state_hash and fast.id != packed.id
    assert sum(c.size for c in fast.chunks) >= fast.raw_size > sum(c.size for c in packed.chunks)
    tensors, _ = load_checkpoint(tmp_path / "fast", fast.id)
    assert np.array_equal(tensors["theta"].numpy(), weights["theta"])


# --- what the store lists and reads -------------------------------------------------------------


def test_checkpoint_ids_are_the_filed_manifests_and_nothing_else(written, tmp_path):
    directory, state, manifest = written
    other = write_checkpoint(directory, state, {**META, "round": 8}, chunk_size=SMALL_CHUNK)
    (directory / "manifests" / "notes.msgpack").write_bytes(b"x")
    (directory / "manifests" / f"{'ab' * 8}.msgpack").write_bytes(b"x")  # hex, but no checkpoint ID
    assert checkpoint_ids(directory) == sorted([manifest.id, other.id])
    assert checkpoint_ids(tmp_path / "nothing here") == []


def test_a_stored_chunk_is_read_no_further_than_one_byte_past_its_size(written):
    directory, _, manifest = written
    ref = manifest.chunks[0]
    assert read_stored_chunk(directory, manifest, 0) == chunk_path(directory, ref.hash).read_bytes()
    chunk_path(directory, ref.hash).write_bytes(bytes(10 * ref.size))
    assert len(read_stored_chunk(directory, manifest, 0)) == ref.size + 1
    chunk_path(directory, ref.hash).unlink()
    with pytest.raises(CheckpointError) as error:
        read_stored_chunk(directory, manifest, 0)
    assert error.value.code == "missing-chunk"
