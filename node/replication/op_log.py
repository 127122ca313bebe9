"""The ops a node applied in one run, kept on disk so that a restart resumes where it stopped.

    <data dir>/crdt/<run id>.ops

An append-only file of records, each a 4-byte big-endian length and that many bytes of one op as
it travels (sealed: crdt/ops.py). Records are appended in the order the replica applied the ops,
parents first, so reading them back applies each at once.

Why it exists: an op's `seq` is its place in its author's chain, so a node that forgot its own ops
would sign new ones at places it already used: a fork, which the run punishes with a ban. The
node's own ops are therefore synced to disk (`sync`, fsync) before they are published; the
others' ops are written as they come and synced with the next own op or by `sync` on a timer:
losing a few of them in a crash costs a re-fetch from peers, never a ban.

Reading (`load`) stops at the first record that is cut short or whose length is out of bounds:
the tail a crash in the middle of a write leaves. The file is cut back to the last whole record,
so what is appended next is read back too. Every record read is handed to the replica, which
checks it as it checks anything from the network; what fails is dropped by the caller. The file
holds what the replica applied, so the replica's own limits (crdt/limits.py) bound it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO, Iterator

import trio

from locomesh.crdt import Replica
from locomesh.crdt.ops import MAX_OP_WIRE
from locomesh.protocol import ProtocolError
from locomesh.node.files import fsync_dir
from locomesh.protocol.runs import format_run_id

logger = logging.getLogger(__name__)

FOLDER = "crdt"
SUFFIX = ".ops"
LOAD_YIELD = 1000  # ops loaded between checkpoints of the trio loop
_LENGTH = 4


async def load_into(replica: Replica, log: OpLog) -> OpLog:
    """Apply what `log` holds to `replica`, then have the replica append every op it applies to it.
    A stored op that fails its checks (a damaged file) is dropped and counted in a warning; the
    rest of the file still loads. Returns `log`, open for appending."""
    loaded = failed = 0
    for data in log.load():
        try:
            replica.add(data)
            loaded += 1
        except ProtocolError as error:
            failed += 1
            logger.debug("%s: a stored op fails: %s", log.path, error)
        if (loaded + failed) % LOAD_YIELD == 0:
            await trio.sleep(0)
    if failed:
        logger.warning("%s: %d stored ops failed their checks and were dropped", log.path, failed)
    if loaded:
        logger.info("%s: %d ops loaded, %d applied", log.path, loaded, len(replica))
    replica.sinks.append(log.append)
    return log


class OpLog:
    """One run's op file: `load` what is there, then `append` and `sync`. Not thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._unsynced = False

    @classmethod
    def for_run(cls, data_dir: str | os.PathLike, run_id: bytes) -> OpLog:
        return cls(Path(data_dir) / FOLDER / (format_run_id(run_id) + SUFFIX))

    def load(self) -> Iterator[bytes]:
        """The ops stored, oldest first; then the file is open for appending. A torn tail is cut off."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        created = not self.path.exists()
        self._file = open(self.path, "a+b")  # kept open for appends until `close`
        if created:
            os.chmod(self.path, 0o600)
            fsync_dir(self.path.parent)  # the file itself must survive a crash, not only its bytes
        self._file.seek(0)
        good = 0
        for data, end in _records(self._file):
            yield data
            good = end
        size = self._file.seek(0, os.SEEK_END)
        if size != good:
            logger.warning("%s: %d bytes after the last whole op (a write cut short): dropped", self.path, size - good)
            self._file.truncate(good)
            os.fsync(self._file.fileno())

    def append(self, data: bytes) -> None:
        """Add one op (buffered: `sync` makes it durable)."""
        assert self._file is not None, "load() first"
        self._file.write(len(data).to_bytes(_LENGTH, "big") + data)
        self._unsynced = True

    def sync(self) -> None:
        """Make everything appended so far durable (flush and fsync)."""
        if self._file is not None and self._unsynced:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._unsynced = False

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None


def stored_ops(data_dir: str | os.PathLike, run_id: bytes) -> Iterator[bytes]:
    """The ops of run `run_id`'s op file in `data_dir`, oldest first (none if there is no file),
    read only: nothing is cut, created or synced, so a reader may run beside the daemon that
    appends to it (a record it is still writing is not whole yet and ends the read, as a torn
    tail does for `OpLog.load`)."""
    try:
        file = open(OpLog.for_run(data_dir, run_id).path, "rb")  # closed below
    except FileNotFoundError:
        return
    with file:
        for data, _end in _records(file):
            yield data


def _records(file: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """(op bytes, offset after it) for each whole record from the current position."""
    offset = file.tell()
    while True:
        header = file.read(_LENGTH)
        if len(header) < _LENGTH:
            return
        length = int.from_bytes(header, "big")
        if not 0 < length <= MAX_OP_WIRE:
            return
        data = file.read(length)
        if len(data) < length:
            return
        offset += _LENGTH + length
        yield data, offset

