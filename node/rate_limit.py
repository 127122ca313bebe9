"""A token bucket per key (a peer ID), in memory bounded however many keys come and go."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """A token bucket per key (a peer ID): `burst` tokens at once, then one every `interval` seconds.

    At most `max_keys` keys are remembered (the least recently used go first),
    so a flood of new peer IDs costs bounded memory; a forgotten key starts
    with a full bucket again, which the per-connection limits of libp2p bound.
    """

    def __init__(self, now: Callable[[], float], *, burst: float, interval: float, max_keys: int = 4096) -> None:
        if burst < 1 or interval <= 0:
            raise ValueError("burst must be >= 1 and interval > 0")
        self._now = now
        self._burst = float(burst)
        self._interval = interval
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def allow(self, key: str, cost: float = 1.0) -> bool:
        """Take `cost` tokens for `key`; False (and nothing taken) if it has fewer left."""
        now = self._now()
        tokens, at = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) / self._interval)
        allowed = tokens >= cost
        self._buckets[key] = (tokens - cost if allowed else tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return allowed
