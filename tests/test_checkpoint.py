"""Checkpoint format (training/: state headers, chunks, manifests, the Merkle tree): every
rejection path. The store that keeps checkpoints in files is tested in test_checkpoint_store.py."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locomesh.node.transfer.store import load_checkpoint, write_chunks
from locomesh.protocol import ProtocolError, compress, pack, unpack
from locomesh.training import state_format
from locomesh.training.checkpoint_manifest import (
    MAX_MANIFEST_SIZE, CheckpointError, merkle_proof, merkle_root, read_manifest, verify_merkle_proof,
)
from locomesh.training.state_chunks import FAST_LEVEL, StateChunks, checkpoint_manifest, decode_chunk, state_digest

RUN = bytes(range(32))
META = {"round": 7, "run": RUN, "task": "bytes-lm", "loss": 2.5, "note": b"\x00\xff"}
SMALL_CHUNK = 1024


def mixed_state(seed: int = 0) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    weird = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45], dtype=torch.float32)
    return {
        "embed.weight": torch.randn(37, 29, generator=gen),
        "ln.bias": torch.randn(29, generator=gen).to(torch.bfloat16),
        "half": torch.randn(3, 4, 5, generator=gen).to(torch.float16),
        "weird": weird,
        "mask": torch.rand(41, generator=gen) > 0.5,
        "step": torch.tensor(12345, dtype=torch.int64),
        "codes": torch.randint(-128, 128, (100,), generator=gen, dtype=torch.int8),
        "counts": np.arange(-5, 6, dtype=np.int32),
        "bytes": np.frombuffer(b"hello world", dtype=np.uint8).copy(),
        "big_endian": np.arange(6, dtype=">i8").reshape(2, 3),
        "empty": torch.zeros(0, 3),
        "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
    }


def as_torch(value: object) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.astype(value.dtype.newbyteorder("=")))
    return value


def bits(tensor: torch.Tensor) -> bytes:
    """The exact bytes of a tensor's values, so NaN payloads and -0.0 count."""
    flat = tensor.contiguous().reshape(-1)
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.view(torch.int16)
    return flat.numpy().tobytes()


def assert_same_state(loaded: dict[str, torch.Tensor], original: dict[str, object]) -> None:
    assert loaded.keys() == original.keys()
    for name, value in original.items():
        expected = as_torch(value)
        assert loaded[name].dtype == expected.dtype, name
        assert loaded[name].shape == expected.shape, name
        assert bits(loaded[name]) == bits(expected), name


@pytest.fixture
def manifest():
    return checkpoint_manifest(mixed_state(), META, chunk_size=SMALL_CHUNK)


def test_state_digest_is_the_state_hash_of_the_manifest(manifest):
    assert state_digest(mixed_state()) == manifest.state_hash
    one = {"theta": np.arange(10, dtype=np.float32)}
    other = {"theta": np.arange(10, dtype=np.float32) + np.float32(1)}
    assert state_digest(one) != state_digest(other)
    assert state_digest(one) != state_digest({"momentum": one["theta"]})  # names are part of the state


def test_the_level_changes_the_chunks_not_the_state(manifest):
    fast = checkpoint_manifest(mixed_state(), META, chunk_size=SMALL_CHUNK, level=FAST_LEVEL)
    assert fast.state_hash == manifest.state_hash and fast.id != manifest.id


def test_the_manifest_is_known_only_once_every_chunk_was_handed_out():
    chunks = StateChunks([bytes(3000)], {"round": 0, "run": b""}, chunk_size=SMALL_CHUNK)
    handed = iter(chunks)
    next(handed)
    with pytest.raises(RuntimeError):
        chunks.manifest()
    assert [ref.raw_size for ref, _ in handed] == [1024, 952]
    assert chunks.manifest().raw_size == 3000 and len(chunks.manifest().chunks) == 3


def test_chunk_that_hashes_right_but_inflates_wrong_is_refused():
    """A malicious writer can list a chunk whose frame is valid but whose size lies."""
    manifest = checkpoint_manifest({"x": torch.ones(600)}, {"round": 1, "run": b""}, chunk_size=SMALL_CHUNK)
    fields = unpack(manifest.encode(), max_size=1 << 20)
    frame = compress(bytes(SMALL_CHUNK + 1))  # declares one byte more than a chunk may hold
    fields["chunks"][0] = {"hash": hashlib.sha256(frame).digest(), "size": len(frame), "raw_size": SMALL_CHUNK}
    fields["merkle_root"] = merkle_root([c["hash"] for c in fields["chunks"]])
    forged = read_manifest(pack(fields))
    with pytest.raises(CheckpointError, match="over the cap") as error:
        decode_chunk(forged, 0, frame)
    assert error.value.code == "bad-chunk"


# --- manifests with bad fields ----------------------------------------------------------------


def _set(path: tuple, value):
    def mutate(fields):
        target = fields
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _delete(key: str):
    return lambda fields: fields.pop(key)


def _fix_root(fields):
    fields["merkle_root"] = merkle_root([c["hash"] for c in fields["chunks"]])


BAD_MANIFESTS = {
    "version": _set(("version",), 2),
    "raw_size-zero": _set(("raw_size",), 0),
    "raw_size-other": _set(("raw_size",), 5000),
    "chunk_size-small": _set(("chunk_size",), 512),
    "chunk_size-huge": _set(("chunk_size",), 1 << 40),
    "chunks-empty": _set(("chunks",), []),
    "chunk-hash-short": _set(("chunks", 0, "hash"), bytes(31)),
    "chunk-hash-type": _set(("chunks", 0, "hash"), "00" * 32),
    "chunk-size-zero": _set(("chunks", 0, "size"), 0),
    "chunk-size-impossible": _set(("chunks", 0, "size"), 5000),
    "chunk-raw-size": _set(("chunks", 0, "raw_size"), 1000),
    "chunk-extra-field": _set(("chunks", 0, "extra"), 1),
    "round-negative": _set(("round",), -1),
    "round-float": _set(("round",), 1.0),
    "run-length": _set(("run",), bytes(5)),
    "metadata-reserved": _set(("metadata", "round"), 3),
    "metadata-list": _set(("metadata", "x"), [1, 2]),
    "metadata-long": _set(("metadata", "x"), "y" * 5000),
    "state_hash-short": _set(("state_hash",), bytes(3)),
    "merkle_root-wrong": _set(("merkle_root",), bytes(32)),
    "extra-field": _set(("extra",), 1),
    "missing-field": _delete("state_hash"),
}


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
def test_manifest_with_a_bad_field_is_refused(manifest, name):
    fields = unpack(manifest.encode(), max_size=1 << 20)
    BAD_MANIFESTS[name](fields)
    if name != "merkle_root-wrong" and isinstance(fields.get("chunks"), list):
        _fix_root_if_possible(fields)
    with pytest.raises(CheckpointError) as error:
        read_manifest(pack(fields))
    assert error.value.code == "bad-manifest"


def _fix_root_if_possible(fields):
    """Keep the Merkle root right, so each case fails on its own rule and not on the root."""
    try:
        _fix_root(fields)
    except (TypeError, KeyError):
        pass


def test_chunk_count_must_match_sizes(manifest):
    fields = unpack(manifest.encode(), max_size=1 << 20)
    fields["chunks"].append(dict(fields["chunks"][-1]))
    _fix_root(fields)
    with pytest.raises(CheckpointError, match="make [0-9]+ chunks"):
        read_manifest(pack(fields))


def test_manifest_bytes_that_are_not_a_manifest(manifest):
    data = manifest.encode()
    for bad in (b"", b"\xc1", data[:-1], data + b"\x00", pack([1, 2]), bytes(MAX_MANIFEST_SIZE + 1)):
        with pytest.raises(CheckpointError):
            read_manifest(bad)
    with pytest.raises(CheckpointError) as error:
        read_manifest(data, expected_id=bytes(32))
    assert error.value.code == "wrong-id"
    assert read_manifest(data, expected_id=manifest.id) == manifest
    with pytest.raises(CheckpointError):
        read_manifest("not bytes")


def test_states_the_format_cannot_hold_are_refused():
    cases = [
        ({"x": torch.zeros(2, dtype=torch.float64)}, META),
        ({"x": np.zeros(2, dtype=np.uint32)}, META),
        ({"x": [1.0, 2.0]}, META),
        ({"": torch.zeros(1)}, META),
        ({"x": torch.zeros(1)}, {"run": RUN}),
        ({"x": torch.zeros(1)}, {"round": -1, "run": RUN}),
        ({"x": torch.zeros(1)}, {"round": 1, "run": bytes(7)}),
        ({"x": torch.zeros(1)}, {"round": 1, "run": RUN, "obj": object()}),
    ]
    for tensors, metadata in cases:
        with pytest.raises(CheckpointError):
            checkpoint_manifest(tensors, metadata)
    with pytest.raises(CheckpointError):
        checkpoint_manifest({"x": torch.zeros(1)}, META, chunk_size=100)


# --- headers inside the state (only a malicious writer makes these: chunks hash right) -----------


def _entry(name="a", dtype="float32", shape=(4,), offset=0, length=16):
    return {"name": name, "dtype": dtype, "shape": list(shape), "offset": offset, "length": length}


def _blob(entries, data_size, *, magic=state_format.MAGIC, header=None, data=None):
    header = pack({"tensors": entries}) if header is None else header
    prefix = magic + len(header).to_bytes(4, "little") + header
    prefix += bytes(state_format.align(len(prefix)) - len(prefix))
    return prefix + (bytes(data_size) if data is None else data)


def _load_blob(tmp_path, blob):
    """Store `blob` as a checkpoint's state and load it: the store reads the header from the first
    chunks before the state, so this is the path a state from a peer takes."""
    manifest = write_chunks(tmp_path, StateChunks([blob], {"round": 0, "run": b""}, chunk_size=SMALL_CHUNK))
    return load_checkpoint(tmp_path, manifest.id)


BAD_BLOBS = {
    "magic": _blob([_entry()], 16, magic=b"XXXX"),
    "header-too-long": b"LMCK" + (10**6).to_bytes(4, "little") + bytes(64),
    "header-not-msgpack": _blob([], 0, header=b"\xc1"),
    "header-non-canonical": _blob([], 0, header=b"\x81\xa7tensors\xdc\x00\x00"),
    "header-extra-field": _blob([], 0, header=pack({"tensors": [], "x": 1})),
    "dtype": _blob([_entry(dtype="float64", length=32)], 32),
    "duplicate-name": _blob([_entry(), _entry(offset=64)], 80),
    "misaligned": _blob([_entry(offset=4)], 20),
    "overlap": _blob([_entry(shape=(32,), length=128), _entry(name="b", offset=64)], 128),
    "shape-length": _blob([_entry(shape=(5,))], 16),
    "past-the-end": _blob([_entry()], 8),
    "trailing-bytes": _blob([_entry()], 17),
    "too-many-dims": _blob([_entry(shape=(1,) * 17, length=4)], 4),
    "bool-not-0-or-1": _blob([_entry(dtype="bool", shape=(2,), length=2)], 2, data=b"\x01\x02"),
}


@pytest.mark.parametrize("name", sorted(BAD_BLOBS))
def test_state_with_a_bad_header_is_refused(tmp_path, name):
    with pytest.raises(CheckpointError) as error:
        _load_blob(tmp_path, BAD_BLOBS[name])
    assert error.value.code == "bad-header"


def test_hand_made_blob_loads(tmp_path):
    """The helpers above make valid states too, so the rejections are about the one broken rule."""
    data = np.arange(4, dtype="<f4").tobytes() + bytes(48) + b"\x01\x00"
    tensors, _ = _load_blob(tmp_path, _blob([_entry(), _entry("b", "bool", (2,), 64, 2)], 66, data=data))
    assert tensors["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and tensors["b"].tolist() == [True, False]
    assert sorted(state_format.tensors_from_blob(np.frombuffer(bytearray(_VALID_BLOB), dtype=np.uint8))) == ["a", "b", "c"]


# --- Merkle tree (RFC 6962 test vectors) ---------------------------------------------------------

RFC6962_LEAVES = [
    bytes.fromhex(h)
    for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")
]
RFC6962_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def test_merkle_root_matches_rfc6962_vectors():
    for size, root in enumerate(RFC6962_ROOTS):
        assert merkle_root(RFC6962_LEAVES[:size]).hex() == root


def test_merkle_proof_matches_rfc6962_vector():
    expected = ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]
    assert [h.hex() for h in merkle_proof(RFC6962_LEAVES, 0)] == expected


def test_merkle_proofs_verify_for_every_leaf_and_nothing_else():
    for count in range(1, 24):
        leaves = [hashlib.sha256(bytes([i, count])).digest() for i in range(count)]
        root = merkle_root(leaves)
        for index in range(count):
            proof = merkle_proof(leaves, index)
            assert verify_merkle_proof(root, leaves[index], index, count, proof)
            assert not verify_merkle_proof(root, leaves[index], (index + 1) % count, count, proof) or count == 1
            assert not verify_merkle_proof(root, b"other", index, count, proof)
            assert not verify_merkle_proof(root, leaves[index], index, count, proof[:-1]) or count == 1
            assert not verify_merkle_proof(root, leaves[index], count, count, proof)
            assert not verify_merkle_proof(root, leaves[index], index, count, proof + [bytes(32)])


# --- fuzzing --------------------------------------------------------------------------------------

_MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
)


def _apply(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for op, position, arg in mutations:
        i = position % (len(buf) + 1)
        if op == "flip" and i < len(buf):
            buf[i] ^= 1 << arg
        elif op == "truncate":
            del buf[i:]
        elif op == "insert":
            buf[i:i] = bytes([arg])
        elif op == "delete" and i < len(buf):
            del buf[i]
        elif op == "set" and i < len(buf):
            buf[i] = arg
    return bytes(buf)


_VALID_MANIFEST = None


def _valid_manifest_bytes() -> bytes:
    global _VALID_MANIFEST
    if _VALID_MANIFEST is None:
        _VALID_MANIFEST = checkpoint_manifest(mixed_state(), META, chunk_size=SMALL_CHUNK).encode()
    return _VALID_MANIFEST


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MUTATIONS, min_size=1, max_size=6))
def test_mutated_manifest_bytes_raise_only_checkpoint_errors(mutations):
    data = _apply(_valid_manifest_bytes(), mutations)
    try:
        manifest = read_manifest(data)
    except CheckpointError:
        return
    assert manifest.encode() == data


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                     st.text(max_size=8), st.binary(max_size=40))
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6
)
_MANIFEST_FIELDS = ["version", "raw_size", "chunk_size", "chunks", "round", "run", "metadata", "state_hash", "merkle_root", "new"]


@settings(max_examples=300)
@given(st.sampled_from(_MANIFEST_FIELDS),
       st.integers(0, 40), st.sampled_from(["hash", "size", "raw_size", "x"]), _values)
def test_manifest_with_random_field_values_raises_only_checkpoint_errors(field, chunk, chunk_field, value):
    fields = unpack(_valid_manifest_bytes(), max_size=1 << 20)
    if field == "chunks" and chunk < len(fields["chunks"]):
        fields["chunks"][chunk][chunk_field] = value
    else:
        fields[field] = value
    try:
        data = pack(fields)
    except ProtocolError:
        return  # a value with no canonical form cannot even be sent
    try:
        manifest = read_manifest(data)
    except CheckpointError:
        return
    assert manifest.encode() == data  # some changes leave a valid manifest (another round, say)


_VALID_BLOB = _blob(
    [_entry(), _entry("b", "bool", (2,), 64, 2), _entry("c", "bfloat16", (3, 1), 128, 6)],
    134,
    data=np.arange(4, dtype="<f4").tobytes() + bytes(48) + b"\x01\x00" + bytes(62) + bytes(6),
)


@settings(max_examples=300)
@given(st.lists(_MUTATIONS, min_size=1, max_size=4))
def test_mutated_states_raise_only_checkpoint_errors(mutations):
    """What a writer whose chunks hash right can still get wrong: the header and layout inside the state."""
    data = _apply(_VALID_BLOB, mutations)
    try:
        tensors = state_format.tensors_from_blob(np.frombuffer(bytearray(data), dtype=np.uint8))
    except CheckpointError:
        return
    assert sum(t.numel() * t.element_size() for t in tensors.values()) <= len(data)


