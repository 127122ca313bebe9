"""The node's checkpoint store: checkpoints on disk as content-addressed chunks and manifests.

What a checkpoint is (a serialized state cut into compressed, hashed chunks, named by a manifest
whose hash is the checkpoint ID) is training's, and pure: `locomesh.training.state_format`,
`state_chunks` and `checkpoint_manifest`. This module keeps them in files, under a checkpoint
directory (the data dir's ``checkpoints/``):

    chunks/<sha256 of the compressed chunk, hex>
    manifests/<checkpoint ID, hex>.msgpack

Every file is written atomically (temporary file, fsync, rename), chunks before
the manifest, so a manifest that is visible names chunks that are there.
Chunks are shared between checkpoints that have them in common. A writer of several checkpoints
that form one whole (a dataset) passes a `created` list, which gets the path of each file it added,
and on failure takes them back with `remove_created`.

Memory: writing holds one chunk at a time besides the caller's tensors; loading
holds one buffer the size of the state, and the returned tensors are views into
it, plus one chunk at a time. A state from a peer is loaded with the caller's
`ManifestLimits`: its manifest is checked against them first, then its header
(read from the first chunks alone) against the layout they name, and only then
is the buffer allocated, so a manifest's claimed size never allocates anything.

Every function blocks on the disk (and hashes): the daemon runs them in a worker thread
(its `Offload`). Importing this module loads no torch: only loading a state makes tensors.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from locomesh.node.files import atomic_write
from locomesh.training.checkpoint_manifest import (
    DEFAULT_CHUNK_SIZE, HASH_SIZE, CheckpointError, Manifest, ManifestLimits, read_manifest, verify_chunk,
)
from locomesh.training.contract import PAYLOAD_TENSOR
from locomesh.training.state_chunks import COMPRESSION_LEVEL, FAST_LEVEL, StateChunks, Tensors, chunk_state, decode_chunk
from locomesh.training.state_format import MAGIC, MAX_HEADER_SIZE, PREFIX_SIZE, check_layout, parse_header, views

if TYPE_CHECKING:  # both load torch, which a daemon must not do before it trains (`node.debug`)
    import torch

    from locomesh.training.participant import StateSnapshot


# --- where things are ---------------------------------------------------------------------------


def chunk_path(directory: str | os.PathLike, chunk_hash: bytes) -> Path:
    return Path(directory) / "chunks" / chunk_hash.hex()


def manifest_path(directory: str | os.PathLike, checkpoint_id: bytes) -> Path:
    return Path(directory) / "manifests" / f"{checkpoint_id.hex()}.msgpack"


def checkpoint_ids(directory: str | os.PathLike) -> list[bytes]:
    """The IDs of the manifests filed under `directory`, in order (a file whose name is no ID is skipped)."""
    ids = []
    folder = Path(directory) / "manifests"
    for path in sorted(folder.glob("*.msgpack")) if folder.is_dir() else []:
        try:
            checkpoint_id = bytes.fromhex(path.name.removesuffix(".msgpack"))
        except ValueError:
            continue
        if len(checkpoint_id) == HASH_SIZE:
            ids.append(checkpoint_id)
    return ids


# --- writing ------------------------------------------------------------------------------------


def write_checkpoint(
    directory: str | os.PathLike,
    tensors: Tensors,
    metadata: dict[str, Any],
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    level: int = COMPRESSION_LEVEL,
    created: list[Path] | None = None,
) -> Manifest:
    """Write `tensors` and `metadata` as a checkpoint under `directory`; return its manifest.

    `metadata` must hold ``round`` (int) and ``run`` (32-byte run ID, or b"");
    other entries are scalars or short bytes. The same tensors, metadata and
    chunk size always give the same checkpoint ID (for a given zstd library).
    Chunks already present with the right bytes are not written again. Raises
    `CheckpointError` for a state the format cannot hold, `OSError` if the disk
    fails; either way no partial file is left visible. `level` is the zstd level of
    the chunks (`FAST_LEVEL` for a state written every round: same format, no
    compression work). `created`, if given, gets the path of every file added (not of those that
    were there already), in the order written.
    """
    return write_chunks(directory, chunk_state(tensors, metadata, chunk_size=chunk_size, level=level), created)


def write_chunks(directory: str | os.PathLike, chunks: StateChunks, created: list[Path] | None = None) -> Manifest:
    """Store every chunk of `chunks` as it is made, then its manifest; return the manifest.
    `created`: as `write_checkpoint`."""
    for ref, frame in chunks:
        _store_frame(chunk_path(directory, ref.hash), frame, ref.hash, created)
    manifest = chunks.manifest()
    install_manifest(directory, manifest, created)
    return manifest


def write_frames(directory: str | os.PathLike, manifest: Manifest, frames: list[bytes]) -> None:
    """Store a checkpoint whose compressed chunks are in hand (a held one: `held.HeldCheckpoint`),
    each checked against `manifest` as it is stored, then its manifest (atomically, last)."""
    for index, frame in enumerate(frames):
        store_chunk(directory, manifest, index, frame)
    install_manifest(directory, manifest)


def install_manifest(directory: str | os.PathLike, manifest: Manifest, created: list[Path] | None = None) -> None:
    """Write `manifest` (atomically): from then on its checkpoint can be loaded and is served, so
    every chunk it names must be stored already. `created`: as `write_checkpoint`."""
    path = manifest_path(directory, manifest.id)
    _write_new(path, manifest.encode(), created, existed=path.exists())


def _store_frame(path: Path, frame: bytes, digest: bytes, created: list[Path] | None = None) -> None:
    """Write a chunk unless the same bytes are already there (a damaged copy is replaced)."""
    try:
        if path.stat().st_size == len(frame) and hashlib.sha256(path.read_bytes()).digest() == digest:
            return
        existed = True
    except FileNotFoundError:
        existed = False
    _write_new(path, frame, created, existed=existed)


def _write_new(path: Path, data: bytes, created: list[Path] | None, *, existed: bool) -> None:
    """`atomic_write`, noting `path` in `created` if the file is new: one that was there before
    belongs to other checkpoints too, and must outlive a failed writer's clean-up."""
    atomic_write(path, data)
    if created is not None and not existed:
        created.append(path)


def remove_created(created: list[Path]) -> None:
    """Delete the files a failed writer added (its `created`), newest first: a manifest before its
    chunks, so a manifest still visible names chunks that are there. Best effort: it runs while
    another error is on its way to the user, which it must not hide."""
    for path in reversed(created):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


# --- chunks from the network ------------------------------------------------------------------


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


def installed_manifest(directory: str | os.PathLike, checkpoint_id: bytes) -> Manifest | None:
    """The manifest of `checkpoint_id` if it is stored whole under `directory` (its manifest and a
    file of the right size for every chunk; the bytes are verified when it is loaded), else None."""
    try:
        manifest = read_stored_manifest(directory, checkpoint_id)
    except CheckpointError:
        return None
    return None if missing_chunks(directory, manifest) else manifest


def has_checkpoint(directory: str | os.PathLike, checkpoint_id: bytes) -> bool:
    """Whether checkpoint `checkpoint_id` is stored whole under `directory` (`installed_manifest`)."""
    return installed_manifest(directory, checkpoint_id) is not None


# --- removing -----------------------------------------------------------------------------------


def remove_checkpoints(directory: str | os.PathLike, doomed: Callable[[dict[str, Any]], bool]) -> int:
    """Delete every checkpoint whose full metadata satisfies `doomed`, and the chunks no kept
    checkpoint shares; return how many checkpoints went.

    Manifests go first, so a manifest that is visible still names chunks that are there. A
    manifest that cannot be read is left alone (and its chunks kept): deleting what we cannot
    understand could lose a user's only copy.
    """
    return _remove(directory, lambda _checkpoint_id, metadata: doomed(metadata))


def remove_checkpoint_ids(directory: str | os.PathLike, doomed: Collection[bytes]) -> int:
    """Delete the checkpoints `doomed` (IDs) as `remove_checkpoints` does; how many went."""
    return _remove(directory, lambda checkpoint_id, _metadata: checkpoint_id in doomed)


def _remove(directory: str | os.PathLike, doomed: Callable[[bytes, dict[str, Any]], bool]) -> int:
    kept_chunks: set[bytes] = set()
    doomed_chunks: set[bytes] = set()
    removed = 0
    for checkpoint_id in checkpoint_ids(directory):
        try:
            manifest = read_stored_manifest(directory, checkpoint_id)
        except CheckpointError:
            continue
        hashes = {ref.hash for ref in manifest.chunks}
        if not doomed(checkpoint_id, manifest.full_metadata):
            kept_chunks |= hashes
            continue
        manifest_path(directory, checkpoint_id).unlink(missing_ok=True)
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
    tensors, manifest = _load(directory, checkpoint_id, limits)
    return tensors, manifest.full_metadata


def _load(
    directory: str | os.PathLike, checkpoint_id: bytes | str, limits: ManifestLimits | None
) -> tuple[dict[str, torch.Tensor], Manifest]:
    """`load_checkpoint`, with the manifest instead of its metadata."""
    manifest = read_stored_manifest(directory, _parse_id(checkpoint_id))
    if limits is not None:
        limits.check(manifest)
    reader = _StateReader(directory, manifest)
    data_start, entries = parse_header(reader.read_head(), manifest.raw_size)
    if limits is not None and limits.tensors is not None:
        check_layout(entries, limits.tensors)
    blob = reader.read_all()
    return views(blob, data_start, entries), manifest


class _StateReader:
    """The chunks of a stored checkpoint, each verified and inflated in order: first only as many
    as hold the header, then the whole state into one buffer, checked against `state_hash`."""

    def __init__(self, directory: str | os.PathLike, manifest: Manifest) -> None:
        self.directory, self.manifest = directory, manifest
        self.head: list[bytes] = []  # the chunks inflated by `read_head`
        self.next = 0

    def _inflate_next(self) -> bytes:
        index, self.next = self.next, self.next + 1
        return decode_chunk(self.manifest, index, read_stored_chunk(self.directory, self.manifest, index))

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


def read_stored_manifest(directory: str | os.PathLike, checkpoint_id: bytes) -> Manifest:
    """The manifest filed under `checkpoint_id`, validated and hashing to it; else `CheckpointError`
    (``missing-manifest`` when it cannot be read)."""
    path = manifest_path(directory, checkpoint_id)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError("missing-manifest", f"cannot read {path}: {exc.strerror}") from None
    return read_manifest(data, expected_id=checkpoint_id)


def read_stored_chunk(directory: str | os.PathLike, manifest: Manifest, index: int) -> bytes:
    """The stored bytes of chunk `index` of `manifest`, unverified, and never more than one byte
    past its size; `CheckpointError` (``missing-chunk``) when it cannot be read."""
    ref = manifest.chunks[index]
    path = chunk_path(directory, ref.hash)
    try:
        with open(path, "rb") as file:
            return file.read(ref.size + 1)  # one byte more shows a file that is too long, without reading it all
    except OSError as exc:
        reason = f"chunk {index} ({ref.hash.hex()}): cannot read {path}: {exc.strerror}"
        raise CheckpointError("missing-chunk", reason) from None




# --- round payloads -----------------------------------------------------------------------------


def write_payload(directory: str | os.PathLike, payload: bytes, run: bytes, round_number: int) -> Manifest:
    """Store a payload committed for round `round_number` of run `run` as the checkpoint its commit
    names (one uint8 tensor `PAYLOAD_TENSOR`, metadata ``kind: payload``); its manifest."""
    tensors = {PAYLOAD_TENSOR: np.frombuffer(payload, dtype=np.uint8)}
    # FAST_LEVEL: the payload is zstd already; its chunks are stored, not compressed again
    return write_checkpoint(directory, tensors, {"round": round_number, "run": run, "kind": "payload"}, level=FAST_LEVEL)


def load_payload(directory: str | os.PathLike, payload_id: bytes, limits: ManifestLimits) -> bytes:
    """The bytes of the payload stored as checkpoint `payload_id`. `limits` are what its commit
    allows (`Participant.payload_limits`: run, round and size), checked before anything is
    allocated. `CheckpointError` if it is not stored whole (codes ``missing-manifest``,
    ``missing-chunk``: see `is_missing`), breaks `limits`, or is no payload."""
    tensors, _metadata = load_checkpoint(directory, payload_id, limits)
    payload = tensors.get(PAYLOAD_TENSOR)
    if payload is None:  # `limits` made by `payload_limits` require it; others might not
        raise CheckpointError("bad-header", f"checkpoint {payload_id.hex()[:16]} holds no {PAYLOAD_TENSOR!r} tensor")
    return payload.numpy().tobytes()


def is_missing(error: CheckpointError) -> bool:
    """Does `error` say the checkpoint is not (wholly) in the store, rather than bad?"""
    return error.code in ("missing-manifest", "missing-chunk")


# --- run states ---------------------------------------------------------------------------------


def write_state(directory: str | os.PathLike, snapshot: StateSnapshot, run: bytes) -> Manifest:
    """Store a run state as the checkpoint of its round of run `run` (`StateSnapshot.chunks`: the
    checkpoint whose manifest `snapshot.manifest(run)` is)."""
    return write_chunks(directory, snapshot.chunks(run))


def load_state(directory: str | os.PathLike, checkpoint_id: bytes, participant: Any, run: bytes) -> Manifest:
    """Have `participant` (a `Participant`, or anything with its `state_limits` and `adopt`) adopt
    the state stored as checkpoint `checkpoint_id` of run `run`; its manifest. A checkpoint that
    is not a state of this run's model raises `LimitError` (its `limit` says why) before the state
    is allocated, and nothing is adopted."""
    tensors, manifest = _load(directory, checkpoint_id, participant.state_limits(run))
    participant.adopt(tensors, manifest.round)
    return manifest
