"""Garbage collection during a simulation: paused, then run in full at points chosen by growth.

Why: a thousand simulated hosts keep a few million live objects (py-libp2p
connections, streams, trio tasks and cancel scopes), and CPython's
generational collector keeps walking them: on the `connectivity` scenario
its share of the CPU grew with the number of nodes, its cost faster than the
simulation's. Yet the run makes little cyclic garbage (with collection off,
peak RSS hardly grew), because almost everything is freed by reference
counting (docs/measurements.md).

So, for the duration of a run (`paused_collection`):

* one full collection first (garbage left by an earlier run in the same
  process must not be collected, or fire its weak-reference callbacks, at
  some point of this one), then the objects that exist (the imported
  libraries, hundreds of thousands of them) are frozen: no collection looks
  at them again;
* automatic collection is off;
* `collect_when_grown`, a task of the run, wakes once per virtual second
  and does one full collection when the number of tracked objects created
  (net of those freed) since the last collection exceeds half the number
  that survived it (and at least `MIN_GROWTH`): the same amortised rule
  CPython applies to its oldest generation, without the young ones. It also
  collects after `MAX_INTERVAL` virtual seconds once a tenth of that growth
  is there: a few cycles can hold large buffers (a model, a checkpoint
  chunk) that an object count does not see.
* what survives a collection is frozen too, so the next one looks only at
  what was made since (the survivors of a 1,000-node run are millions of
  long-lived objects: hosts, connections, tasks); every `FULL_EVERY`-th
  collection unfreezes everything first and looks at it all, so a cycle that
  formed among once-frozen objects (a closed connection) waits at most that
  many collections.

Determinism: collections happen at the same virtual instants and counts for
the same seed, as automatic ones happened at the same allocation counts.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import trio

CHECK_EVERY = 1.0  # virtual seconds between looks at the allocation count
MIN_GROWTH = 250_000  # tracked objects created since the last collection before one is worth it
MAX_INTERVAL = 60.0  # virtual seconds: collect at least this often while a tenth of MIN_GROWTH accrued
FULL_EVERY = 4  # every this many collections, one looks at every object (the others at the young ones)


@contextmanager
def paused_collection() -> Iterator[None]:
    """Freeze what exists and turn automatic collection off until the block ends (then restore both)."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.collect()  # start from a clean heap and a zero count: collections then fall at the same points each run
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


async def collect_when_grown(
    *,
    check_every: float = CHECK_EVERY,
    min_growth: int = MIN_GROWTH,
    max_interval: float = MAX_INTERVAL,
    full_every: int = FULL_EVERY,
) -> None:
    """Forever: a collection whenever tracked objects grew by half of what survived the last ones.

    Or, once `min_growth / 10` objects accrued, when `max_interval` virtual seconds have passed.
    Survivors are frozen; every `full_every`-th collection thaws and looks at everything.
    """
    before_run = gc.get_freeze_count()  # frozen by `paused_collection`: not the run's
    collections, survivors, last = 0, 0, trio.current_time()
    while True:
        await trio.sleep(check_every)
        grown, waited = gc.get_count()[0], trio.current_time() - last
        if grown >= max(min_growth, survivors // 2) or (grown >= min_growth // 10 and waited >= max_interval):
            collections += 1
            if collections % full_every == 0:
                gc.unfreeze()
            gc.collect()
            gc.freeze()
            survivors, last = gc.get_freeze_count() - before_run, trio.current_time()
