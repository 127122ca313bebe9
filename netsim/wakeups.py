"""One timer for every simulated pipe: wake the readers of a pipe when its bytes arrive.

Why one timer: a thousand-node run delivers millions of chunks, and each
used to cost its reader a wake-up when the chunk was written (to find it
not there yet), then a `trio.sleep_until` of its own (a cancel scope and
a deadline) to wait for its arrival. `Wakeups` keeps one heap of
``(instant, order, parking lot)`` and one task that sleeps until the
earliest instant and then unparks every lot that is due: a reader is woken
once per chunk, at its arrival, and one timer deadline serves every pipe.

**The grid (off by default).** With ``tick > 0`` instants are rounded *up*
to a multiple of `tick`, so that arrivals within one tick wake in one
scheduler pass instead of one pass each (rounding up keeps ``a <= b``; it is
done in integer ticks, so an instant on the grid stays where it is). On
`connectivity` at 200 nodes a 1 ms grid saved some CPU (docs/measurements.md), but the
same seed then stopped giving the same report (the 50-node determinism test
differed in a latency percentile, with or without the shared timer): some
order that depends on object addresses (trio breaks ties between equal
deadlines by address; py-libp2p keeps sets of connections and streams)
matters once many events share an instant. The cause was not pinned down,
so simulations run with ``tick = 0``: exact instants, reproducible runs.

**Determinism.** Due lots are unparked in (instant, registration order),
both fixed by the run; trio's deterministic scheduler then orders the
woken tasks by their creation.

The timer task is a trio *system* task, spawned the first time a wake-up
is registered in a trio run (a `Network` is built before the run starts),
and cancelled with the run.
"""

from __future__ import annotations

import heapq
import math
from itertools import count

import trio

DEFAULT_TICK = 0.0  # virtual seconds; 0: wake at the exact instants (see "The grid")

_TICK_SLACK = 1e-6  # of a tick: float noise, so 0.003 s stays 3 ticks, not 4


class Wakeups:
    """A shared timer: `wake_at(instant, lot)` unparks `lot` once the clock reaches `instant`."""

    def __init__(self, tick: float = DEFAULT_TICK) -> None:
        if tick < 0:
            raise ValueError("the tick must not be negative")
        self.tick = tick
        self._heap: list[tuple[float, int, trio.lowlevel.ParkingLot]] = []
        self._order = count()
        self._scope: trio.CancelScope | None = None
        self._idle = trio.lowlevel.ParkingLot()
        self._run_token: object = None

    def round_up(self, instant: float) -> float:
        """`instant` moved up to the grid (unchanged when the tick is 0)."""
        if self.tick == 0:
            return instant
        return math.ceil(instant / self.tick - _TICK_SLACK) * self.tick

    def wake_at(self, instant: float, lot: trio.lowlevel.ParkingLot) -> None:
        """Unpark every task parked in `lot` at `instant` (a grid instant; at once if it has passed)."""
        self._ensure_running()
        heapq.heappush(self._heap, (instant, next(self._order), lot))
        if self._scope is not None and instant < self._scope.deadline:
            self._scope.deadline = instant
        self._idle.unpark_all()

    def _ensure_running(self) -> None:
        token = trio.lowlevel.current_trio_token()
        if token is not self._run_token:  # first use in this trio run
            self._run_token = token
            self._heap.clear()  # wake-ups left by an earlier run belong to tasks that are gone
            self._scope = None
            self._idle = trio.lowlevel.ParkingLot()
            trio.lowlevel.spawn_system_task(self._run, name="netsim-wakeups")

    async def _run(self) -> None:
        while True:
            if not self._heap:
                await self._idle.park()
                continue
            with trio.CancelScope(deadline=self._heap[0][0]) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                heapq.heappop(self._heap)[2].unpark_all()
