"""Handing freed memory back to the system once a round's big temporaries are gone.

A round allocates and frees tens of buffers of megabytes (payload bodies, decoded rows, the
pseudo-gradient, chunk frames), many in worker threads. glibc's malloc serves allocations below
its mmap threshold (which grows to 32 MiB as large blocks are freed) from per-thread arenas and
keeps what is freed there for reuse, so a daemon's resident memory ratchets up round after
round by what its threads once held at the same time. `malloc_trim(0)` returns the free pages
of every arena to the system (docs/measurements.md). Elsewhere (another libc, another OS)
this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> None:
    """Return the free pages of the C heap to the system, where the C library can (glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
