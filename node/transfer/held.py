"""Checkpoints held in memory: a round's payloads, fetched to be aggregated and served on.

A payload is needed for one round: its author's peers fetch it, aggregate it and serve it to
whoever still lacks it, then it is dropped. Writing it to the store (a file per chunk, fsynced,
read back and loaded as a tensor) cost every peer disk work and conversions for every payload
of every round, for bytes nobody reads again. Here a download keeps each chunk's frame, checked
against its hash as it arrives, in memory; once every chunk is there the checkpoint is served
like an installed one (the checkpoint service asks `HeldCheckpoints` before the store) and
`HeldCheckpoint.arrays` inflates it once into the arrays of its state.

Only what this node fetched is held, and it is released with its round, so what a peer can make
us hold is bounded by what we chose to fetch: the run's payload limits times its members.
A node's own payload still goes to the store: after a crash it must contribute the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from locomesh.training.checkpoint_manifest import CheckpointError, Manifest, ManifestLimits, verify_chunk
from locomesh.training.state_chunks import inflate_chunk
from locomesh.training.state_format import MAX_HEADER_SIZE, PREFIX_SIZE, check_layout, parse_header
from locomesh.training.state_format import arrays as state_arrays


class HeldCheckpoint:
    """One checkpoint's manifest and the frames of its chunks, each verified when it arrived."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.frames: list[bytes | None] = [None] * len(manifest.chunks)

    @property
    def complete(self) -> bool:
        return all(frame is not None for frame in self.frames)

    def missing(self) -> list[int]:
        return [index for index, frame in enumerate(self.frames) if frame is None]

    def store(self, index: int, data: bytes) -> None:
        """Keep chunk `index` once it hashes to what the manifest names (`CheckpointError` if not)."""
        verify_chunk(self.manifest, index, data)
        self.frames[index] = bytes(data)

    def frame(self, index: int) -> bytes | None:
        return self.frames[index] if 0 <= index < len(self.frames) else None

    def arrays(self, limits: ManifestLimits) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The state, inflated once into one buffer and checked against the header's rules and
        `limits` (the manifest and the layout before the state is allocated; the layout is what
        makes the arrays safe to read: a payload is one uint8 tensor): (numpy views into that
        buffer by tensor name, the full metadata). `CheckpointError` (a `LimitError` for `limits`)
        if it is incomplete or breaks any of them.

        Every frame was checked against its hash when it was stored, and the manifest's ID
        commits to those hashes, so the bytes are the ones committed to: nothing is hashed again
        (the manifest's `state_hash`, the writer's word on the same bytes, adds nothing)."""
        if not self.complete:
            raise CheckpointError("missing-chunk", f"{len(self.missing())} chunks of the checkpoint are not held")
        limits.check(self.manifest)
        first = inflate_chunk(self.manifest, 0, self.frames[0])
        _check_layout_early(first, self.manifest, limits)
        blob = np.empty(self.manifest.raw_size, dtype=np.uint8)
        position = 0
        for index, frame in enumerate(self.frames):
            raw = first if index == 0 else inflate_chunk(self.manifest, index, frame)
            blob[position : position + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
            position += len(raw)
        data_start, entries = parse_header(blob[: PREFIX_SIZE + MAX_HEADER_SIZE].tobytes(), len(blob))
        if limits.tensors is not None:
            check_layout(entries, limits.tensors)
        return state_arrays(blob, data_start, entries), self.manifest.full_metadata


def _check_layout_early(first: bytes, manifest: Manifest, limits: ManifestLimits) -> None:
    """Refuse a layout `limits` does not allow from the first chunk, before the state is allocated
    (a header longer than that chunk is checked once the state is whole)."""
    if limits.tensors is None:
        return
    try:
        _, entries = parse_header(first, manifest.raw_size)
    except CheckpointError:
        return
    check_layout(entries, limits.tensors)


class HeldCheckpoints:
    """The checkpoints this node holds in memory, by ID."""

    def __init__(self) -> None:
        self._held: dict[bytes, HeldCheckpoint] = {}

    def hold(self, manifest: Manifest) -> HeldCheckpoint:
        """The held checkpoint of `manifest`, made empty if it was not held."""
        held = self._held.get(manifest.id)
        if held is None:
            held = self._held[manifest.id] = HeldCheckpoint(manifest)
        return held

    def complete(self, checkpoint_id: bytes) -> HeldCheckpoint | None:
        """The held checkpoint `checkpoint_id` if every chunk of it is here (what is served), else None."""
        held = self._held.get(checkpoint_id)
        return held if held is not None and held.complete else None

    def release(self, doomed: Callable[[Manifest], bool]) -> int:
        """Drop every held checkpoint whose manifest satisfies `doomed`; how many went."""
        gone = [checkpoint_id for checkpoint_id, held in self._held.items() if doomed(held.manifest)]
        for checkpoint_id in gone:
            del self._held[checkpoint_id]
        return len(gone)

    @property
    def bytes_held(self) -> int:
        return sum(len(frame) for held in self._held.values() for frame in held.frames if frame is not None)

    def __len__(self) -> int:
        return len(self._held)
