"""When do bytes arrive? The link and capacity model, with no I/O (the pipes do the waiting).

Every byte written on a simulated connection passes, in order, through:

1. the sender's **upload capacity** (shared by all of that node's connections),
2. the **link** itself (its own bandwidth, if it has one),
3. the one-way **propagation delay** (latency, plus jitter, plus loss),
4. the receiver's **download capacity** (shared by all of its connections).

Each of 1, 2 and 4 is a FIFO server of fixed rate (`Serializer`): a chunk
starts when the server is free and it is ready, and occupies the server for
``size / rate`` seconds. That is a token bucket with a bucket of one chunk,
i.e. the node's capacity is shared first-come first-served across its
connections, which is what a modem's queue does. Reservations are made when a
chunk is *written*, in the order chunks are written; a chunk written later
never overtakes one written earlier on the same server (a small
simplification for the receiver's downlink, where real packets queue in
arrival order).

**Loss.** Connections are reliable byte streams (TCP-like), so a lost
segment is not lost data but a retransmission: each 1460-byte segment of a
chunk is lost with probability ``loss``; if any is, the chunk arrives one
retransmission timeout (``max(0.2 s, 2 RTT)``, Linux's minimum RTO and a
typical estimate) later, and again for each further loss of the
retransmission. Everything written after it waits too (head-of-line
blocking), because a stream delivers in order: arrival times never decrease.

**Jitter** adds a uniform ``[0, jitter)`` to each chunk's delay, also subject
to in-order delivery.

Back-pressure (the bounded in-flight buffer) is the pipe's job, see `pipe.py`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SEGMENT_SIZE = 1460
MIN_RTO = 0.2


@dataclass(frozen=True)
class LinkProfile:
    """One direction of a path between two nodes. Times in seconds, rates in bytes/s."""

    latency: float = 0.02
    jitter: float = 0.0
    loss: float = 0.0
    bandwidth: float | None = None
    buffer: int = 256 * 1024

    def __post_init__(self) -> None:
        if self.latency < 0 or self.jitter < 0:
            raise ValueError("latency and jitter must not be negative")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss is a probability below 1, not {self.loss!r}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError("bandwidth must be positive (None: unlimited)")
        if self.buffer < 1:
            raise ValueError("the in-flight buffer must hold at least one byte")

    def joined(self, other: LinkProfile) -> LinkProfile:
        """The path through two access links in a row (this one, then `other`)."""
        rates = [r for r in (self.bandwidth, other.bandwidth) if r is not None]
        return LinkProfile(
            latency=self.latency + other.latency,
            jitter=self.jitter + other.jitter,
            loss=1 - (1 - self.loss) * (1 - other.loss),
            bandwidth=min(rates) if rates else None,
            buffer=min(self.buffer, other.buffer),
        )


@dataclass(frozen=True)
class Capacity:
    """A node's access capacity, shared by all its connections (None: unlimited)."""

    upload: float | None = None
    download: float | None = None


class Serializer:
    """A FIFO server of `rate` bytes/s: a chunk leaves ``size / rate`` after it starts."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.free_at = 0.0

    def pass_through(self, ready_at: float, size: int) -> float:
        """When a chunk of `size` bytes, ready at `ready_at`, has been fully sent."""
        if self.rate is None:
            return ready_at
        start = max(ready_at, self.free_at)
        self.free_at = start + size / self.rate
        return self.free_at


UNLIMITED = Serializer(None)


class Direction:
    """Arrival times of chunks sent one way over one connection, in order."""

    def __init__(
        self,
        profile: LinkProfile,
        rng: random.Random,
        *,
        uplink: Serializer = UNLIMITED,
        downlink: Serializer = UNLIMITED,
    ) -> None:
        self.profile = profile
        self._rng = rng
        self._uplink = uplink
        self._link = Serializer(profile.bandwidth)
        self._downlink = downlink
        self._last_arrival = 0.0

    @property
    def retransmission_timeout(self) -> float:
        return max(MIN_RTO, 4 * self.profile.latency)

    def arrival(self, now: float, size: int) -> float:
        """When a chunk of `size` bytes written at `now` is readable at the other end."""
        sent = self._link.pass_through(self._uplink.pass_through(now, size), size)
        delay = self.profile.latency + self._rng.random() * self.profile.jitter + self._loss_delay(size)
        arrived = self._downlink.pass_through(sent + delay, size)
        self._last_arrival = max(arrived, self._last_arrival)
        return self._last_arrival

    def _loss_delay(self, size: int) -> float:
        loss = self.profile.loss
        if loss == 0:
            return 0.0
        segments = max(1, math.ceil(size / SEGMENT_SIZE))
        delay = 0.0
        chance = 1 - (1 - loss) ** segments  # any segment of the chunk lost
        while self._rng.random() < chance:
            delay += self.retransmission_timeout
            chance = loss  # the retransmitted segment is lost in turn
        return delay
