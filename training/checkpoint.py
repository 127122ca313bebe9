"""Checkpoints on disk: named tensors as raw bytes behind a msgpack header, in hashed chunks.

The serialized state (the "blob") is

    b"LMCK" | header length (u32, little-endian) | header | zero padding | tensor bytes

where the header is canonical msgpack, ``{"tensors": [{name, dtype, shape,
offset, length}, ...]}``, listed by offset. Offsets count from the start of the
tensor bytes, which begins at the next multiple of 64 after the header; every
tensor starts on a multiple of 64 too, so a loaded tensor can be a view into
one buffer without an unaligned element. Tensors are laid out sorted by name,
so the same state always gives the same blob. Values are raw little-endian
bytes of a fixed allow-list of dtypes: no pickle, no torch.save, nothing that
can run code when read.

The blob is then cut into chunks and named by a manifest (`checkpoint_manifest`).
On disk, under a checkpoint directory:

    chunks/<sha256 of the compressed chunk, hex>
    manifests/<checkpoint ID, hex>.msgpack

Every file is written atomically (temporary file, fsync, rename), chunks before
the manifest, so a manifest that is visible names chunks that are there.
Chunks are shared between checkpoints that have them in common.

Memory: writing holds one chunk at a time besides the caller's tensors; loading
holds one buffer the size of the state, and the returned tensors are views into
it, plus one chunk at a time. A state from a peer is loaded with the caller's
`ManifestLimits`: its manifest is checked against them first, then its header
(read from the first chunks alone) against the layout they name, and only then
is the buffer allocated, so a manifest's claimed size never allocates anything.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import torch

from locomesh.protocol import ProtocolError, compress, decompress, pack, unpack
from locomesh.protocol.files import atomic_write
from locomesh.protocol.schema import Int, List, OneOf, Str, Struct

from .checkpoint_manifest import (
    chunk_path, manifest_path, DEFAULT_CHUNK_SIZE, HASH_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, CheckpointError, ChunkRef,
    LimitError, Manifest, ManifestLimits, TensorSpec, merkle_proof, merkle_root, read_manifest, split_metadata, verify_chunk,
    verify_merkle_proof,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE", "CheckpointError", "ChunkRef", "LimitError", "Manifest", "ManifestLimits", "TensorSpec",
    "checkpoint_limits", "checkpoint_manifest", "chunk_path", "decode_chunk", "layout_raw_size", "load_checkpoint",
    "manifest_path", "merkle_proof", "merkle_root", "missing_chunks", "read_manifest", "remove_checkpoints",
    "state_digest", "store_chunk", "verify_chunk", "verify_merkle_proof", "write_checkpoint",
]

MAGIC = b"LMCK"
ALIGN = 64
PREFIX_SIZE = len(MAGIC) + 4
MAX_HEADER_SIZE = 16 * 1024 * 1024
MAX_TENSORS = 65536
MAX_NDIM = 16
COMPRESSION_LEVEL = 1  # float weights: level 3 saves no more bytes than 1 (about 7%) at under half the speed
# A negative level stores float weights as raw zstd blocks (ratio 1.0) at about 5 GB/s against level
# 1's 0.92 at 0.76 GB/s: the choice for a run state written every round, where the 8% would cost
# every peer ~0.4 CPU-s per round of 25M parameters and saves bytes only for the rare syncing peer.
FAST_LEVEL = -1


@dataclass(frozen=True)
class DType:
    name: str
    numpy: np.dtype  # little-endian; bfloat16 travels as its 16 bits, uint16
    torch: torch.dtype


DTYPES = {
    d.name: d
    for d in (
        DType("float32", np.dtype("<f4"), torch.float32),
        DType("float16", np.dtype("<f2"), torch.float16),
        DType("bfloat16", np.dtype("<u2"), torch.bfloat16),
        DType("int64", np.dtype("<i8"), torch.int64),
        DType("int32", np.dtype("<i4"), torch.int32),
        DType("int8", np.dtype("i1"), torch.int8),
        DType("uint8", np.dtype("u1"), torch.uint8),
        DType("bool", np.dtype("?"), torch.bool),
    )
}
_BY_TORCH = {d.torch: d for d in DTYPES.values()}
_BY_NUMPY = {d.numpy: d for d in DTYPES.values() if d.name != "bfloat16"}

_HEADER_SCHEMA = Struct(
    {
        "tensors": List(
            Struct(
                {
                    "name": Str(1, 256),
                    "dtype": OneOf(frozenset(DTYPES)),
                    "shape": List(Int(0, 2**48), max_len=MAX_NDIM),
                    "offset": Int(0, 2**63 - 1),
                    "length": Int(0, 2**63 - 1),
                }
            ),
            max_len=MAX_TENSORS,
        )
    }
)


@dataclass(frozen=True)
class _Entry:
    """One tensor's place in the blob."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    length: int

    def header(self) -> dict[str, Any]:
        return {
            "name": self.name, "dtype": self.dtype.name, "shape": list(self.shape),
            "offset": self.offset, "length": self.length,
        }


# --- paths --------------------------------------------------------------------------------------


# --- writing ------------------------------------------------------------------------------------


def write_checkpoint(
    directory: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    metadata: dict[str, Any],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    level: int = COMPRESSION_LEVEL,
) -> Manifest:
    """Write `tensors` and `metadata` as a checkpoint under `directory`; return its manifest.

    `metadata` must hold ``round`` (int) and ``run`` (32-byte run ID, or b"");
    other entries are scalars or short bytes. The same tensors, metadata and
    chunk size always give the same checkpoint ID (for a given zstd library).
    Chunks already present with the right bytes are not written again. Raises
    `CheckpointError` for a state the format cannot hold, `OSError` if the disk
    fails; either way no partial file is left visible. `level` is the zstd level of
    the chunks (`FAST_LEVEL` for a state written every round: same format, no
    compression work).
    """
    return _store_state(directory, _state_pieces(tensors), metadata, chunk_size, level)


def checkpoint_manifest(
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    metadata: dict[str, Any],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    level: int = COMPRESSION_LEVEL,
) -> Manifest:
    """The manifest (so the checkpoint ID) that `write_checkpoint` would give these arguments,
    computed without writing anything: a peer can attest a state that others store."""
    return _store_state(None, _state_pieces(tensors), metadata, chunk_size, level)


def state_digest(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> bytes:
    """The `state_hash` that `write_checkpoint` gives these tensors, computed without writing
    anything: a peer can vote for a state before (or without) storing it."""
    digest = hashlib.sha256()
    for piece in _state_pieces(tensors):
        digest.update(piece)
    return digest.digest()


def _state_pieces(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> Iterator[memoryview | bytes]:
    """The serialized state of `tensors`, piece by piece (`_blob_pieces`); `CheckpointError` for one
    the format cannot hold."""
    arrays = {name: _as_bytes_array(name, value) for name, value in tensors.items()}
    return _blob_pieces(_layout({name: (dtype, shape, data.nbytes) for name, (dtype, shape, data) in arrays.items()}), arrays)


def layout_raw_size(tensors: Mapping[str, TensorSpec]) -> int:
    """The exact size of the serialized state that holds every tensor of `tensors` (the ones that
    are not `required` included) with those dtypes and shapes; `CheckpointError` for a layout the
    format cannot hold."""
    sizes = {}
    for name, spec in tensors.items():
        dtype = DTYPES.get(spec.dtype)
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {spec.dtype!r} is not one a checkpoint can hold")
        shape = tuple(int(n) for n in spec.shape)
        sizes[name] = (dtype, shape, math.prod(shape) * dtype.numpy.itemsize)
    entries = _layout(sizes)
    return len(_prefix(entries)) + (entries[-1].offset + entries[-1].length if entries else 0)


def checkpoint_limits(
    tensors: Mapping[str, TensorSpec], metadata: Mapping[str, Any], *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> ManifestLimits:
    """The limits of a checkpoint that holds exactly `tensors` (the ones not `required` may be
    absent) and whose metadata holds `metadata`, written in chunks of `chunk_size`: its raw size is
    at most that of the state with every tensor."""
    return ManifestLimits(
        max_raw_size=layout_raw_size(tensors), max_chunk_size=chunk_size, metadata=metadata, tensors=tensors,
    )


def _store_state(
    directory: str | os.PathLike | None, pieces: Iterable[bytes | memoryview], metadata: dict[str, Any],
    chunk_size: int, level: int = COMPRESSION_LEVEL,
) -> Manifest:
    """Chunk, compress and store a serialized state given piece by piece, then its manifest
    (with no `directory`, only build the manifest)."""
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise CheckpointError("bad-state", f"chunk size {chunk_size} is outside [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
    round_, run, rest = split_metadata(metadata)
    writer = _ChunkWriter(None if directory is None else Path(directory), chunk_size, level)
    for piece in pieces:
        writer.feed(piece)
    chunks, raw_size, state_hash = writer.finish()
    manifest = Manifest.build(
        raw_size=raw_size, chunk_size=chunk_size, chunks=chunks, round=round_, run=run, metadata=rest,
        state_hash=state_hash,
    )
    if directory is not None:
        atomic_write(manifest_path(directory, manifest.id), manifest.encode())
    return manifest


def _as_bytes_array(name: str, value: torch.Tensor | np.ndarray) -> tuple[DType, tuple[int, ...], np.ndarray]:
    """(dtype, shape, the values as flat little-endian bytes), sharing memory where the layout allows."""
    if not isinstance(name, str) or not 1 <= len(name) <= 256:
        raise CheckpointError("bad-state", f"tensor name {name!r:.80} must be a string of 1 to 256 characters")
    if isinstance(value, torch.Tensor):
        dtype = _BY_TORCH.get(value.dtype)
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {value.dtype} is not one a checkpoint can hold")
        flat = value.detach().cpu().contiguous()
        if dtype.name == "bfloat16":
            flat = flat.view(torch.int16)
        array = flat.numpy()
    elif isinstance(value, np.ndarray):
        dtype = _BY_NUMPY.get(value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype)
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {value.dtype} is not one a checkpoint can hold")
        array = value
    else:
        raise CheckpointError("bad-state", f"{name}: a {type(value).__name__} is not a tensor or an array")
    shape = tuple(int(n) for n in array.shape)  # before ascontiguousarray, which makes a 0-d array 1-d
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return dtype, shape, array.reshape(-1).view(np.uint8)


def _layout(sizes: dict[str, tuple[DType, tuple[int, ...], int]]) -> list[_Entry]:
    """Where each tensor (name -> dtype, shape, byte length) goes: sorted by name, each aligned."""
    entries, offset = [], 0
    for name in sorted(sizes):
        dtype, shape, length = sizes[name]
        entries.append(_Entry(name, dtype, shape, offset, length))
        offset = _align(offset + length)
    return entries


def _prefix(entries: list[_Entry]) -> bytes:
    """The blob up to its tensor bytes: magic, header length, header, zero padding."""
    header = pack({"tensors": [entry.header() for entry in entries]})
    if len(header) > MAX_HEADER_SIZE:
        raise CheckpointError("bad-state", f"a header of {len(header)} bytes is over {MAX_HEADER_SIZE}: too many tensors")
    prefix = MAGIC + len(header).to_bytes(4, "little") + header
    return prefix + bytes(_align(len(prefix)) - len(prefix))


def _blob_pieces(entries: list[_Entry], arrays: dict[str, Any]) -> Iterator[memoryview | bytes]:
    """The blob, piece by piece, without ever joining the tensors into one buffer."""
    yield _prefix(entries)
    position = 0
    for entry in entries:
        yield bytes(entry.offset - position)
        yield memoryview(arrays[entry.name][2])
        position = entry.offset + entry.length


class _ChunkWriter:
    """Cuts a stream of bytes into chunks; compresses, hashes and stores each one as it fills
    (stores nothing when it has no directory: the chunk references are all it makes then)."""

    def __init__(self, directory: Path | None, chunk_size: int, level: int) -> None:
        self.directory = directory
        self.level = level
        self.buffer = bytearray(chunk_size)
        self.filled = 0
        self.chunks: list[ChunkRef] = []
        self.raw_size = 0
        self.state = hashlib.sha256()

    def feed(self, piece: memoryview | bytes) -> None:
        piece = memoryview(piece).cast("B")
        while piece:
            take = min(len(piece), len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take] = piece[:take]
            self.filled += take
            piece = piece[take:]
            if self.filled == len(self.buffer):
                self._flush()

    def finish(self) -> tuple[list[ChunkRef], int, bytes]:
        if self.filled:
            self._flush()
        return self.chunks, self.raw_size, self.state.digest()

    def _flush(self) -> None:
        raw = memoryview(self.buffer)[: self.filled]
        self.state.update(raw)
        frame = compress(raw, level=self.level)
        digest = hashlib.sha256(frame).digest()
        if self.directory is not None:
            _store_frame(chunk_path(self.directory, digest), frame, digest)
        self.chunks.append(ChunkRef(digest, len(frame), self.filled))
        self.raw_size += self.filled
        self.filled = 0


def _store_frame(path: Path, frame: bytes, digest: bytes) -> None:
    """Write a chunk unless the same bytes are already there (a damaged copy is replaced)."""
    try:
        if path.stat().st_size == len(frame) and hashlib.sha256(path.read_bytes()).digest() == digest:
            return
    except FileNotFoundError:
        pass
    atomic_write(path, frame)


# --- chunks from the network ---------------------------------------------------------------------


def decode_chunk(manifest: Manifest, index: int, data: bytes) -> bytes:
    """Verify chunk `index` (`verify_chunk`), then inflate it to exactly its raw size, or raise `CheckpointError`."""
    verify_chunk(manifest, index, data)
    expected = manifest.chunks[index].raw_size
    try:
        raw = decompress(data, max_output=expected)
    except ProtocolError as exc:
        raise CheckpointError("bad-chunk", f"chunk {index} ({manifest.chunks[index].hash.hex()}): {exc.reason}") from None
    if len(raw) != expected:
        raise CheckpointError("bad-chunk", f"chunk {index} inflates to {len(raw)} bytes, expected {expected}")
    return raw


def store_chunk(directory: str | os.PathLike, manifest: Manifest, index: int, data: bytes) -> None:
    """Verify chunk `index` of `manifest` and store it atomically (what a downloader calls per chunk)."""
    verify_chunk(manifest, index, data)
    _store_frame(chunk_path(directory, manifest.chunks[index].hash), data, manifest.chunks[index].hash)


def missing_chunks(directory: str | os.PathLike, manifest: Manifest) -> list[int]:
    """Indices of the chunks of `manifest` with no file of the right size under `directory` yet."""
    missing = []
    for index, ref in enumerate(manifest.chunks):
        try:
            if chunk_path(directory, ref.hash).stat().st_size == ref.size:
                continue
        except FileNotFoundError:
            pass
        missing.append(index)
    return missing


# --- removing -----------------------------------------------------------------------------------


def remove_checkpoints(directory: str | os.PathLike, doomed: Callable[[dict[str, Any]], bool]) -> int:
    """Delete every checkpoint whose full metadata satisfies `doomed`, and the chunks no kept
    checkpoint shares; return how many checkpoints went.

    Manifests go first, so a manifest that is visible still names chunks that are there. A
    manifest that cannot be read is left alone (and its chunks kept): deleting what we cannot
    understand could lose a user's only copy.
    """
    folder = Path(directory) / "manifests"
    kept_chunks: set[bytes] = set()
    doomed_chunks: set[bytes] = set()
    removed = 0
    for path in sorted(folder.glob("*.msgpack")) if folder.is_dir() else []:
        try:
            manifest = read_manifest(path.read_bytes())
        except (OSError, CheckpointError):
            continue
        hashes = {ref.hash for ref in manifest.chunks}
        if not doomed(manifest.full_metadata):
            kept_chunks |= hashes
            continue
        path.unlink(missing_ok=True)
        doomed_chunks |= hashes
        removed += 1
    for chunk_hash in doomed_chunks - kept_chunks:
        chunk_path(directory, chunk_hash).unlink(missing_ok=True)
    return removed


# --- loading ------------------------------------------------------------------------------------


def load_checkpoint(
    directory: str | os.PathLike, checkpoint_id: bytes | str, limits: ManifestLimits | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read checkpoint `checkpoint_id` (bytes or hex) from `directory`: (tensors, metadata).

    Every chunk is checked against its hash before it is inflated, the whole
    state against `state_hash`, and the header against the format's rules; any
    failure is a `CheckpointError` that names the chunk or the rule. With
    `limits`, a checkpoint that breaks them raises `LimitError` before the state
    is allocated: the manifest is checked first, then the header (inflated from
    the first chunks alone) against `limits.tensors`. The tensors are CPU torch
    tensors, views into one buffer; `metadata` holds ``round`` and ``run`` with
    the writer's other entries.
    """
    manifest = _read_manifest_file(directory, _parse_id(checkpoint_id))
    if limits is not None:
        limits.check(manifest)
    reader = _StateReader(directory, manifest)
    data_start, entries = _parse_header(reader.read_head(), manifest.raw_size)
    if limits is not None and limits.tensors is not None:
        _check_layout(entries, limits.tensors)
    blob = reader.read_all()
    return _views(blob, data_start, entries), manifest.full_metadata


class _StateReader:
    """The chunks of a stored checkpoint, each verified and inflated in order: first only as many
    as hold the header, then the whole state into one buffer, checked against `state_hash`."""

    def __init__(self, directory: str | os.PathLike, manifest: Manifest) -> None:
        self.directory, self.manifest = directory, manifest
        self.head: list[bytes] = []  # the chunks inflated by `read_head`
        self.next = 0

    def _inflate_next(self) -> bytes:
        index, self.next = self.next, self.next + 1
        return decode_chunk(self.manifest, index, _read_chunk_file(self.directory, self.manifest, index))

    def read_head(self) -> bytes:
        """The state's first bytes, up to the end of its header as its prefix states it (never past
        `MAX_HEADER_SIZE`), or all of the state if it ends sooner."""
        size, wanted = 0, PREFIX_SIZE
        while size < wanted and self.next < len(self.manifest.chunks):
            self.head.append(self._inflate_next())
            size += len(self.head[-1])
            if wanted == PREFIX_SIZE and size >= PREFIX_SIZE:
                first = b"".join(self.head)[:PREFIX_SIZE]
                wanted += min(int.from_bytes(first[len(MAGIC) :], "little"), MAX_HEADER_SIZE)
        return b"".join(self.head)

    def read_all(self) -> np.ndarray:
        """The whole state in one buffer of `raw_size` bytes (the manifest's chunk sizes add up to it)."""
        blob = np.empty(self.manifest.raw_size, dtype=np.uint8)
        state = hashlib.sha256()
        position = 0
        head, self.head = self.head, []
        rest = (self._inflate_next() for _ in range(self.next, len(self.manifest.chunks)))
        for raw in itertools.chain(head, rest):
            blob[position : position + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
            state.update(raw)
            position += len(raw)
        if state.digest() != self.manifest.state_hash:
            raise CheckpointError("bad-state", "the chunks inflate to a state that does not match state_hash")
        return blob


def _parse_id(checkpoint_id: bytes | str) -> bytes:
    if isinstance(checkpoint_id, str):
        try:
            checkpoint_id = bytes.fromhex(checkpoint_id)
        except ValueError:
            raise CheckpointError("wrong-id", f"{checkpoint_id[:80]!r} is not a hex checkpoint ID") from None
    if not isinstance(checkpoint_id, bytes) or len(checkpoint_id) != HASH_SIZE:
        raise CheckpointError("wrong-id", f"a checkpoint ID is {HASH_SIZE} bytes")
    return checkpoint_id


def _read_manifest_file(directory: str | os.PathLike, checkpoint_id: bytes) -> Manifest:
    path = manifest_path(directory, checkpoint_id)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError("missing-manifest", f"cannot read {path}: {exc.strerror}") from None
    return read_manifest(data, expected_id=checkpoint_id)


def _read_chunk_file(directory: str | os.PathLike, manifest: Manifest, index: int) -> bytes:
    ref = manifest.chunks[index]
    path = chunk_path(directory, ref.hash)
    try:
        with open(path, "rb") as file:
            return file.read(ref.size + 1)  # one byte more shows a file that is too long, without reading it all
    except OSError as exc:
        reason = f"chunk {index} ({ref.hash.hex()}): cannot read {path}: {exc.strerror}"
        raise CheckpointError("missing-chunk", reason) from None


def _tensors_from_blob(blob: np.ndarray) -> dict[str, torch.Tensor]:
    """Validate the blob's header and return its tensors as views into `blob`."""
    return _views(blob, *_parse_header(blob[: PREFIX_SIZE + MAX_HEADER_SIZE].tobytes(), len(blob)))


def _views(blob: np.ndarray, data_start: int, entries: list[_Entry]) -> dict[str, torch.Tensor]:
    """The tensors of the blob whose (validated) header gave `data_start` and `entries`, as views into `blob`."""
    tensors = {}
    for entry in entries:
        start = data_start + entry.offset
        raw = blob[start : start + entry.length]
        if entry.dtype.name == "bool" and entry.length and raw.max() > 1:
            raise CheckpointError("bad-header", f"{entry.name}: a bool tensor holds bytes other than 0 and 1")
        array = raw.view(entry.dtype.numpy).reshape(entry.shape)
        tensor = torch.from_numpy(array)
        tensors[entry.name] = tensor.view(torch.bfloat16) if entry.dtype.name == "bfloat16" else tensor
    return tensors


def _parse_header(head: bytes, state_size: int) -> tuple[int, list[_Entry]]:
    """(where tensor bytes start, the entries) of a state of `state_size` bytes that begins with
    `head` (at least its prefix and header), every rule checked against that size."""
    if len(head) < PREFIX_SIZE or head[: len(MAGIC)] != MAGIC:
        raise CheckpointError("bad-header", "the state does not start with the checkpoint magic")
    header_size = int.from_bytes(head[len(MAGIC) : PREFIX_SIZE], "little")
    if header_size > MAX_HEADER_SIZE or PREFIX_SIZE + header_size > min(state_size, len(head)):
        raise CheckpointError("bad-header", f"header of {header_size} bytes does not fit the state")
    try:
        header = unpack(head[PREFIX_SIZE : PREFIX_SIZE + header_size], max_size=MAX_HEADER_SIZE)
        _HEADER_SCHEMA.check(header)
    except ProtocolError as exc:
        raise CheckpointError("bad-header", f"{exc.code}: {exc.reason}") from None
    data_start = _align(PREFIX_SIZE + header_size)
    entries = [_Entry(t["name"], DTYPES[t["dtype"]], tuple(t["shape"]), t["offset"], t["length"]) for t in header["tensors"]]
    _check_entries(entries, state_size - data_start)
    return data_start, entries


def _check_layout(entries: list[_Entry], tensors: Mapping[str, TensorSpec]) -> None:
    """Every tensor in the header is one of `tensors`, with its dtype and shape, and every
    required one is there; else `LimitError` (limit ``tensors``)."""
    held = {entry.name for entry in entries}
    missing = sorted(name for name, spec in tensors.items() if spec.required and name not in held)
    if missing:
        raise LimitError("tensors", f"the state lacks {missing}")
    for entry in entries:
        spec = tensors.get(entry.name)
        if spec is None:
            raise LimitError("tensors", f"{entry.name!r:.80} is not one of {sorted(tensors)}")
        if entry.dtype.name != spec.dtype or entry.shape != tuple(spec.shape):
            got, expected = f"{entry.dtype.name}{list(entry.shape)}", f"{spec.dtype}{list(spec.shape)}"
            raise LimitError("tensors", f"{entry.name!r} is {got:.80}, expected {expected:.80}")


def _check_entries(entries: list[_Entry], data_size: int) -> None:
    """Names unique; each tensor aligned, sized by its shape, after the previous one; the last ends the state."""
    names, end = set(), 0
    for entry in entries:
        problem = _entry_problem(entry, names, end, data_size)
        if problem:
            raise CheckpointError("bad-header", f"{entry.name!r}: {problem}")
        names.add(entry.name)
        end = entry.offset + entry.length
    if end != data_size:
        raise CheckpointError("bad-header", f"the state has {data_size - end} bytes after its last tensor")


def _entry_problem(entry: _Entry, names: set[str], previous_end: int, data_size: int) -> str | None:
    if entry.name in names:
        return "listed twice"
    if entry.offset % ALIGN:
        return f"offset {entry.offset} is not a multiple of {ALIGN}"
    if entry.offset < previous_end:
        return f"offset {entry.offset} overlaps the tensor before it (it ends at {previous_end})"
    if math.prod(entry.shape) * entry.dtype.numpy.itemsize != entry.length:
        return f"shape {list(entry.shape)} of {entry.dtype.name} is not {entry.length} bytes"
    if entry.offset + entry.length > data_size:
        return f"bytes [{entry.offset}, {entry.offset + entry.length}) run past the state's {data_size}"
    return None


def _align(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
