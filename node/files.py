"""Atomic file writes: a reader sees the old file or the new one, never half of either.

A write goes to a temporary file beside its target (``.<name>.<random>.tmp``) that is renamed over
it. A process killed in between leaves that temporary behind; `remove_stray_temporaries` clears
them from a directory tree nobody is writing to (the daemon's data dir, once it holds the lock).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"


def atomic_write(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temporary file, fsync, and rename.

    The file is created with `mode` before any byte is written, so a secret is
    never readable by others, not even for an instant.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX)
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    """`os.write` until all of `data` is written. Plain `os.write`, not a file object's buffered
    write, so a failing disk can be faked in tests by replacing `os.write`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the names in `directory` durable (a file created or renamed there survives a crash)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stray_temporaries(root: str | os.PathLike, older_than: float) -> int:
    """Delete the temporaries `atomic_write` left under `root` (at any depth, symlinks not
    followed) whose last change is before `older_than` (a Unix time); how many were deleted."""
    removed = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
                removed += _remove_if_older(Path(directory) / name, older_than)
    return removed


def _remove_if_older(path: Path, older_than: float) -> int:
    try:
        if path.lstat().st_mtime >= older_than:
            return 0
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0


class Marks:
    """Small files that outlive a restart, one per name in `directory` (``<name><suffix>``): what a
    node remembers about a run, such as "paused" or "left after round N". Written atomically and
    privately; read bounded (a mark holds a few bytes)."""

    MAX_BYTES = 64

    def __init__(self, directory: str | os.PathLike, suffix: str = "") -> None:
        self.directory = Path(directory)
        self.suffix = suffix

    def put(self, name: str, data: bytes = b"") -> None:
        atomic_write(self._path(name), data, mode=0o600)

    def get(self, name: str) -> bytes | None:
        """The mark's bytes (at most MAX_BYTES), or None if there is none; `OSError` if unreadable."""
        try:
            with open(self._path(name), "rb") as file:
                return file.read(self.MAX_BYTES)
        except FileNotFoundError:
            return None

    def remove(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)

    def _path(self, name: str) -> Path:
        return self.directory / (name + self.suffix)
