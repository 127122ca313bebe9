"""Make py-libp2p read virtual time during a simulation.

py-libp2p 0.8.1 reads the wall clock in about sixty modules (`import time`,
then `time.time()` / `time.monotonic()`): the swarm's failed-dial cache and
auto-connect debounce, connection health, peer-record TTLs, GossipSub's spam
protection and caches. Under trio's MockClock those would run on real
seconds while everything else runs on virtual ones: a failed-dial block of
"60 s" would last a minute of *wall* time, i.e. different virtual spans on a
fast and on a slow machine, and the same seed would stop giving the same run.

`libp2p_on_virtual_time()` swaps, for the duration of a block, the `time`
attribute of every loaded ``libp2p.*`` module that holds the `time` module for
a `_VirtualTime` proxy: its clock functions return the trio clock (plus a
fixed epoch for `time()`), everything else (`sleep`, `strftime`, ...) is the
real module's. Outside a trio run the proxy answers with the real clock, so
a library call made before or after the run still works. The swap is undone
on exit. Modules imported *during* the block would not be patched, so the
ones py-libp2p imports lazily (found by listing `sys.modules` after a run)
are imported first (`_LAZY_MODULES`).

A few modules read the date through ``datetime.now()`` instead (Kademlia
stamps each stored record with it, then compares the stamp with
``time.time()`` and drops records "older" than 36 h: real date against
virtual date, every stored value was dropped the first time it was asked
for). Modules holding the `datetime` class get `_VirtualDatetime`, whose
``now()`` follows the same proxy.
"""

from __future__ import annotations

import importlib
import sys
import time as _real_time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from datetime import datetime as _real_datetime

import trio


# Imported by py-libp2p inside functions, on the first connection; they read the clock.
_LAZY_MODULES = ("libp2p.network.connection.swarm_connection",)


class _VirtualTime:
    """Looks like the `time` module; its clocks follow the trio clock."""

    def __init__(self, epoch: float) -> None:
        self._epoch = epoch

    def _now(self) -> float | None:
        try:
            return trio.current_time()
        except RuntimeError:
            return None

    def time(self) -> float:
        now = self._now()
        return _real_time.time() if now is None else self._epoch + now

    def time_ns(self) -> int:
        return int(self.time() * 1e9)

    def monotonic(self) -> float:
        now = self._now()
        return _real_time.monotonic() if now is None else now

    def monotonic_ns(self) -> int:
        return int(self.monotonic() * 1e9)

    perf_counter = monotonic
    perf_counter_ns = monotonic_ns

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


def _virtual_datetime(proxy: _VirtualTime) -> type[_real_datetime]:
    """A `datetime` class whose ``now()`` (and ``utcnow()``) read `proxy`."""

    class _VirtualDatetime(_real_datetime):
        @classmethod
        def now(cls, tz=None):  # as datetime.now
            return _real_datetime.fromtimestamp(proxy.time(), tz)

        @classmethod
        def utcnow(cls):  # as datetime.utcnow
            return _real_datetime.utcfromtimestamp(proxy.time())

    return _VirtualDatetime


@contextmanager
def libp2p_on_virtual_time(epoch: float) -> Iterator[int]:
    """Patch loaded libp2p modules to read the trio clock; yields how many were patched."""
    for name in ("libp2p", *_LAZY_MODULES):
        importlib.import_module(name)  # loaded before patching, so that they get patched

    proxy = _VirtualTime(epoch)
    patched = [
        module
        for name, module in list(sys.modules.items())
        if (name == "libp2p" or name.startswith("libp2p.")) and getattr(module, "time", None) is _real_time
    ]
    dated = [
        module
        for name, module in list(sys.modules.items())
        if (name == "libp2p" or name.startswith("libp2p.")) and getattr(module, "datetime", None) is _real_datetime
    ]
    for module in patched:
        module.time = proxy  # type: ignore[attr-defined]
    for module in dated:
        module.datetime = _virtual_datetime(proxy)  # type: ignore[attr-defined]
    try:
        yield len(patched)
    finally:
        for module in patched:
            module.time = _real_time  # type: ignore[attr-defined]
        for module in dated:
            module.datetime = _real_datetime  # type: ignore[attr-defined]
