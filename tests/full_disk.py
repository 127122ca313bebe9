"""A disk that fills up, without root or a tmpfs: `os.write` replaced by one that counts the bytes
written to files under one directory and, once `free` is spent, writes short and then fails with
ENOSPC, as a real full disk does. Every file write of the node goes through `os.write`
(`node.files.atomic_write`, the data dir's lock), so this is the layer where the disk says no.

    disk = FullDisk(tmp_path, free=100)
    monkeypatch.setattr(os, "write", disk.write)
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

_real_write = os.write


class FullDisk:
    def __init__(self, root: Path, free: int) -> None:
        self.root = str(Path(root).resolve())
        self.free = free
        self.written = 0  # bytes that went to files under root before the disk was full

    def write(self, fd: int, data: bytes) -> int:
        if not self._under_root(fd):
            return _real_write(fd, data)
        if self.free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done = _real_write(fd, bytes(memoryview(data)[: self.free]))
        self.free -= done
        self.written += done
        return done

    def _under_root(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(self.root + os.sep)
        except OSError:  # a pipe or socket has no path there
            return False


def files_under(root: Path) -> set[str]:
    """Every file under `root`, as paths relative to it."""
    return {str(path.relative_to(root)) for path in Path(root).rglob("*") if path.is_file()}
