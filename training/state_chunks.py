"""A state as the chunks of a checkpoint, and the manifest they make: computed, never stored.

The serialized state (the "blob", see `state_format`: tensors as raw bytes behind a msgpack
header, no pickle) is cut into chunks of `chunk_size` raw bytes, each compressed on its own and
named by the SHA-256 of its compressed bytes; the manifest (`checkpoint_manifest`) lists them, and
its hash is the checkpoint ID. `StateChunks` hands the chunks out one at a time, so whoever
consumes them holds one chunk besides the caller's tensors: the node's store
(`locomesh.node.transfer.store`) writes them; `checkpoint_manifest` only hashes them, so a peer
can attest a state that others store. `decode_chunk` is the way back, for one chunk.

Pure: no files, no network.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Iterator, Mapping

from locomesh.protocol import ProtocolError, compress, decompress

from .checkpoint_manifest import (
    DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, CheckpointError, ChunkRef, Manifest, ManifestLimits,
    TensorSpec, split_metadata, verify_chunk,
)
from .state_format import layout_raw_size, state_pieces

COMPRESSION_LEVEL = 1  # level 3 saves no more bytes of float weights, at under half the speed (docs/measurements.md)
# A negative level stores float weights as raw zstd blocks (no compression) several times faster than
# level 1, which saves a few percent: the choice for a run state written every round, where level 1
# would cost every peer CPU time each round and save bytes only for the rare syncing peer (docs/measurements.md).
FAST_LEVEL = -1

Tensors = Mapping[str, Any]  # name -> torch tensor or numpy array (`state_format` says which dtypes)


class StateChunks:
    """The chunks of one serialized state, given piece by piece: iterate once for
    (`ChunkRef`, compressed bytes) pairs in order, then `manifest()` names them with `metadata`.

    `metadata` must hold ``round`` (int) and ``run`` (32-byte run ID, or b""); other entries are
    scalars or short bytes. Raises `CheckpointError` for a chunk size or metadata the format
    cannot hold before anything is compressed. The same state, metadata, chunk size and level
    always give the same chunks and checkpoint ID (for a given zstd library).
    """

    def __init__(
        self, pieces: Iterable[bytes | memoryview], metadata: dict[str, Any], *,
        chunk_size: int = DEFAULT_CHUNK_SIZE, level: int = COMPRESSION_LEVEL,
    ) -> None:
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise CheckpointError("bad-state", f"chunk size {chunk_size} is outside [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
        self.round, self.run, self.metadata = split_metadata(metadata)
        self.pieces, self.chunk_size, self.level = pieces, chunk_size, level
        self.refs: list[ChunkRef] = []
        self.raw_size = 0
        self._state = hashlib.sha256()
        self._finished = False

    def __iter__(self) -> Iterator[tuple[ChunkRef, bytes]]:
        buffer, filled = bytearray(self.chunk_size), 0
        for piece in self.pieces:
            piece = memoryview(piece).cast("B")
            while piece:
                take = min(len(piece), len(buffer) - filled)
                buffer[filled : filled + take] = piece[:take]
                filled += take
                piece = piece[take:]
                if filled == len(buffer):
                    yield self._chunk(memoryview(buffer)[:filled])
                    filled = 0
        if filled:
            yield self._chunk(memoryview(buffer)[:filled])
        self._finished = True

    def _chunk(self, raw: memoryview) -> tuple[ChunkRef, bytes]:
        """Compress and hash one chunk's raw bytes (they are copied out before the buffer is reused)."""
        self._state.update(raw)
        frame = compress(raw, level=self.level)
        ref = ChunkRef(hashlib.sha256(frame).digest(), len(frame), len(raw))
        self.refs.append(ref)
        self.raw_size += len(raw)
        return ref, frame

    def manifest(self) -> Manifest:
        """The manifest of the chunks, once every one of them was handed out."""
        if not self._finished:
            raise RuntimeError("the manifest is known once every chunk was handed out")
        return Manifest.build(
            raw_size=self.raw_size, chunk_size=self.chunk_size, chunks=self.refs, round=self.round, run=self.run,
            metadata=self.metadata, state_hash=self._state.digest(),
        )


def chunk_state(
    tensors: Tensors, metadata: dict[str, Any], *, chunk_size: int = DEFAULT_CHUNK_SIZE, level: int = COMPRESSION_LEVEL,
) -> StateChunks:
    """The chunks of `tensors` with `metadata`; `CheckpointError` for a state the format cannot hold.
    `level` is the zstd level of the chunks (`FAST_LEVEL` for a state written every round: same
    format, no compression work)."""
    return StateChunks(state_pieces(tensors), metadata, chunk_size=chunk_size, level=level)


def checkpoint_manifest(
    tensors: Tensors, metadata: dict[str, Any], *, chunk_size: int = DEFAULT_CHUNK_SIZE, level: int = COMPRESSION_LEVEL,
) -> Manifest:
    """The manifest (so the checkpoint ID) that storing these arguments gives, computed without
    storing anything: a peer can attest a state that others store."""
    chunks = chunk_state(tensors, metadata, chunk_size=chunk_size, level=level)
    for _ in chunks:
        pass
    return chunks.manifest()


def state_digest(tensors: Tensors) -> bytes:
    """The `state_hash` of the checkpoint of these tensors, computed without chunking them: a peer
    can vote for a state before (or without) storing it."""
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


def decode_chunk(manifest: Manifest, index: int, data: bytes) -> bytes:
    """Verify chunk `index` (`verify_chunk`), then inflate it to exactly its raw size, or raise `CheckpointError`."""
    verify_chunk(manifest, index, data)
    return inflate_chunk(manifest, index, data)


def inflate_chunk(manifest: Manifest, index: int, data: bytes) -> bytes:
    """Chunk `index` inflated to exactly its raw size, or `CheckpointError`; for bytes already
    verified against the manifest (`decode_chunk` does both)."""
    expected = manifest.chunks[index].raw_size
    try:
        raw = decompress(data, max_output=expected)
    except ProtocolError as exc:
        raise CheckpointError("bad-chunk", f"chunk {index} ({manifest.chunks[index].hash.hex()}): {exc.reason}") from None
    if len(raw) != expected:
        raise CheckpointError("bad-chunk", f"chunk {index} inflates to {len(raw)} bytes, expected {expected}")
    return raw
