"""Checkpoints on disk: named tensors as raw bytes behind a msgpack header, in hashed chunks.

The serialized state (the "blob", see `state_format`: tensors as raw bytes
behind a msgpack header, no pickle) is cut into chunks and named by a manifest
(`checkpoint_manifest`).
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
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

from locomesh.protocol import ProtocolError, compress, decompress
from locomesh.protocol.files import atomic_write

from .checkpoint_manifest import (
    chunk_path, manifest_path, DEFAULT_CHUNK_SIZE, HASH_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, CheckpointError, ChunkRef,
    LimitError, Manifest, ManifestLimits, TensorSpec, merkle_proof, merkle_root, read_manifest, split_metadata, verify_chunk,
    verify_merkle_proof,
)
from .state_format import MAGIC, MAX_HEADER_SIZE, PREFIX_SIZE, check_layout, layout_raw_size, parse_header, state_pieces, views

__all__ = [
    "DEFAULT_CHUNK_SIZE", "CheckpointError", "ChunkRef", "LimitError", "Manifest", "ManifestLimits", "TensorSpec",
    "checkpoint_limits", "checkpoint_manifest", "chunk_path", "decode_chunk", "layout_raw_size", "load_checkpoint",
    "manifest_path", "merkle_proof", "merkle_root", "missing_chunks", "read_manifest", "remove_checkpoints",
    "state_digest", "store_chunk", "verify_chunk", "verify_merkle_proof", "write_checkpoint",
]

COMPRESSION_LEVEL = 1  # level 3 saves no more bytes of float weights, at under half the speed (README, Measured figures)
# A negative level stores float weights as raw zstd blocks (no compression) several times faster than
# level 1, which saves a few percent: the choice for a run state written every round, where level 1
# would cost every peer CPU time each round and save bytes only for the rare syncing peer (README, Measured figures).
FAST_LEVEL = -1


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
    return _store_state(directory, state_pieces(tensors), metadata, chunk_size, level)


def checkpoint_manifest(
    tensors: Mapping[str, torch.Tensor | np.ndarray],
    metadata: dict[str, Any],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    level: int = COMPRESSION_LEVEL,
) -> Manifest:
    """The manifest (so the checkpoint ID) that `write_checkpoint` would give these arguments,
    computed without writing anything: a peer can attest a state that others store."""
    return _store_state(None, state_pieces(tensors), metadata, chunk_size, level)


def state_digest(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> bytes:
    """The `state_hash` that `write_checkpoint` gives these tensors, computed without writing
    anything: a peer can vote for a state before (or without) storing it."""
    digest = hashlib.sha256()
    for piece in state_pieces(tensors):
        digest.update(piece)
    return digest.digest()


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
    data_start, entries = parse_header(reader.read_head(), manifest.raw_size)
    if limits is not None and limits.tensors is not None:
        check_layout(entries, limits.tensors)
    blob = reader.read_all()
    return views(blob, data_start, entries), manifest.full_metadata


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


