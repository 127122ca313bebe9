"""Whom to pull a run's ops from, and when: the anti-entropy schedule of `CrdtService` (sans-IO).

Theory of operation
-------------------
GossipSub is the fast path for new ops; anti-entropy pulls (``crdt.sync``) make delivery certain.
A pull costs a stream, signed frames both ways and a walk of the DAG on the server, so pulling
from every peer every period costs the swarm N x (N - 1) pulls per period: at 32 nodes that was
most of the CPU of a simulated round, for pulls that found nothing because gossip had delivered
it all. The schedule keeps pulls proportionate to what gossip misses:

* **New peers** may hold a backlog (a newcomer catching up, or the rest of the swarm catching
  up with it): up to `fanout` of them are pulled from at once, and the others go to the front
  of the sweeps' order. A newcomer that connects to the 31 members of a run needs its backlog
  once, not 31 times (and a server that finds the asker ahead pulls back, see `CrdtService`).
* **Sweeps.** Every `interval` seconds, `fanout` connected peers are pulled from. They are drawn
  as a shuffled round-robin (a random order, used up before a new one is drawn), so every peer
  is asked within ceil(peers / fanout) sweeps and the choice is deterministic for a seeded rng.
* **Back-off.** A sweep whose pulls all brought nothing says gossip delivered everything: the
  interval doubles, up to `max_interval`. A pull that brings ops, or an op that arrives by gossip
  with parents we never saw (a gap: gossip lost something), puts it back to `base_interval` and
  makes the next sweep due at once.
* **Gaps** are also repaired directly: the service pulls from the author of such an op (who holds
  its parents) without waiting for a sweep; the schedule only learns that it is behind
  (`behind`), as it does when a run is opened (everything of it is yet to come).

Transitions (event -> effect on the schedule):

    ============================  ===============================================================
    event                         effect
    ============================  ===============================================================
    ``due(now, peers)``           return up to `fanout` new peers (the rest go first in the
                                  order), plus `fanout` drawn peers if a sweep is due (the next
                                  sweep is then due `interval` later)
    ``pulled(applied=0)``         nothing (the sweep counts as quiet unless something else says)
    ``pulled(applied>0)``         interval := base; the sweep was not quiet
    ``behind(now)``               interval := base; next sweep due now
    end of a quiet sweep          interval := min(2 x interval, max_interval)
    ============================  ===============================================================

"End of a sweep" is noticed when the next one is due: if nothing since the last sweep reset the
interval, it was quiet.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

BASE_INTERVAL = 5.0
MAX_INTERVAL = 40.0
FANOUT = 2


class AntiEntropySchedule:
    """Decides which peers to pull from at each look (see the module docstring). Pure: no I/O,
    no clock; the caller passes the time."""

    def __init__(self, rng: random.Random, *, base_interval: float = BASE_INTERVAL,
                 max_interval: float = MAX_INTERVAL, fanout: int = FANOUT) -> None:
        if base_interval <= 0 or max_interval < base_interval or fanout < 1:
            raise ValueError("need 0 < base_interval <= max_interval and fanout >= 1")
        self.rng = rng
        self.base_interval = base_interval
        self.max_interval = max_interval
        self.fanout = fanout
        self.interval = base_interval
        self._next_sweep: float | None = None  # set at the first look
        self._seen: set[str] = set()  # connected at the last look
        self._order: list[str] = []  # the rest of the current shuffled round
        self._quiet = True  # nothing since the last sweep said gossip misses ops

    def due(self, now: float, connected: Iterable[str]) -> tuple[list[str], bool]:
        """The peers to pull from now, in order, and whether a sweep is due (the caller then also
        looks for new runs to replicate)."""
        peers = sorted(connected)
        fresh = [peer for peer in peers if peer not in self._seen]
        self._seen = set(peers)
        now_fresh, later = fresh[: self.fanout], fresh[self.fanout :]
        self._order = [peer for peer in self._order if peer not in later] + later[::-1]  # popped first
        if self._next_sweep is None:
            self._next_sweep = now + self.interval
        sweep = now >= self._next_sweep
        if not sweep:
            return now_fresh, False
        if self._quiet:
            self.interval = min(2 * self.interval, self.max_interval)
        self._quiet = True
        self._next_sweep = now + self.interval
        return now_fresh + self._draw(set(peers) - set(now_fresh)), True

    def pulled(self, applied: int) -> None:
        """A pull ended having applied `applied` ops."""
        if applied > 0:
            self._reset()

    def behind(self, now: float) -> None:
        """Ops are known to be missing (a gap in gossip, a run just opened): sweep now."""
        self._reset()
        self._next_sweep = now

    def _reset(self) -> None:
        self.interval = self.base_interval
        self._quiet = False

    def _draw(self, candidates: set[str]) -> list[str]:
        """Up to `fanout` peers from the shuffled round-robin over `candidates`."""
        drawn: list[str] = []
        for _attempt in range(2):  # the rest of this round, then a fresh round if short
            self._order = [peer for peer in self._order if peer in candidates and peer not in drawn]
            if not self._order:
                self._order = sorted(candidates - set(drawn))
                self.rng.shuffle(self._order)
            while self._order and len(drawn) < self.fanout:
                drawn.append(self._order.pop())
            if len(drawn) >= self.fanout:
                break
        return drawn
