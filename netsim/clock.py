"""The one clock locomesh code reads: real time in the daemon, virtual time in the simulator.

Code that needs "now" calls `monotonic()` (for intervals and deadlines) or
`wall()` (for timestamps that go into messages or files), never `time.time()`
directly. Inside a trio run, `monotonic()` is `trio.current_time()`, which is
already virtual under `trio.testing.MockClock`; `wall()` is the installed
clock's epoch plus that, so a simulated run stamps its messages with
simulated dates. Outside trio both fall back to the system clock.

The simulator installs a `VirtualWallClock` for the duration of a run with
`use_clock(...)` (a context variable, so it is inherited by every task the
run spawns and never leaks into another run).

This module imports nothing from the simulator, so the node can import it; it
belongs in `locomesh.node` (or `protocol`) and lives here until it moves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import trio


class SystemClock:
    """Wall time is the operating system's."""

    def wall(self) -> float:
        return time.time()


@dataclass(frozen=True)
class VirtualWallClock:
    """Wall time is `epoch` plus the trio clock, so it advances with virtual time."""

    epoch: float

    def wall(self) -> float:
        return self.epoch + trio.current_time()


_current: ContextVar[SystemClock | VirtualWallClock] = ContextVar("locomesh_clock", default=SystemClock())


def monotonic() -> float:
    """Seconds on the run's clock (virtual under MockClock); the system's monotonic clock outside trio."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


def wall() -> float:
    """Seconds since the Unix epoch, as the installed clock sees them."""
    return _current.get().wall()


@contextmanager
def use_clock(clock: SystemClock | VirtualWallClock) -> Iterator[None]:
    """Install `clock` for the current context (and the tasks it spawns) until the block ends."""
    token = _current.set(clock)
    try:
        yield
    finally:
        _current.reset(token)
