"""Upload and download rate caps: one token bucket per direction, shared by everything the node sends or receives.

The node's `ByteMeter` (`locomesh.node.meter`) holds the two buckets. Every
libp2p connection's byte stream is paced through them (`meter.PacedStream`:
streams, DHT, gossip, relayed circuits alike, since a relayed connection's
bytes travel on the relay's own connections), and so is the checkpoint data
plane's TCP socket (`transfer.dataplane.SealedStream`). So the cap is the
node's total in each direction, whatever carries the bytes.

A bucket is a generic cell rate algorithm (GCRA): it keeps the time at which
the bytes granted so far will have been paid for at `rate` (``paid_until``).
A sender reserves its bytes at once (no lock: nobody waits on anyone's turn
but their own) and sleeps until the reservation is no further ahead of the
clock than `burst` bytes' worth. Senders are served in the order they asked.
A send larger than `SLICE` is taken slice by slice by whoever sends it
(`slices`), so a 4 MiB frame leaves at the cap rather than in one burst. A
receiver waits until the bucket is not behind (`wait_ready`), reads at most a
slice, and is charged what it got (`charge`): TCP's flow control then slows
the sender to the cap.

A rate of 0 means no cap: nothing waits, the bytes are only counted (the
current rates in ``node.status`` come from that count). The clock is
injectable and defaults to trio's, so `trio.testing.MockClock` drives it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import trio

SLICE = 64 * 1024  # the most one paced send or read moves at once: a Noise message's size
BURST_SECONDS = 0.02  # a cap is exceeded by at most this much of its rate's worth (and one SLICE), at once
RATE_WINDOW = 5.0  # seconds over which the current rate in node.status is measured
RATE_BIN = 0.1  # seconds: the bytes counted for the current rate are kept in bins this long


class TokenBucket:
    """Bytes at `rate` per second (0: no cap), bursts of up to `burst` bytes (default: a `SLICE`, or
    `BURST_SECONDS`' worth if that is more). Counts every byte that passes, capped or not."""

    def __init__(self, rate: float = 0, *, burst: int | None = None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._burst_setting = burst
        self.paid_until = -math.inf
        self.total = 0  # bytes that passed, for status and metrics
        self._recent: deque[tuple[float, int]] = deque()  # (time, bytes) over the last RATE_WINDOW
        self.set_rate(rate)

    def set_rate(self, rate: float) -> None:
        """Change the cap (bytes per second, 0: none); reservations already made keep their times."""
        if rate < 0 or not math.isfinite(rate):
            raise ValueError(f"a rate is a finite number of bytes per second, not {rate!r}")
        self.rate = float(rate)
        default_burst = max(SLICE, int(self.rate * BURST_SECONDS))
        self.burst = self._burst_setting if self._burst_setting is not None else default_burst

    @property
    def capped(self) -> bool:
        return self.rate > 0

    async def take(self, size: int) -> None:
        """Wait until `size` bytes may go out now (at once: call it per slice, see `slices`). Cancelled
        while waiting, the reservation is given back where nobody reserved after it."""
        if not self.capped:
            self._count(size)
            return
        now = self._clock()
        reserved_until = max(self.paid_until, now) + size / self.rate
        self.paid_until = reserved_until
        try:
            await trio.sleep(max(0.0, reserved_until - self.burst / self.rate - now))
        except BaseException:
            if self.paid_until == reserved_until:  # nobody reserved after us: the time is ours to give back
                self.paid_until -= size / self.rate
            raise
        self._count(size)

    async def wait_ready(self) -> None:
        """Wait until the bucket is not behind: what a reader does before reading (then `charge`)."""
        if self.capped:
            await trio.sleep(max(0.0, self.paid_until - self.burst / self.rate - self._clock()))

    def charge(self, size: int) -> None:
        """`size` bytes have come in: the next reader waits for them to be paid for."""
        if self.capped:
            self.paid_until = max(self.paid_until, self._clock()) + size / self.rate
        self._count(size)

    def current_rate(self) -> float:
        """Bytes per second that passed over the last `RATE_WINDOW` seconds."""
        self._forget_old(self._clock())
        return sum(size for _, size in self._recent) / RATE_WINDOW

    def _count(self, size: int) -> None:
        now = self._clock()
        self.total += size
        start = math.floor(now / RATE_BIN) * RATE_BIN
        if self._recent and self._recent[-1][0] == start:
            self._recent[-1] = (start, self._recent[-1][1] + size)
        else:
            self._recent.append((start, size))
        self._forget_old(now)

    def _forget_old(self, now: float) -> None:
        while self._recent and self._recent[0][0] <= now - RATE_WINDOW:
            self._recent.popleft()


def slices(data: bytes | bytearray | memoryview, size: int = SLICE) -> Iterator[memoryview]:
    """`data` in pieces of at most `size` bytes, uncopied."""
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield view[start : start + size]


class Bandwidth:
    """The node's two buckets: what it sends (`upload`) and what it receives (`download`)."""

    def __init__(self, *, clock: Callable[[], float] = trio.current_time) -> None:
        self.upload = TokenBucket(clock=clock)
        self.download = TokenBucket(clock=clock)

    def status(self) -> dict[str, Any]:
        """The caps (bytes per second, 0: none) and the current rates, for ``node.status``."""
        return {
            "upload_limit": int(self.upload.rate), "download_limit": int(self.download.rate),
            "upload_rate": round(self.upload.current_rate()), "download_rate": round(self.download.current_rate()),
        }


class BandwidthLimits:
    """A node service that sets the node's caps from the config (`upload_limit`, `download_limit`)
    and shows them, with the current rates, as the ``bandwidth`` field of ``node.status``."""

    name = "bandwidth"

    def __init__(self, *, upload: int = 0, download: int = 0) -> None:
        self.upload, self.download = upload, download

    async def run(self, node: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        bandwidth: Bandwidth = node.meter.bandwidth
        bandwidth.upload.set_rate(self.upload)
        bandwidth.download.set_rate(self.download)
        node.add_status_field("bandwidth", bandwidth.status)
        task_status.started()
