"""Where a download puts the chunks it fetched: the chunk store on disk, or memory.

`download_checkpoint` (download.py) asks its sink whether the checkpoint is already whole here,
which chunks are missing, to keep each verified chunk, and to make the whole checkpoint usable
at the end. `StoreSink` does that in the store's files (the manifest written last, atomically);
`HeldSink` in `HeldCheckpoints` (held.py: a round's payloads). Blocking work (hashing, file I/O,
fsync) goes through the caller's `Offload`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from locomesh.training.checkpoint_manifest import Manifest

from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.transfer.store import install_manifest, installed_manifest, missing_chunks, store_chunk

# How blocking store work (hashing, file I/O, fsync) is run: in a worker thread by default, so
# the event loop stays free. The simulator runs it inline instead (netsim/offload.py): a thread's
# real duration would let virtual time jump ahead unpredictably, and same seed => same run.
Offload = Callable[..., Awaitable[Any]]


class DownloadError(Exception):
    """A checkpoint could not be downloaded (no valid manifest, or a chunk no provider would serve)."""


class StoreSink:
    """Where a download puts what it fetched: the chunk store at `directory` (blocking work offloaded)."""

    def __init__(self, directory: Path, offload: Offload) -> None:
        self.directory, self.offload = directory, offload

    async def installed(self, checkpoint_id: bytes) -> Manifest | None:
        return await self.offload(installed_manifest, self.directory, checkpoint_id)

    async def missing(self, manifest: Manifest) -> list[int]:
        return await self.offload(missing_chunks, self.directory, manifest)

    async def store(self, manifest: Manifest, index: int, data: bytes) -> None:
        await self.offload(store_chunk, self.directory, manifest, index, data)

    async def install(self, manifest: Manifest) -> None:
        await self.offload(_install, self.directory, manifest)


class HeldSink:
    """Where a download puts what it fetched: memory (`HeldCheckpoints`); hashing is offloaded."""

    def __init__(self, held: HeldCheckpoints, offload: Offload) -> None:
        self.held, self.offload = held, offload

    async def installed(self, checkpoint_id: bytes) -> Manifest | None:
        complete = self.held.complete(checkpoint_id)
        return None if complete is None else complete.manifest

    async def missing(self, manifest: Manifest) -> list[int]:
        return self.held.hold(manifest).missing()

    async def store(self, manifest: Manifest, index: int, data: bytes) -> None:
        await self.offload(self.held.hold(manifest).store, index, data)

    async def install(self, manifest: Manifest) -> None:
        if self.held.complete(manifest.id) is None:
            raise DownloadError(f"chunks of {manifest.id.hex()[:16]} were released before the download ended")


def _install(directory: Path, manifest: Manifest) -> None:
    """Make the checkpoint loadable: every chunk is there, then the manifest is written (atomically)."""
    still_missing = missing_chunks(directory, manifest)
    if still_missing:
        raise DownloadError(f"chunks {still_missing[:8]} vanished from the store before install")
    install_manifest(directory, manifest)


Sink = StoreSink | HeldSink
