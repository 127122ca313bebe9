"""Staying connected to the bootstrap peers: dial, and on failure retry with capped, jittered backoff.

One task per bootstrap address (`keep_connected`). It dials with a timeout;
while the peer stays connected it only checks every `CHECK_INTERVAL` seconds;
when a dial fails, or returns without the peer showing as connected, it waits
`Backoff.next_delay()` before the next dial. Delays double from `base` up to `cap`, and each is
drawn uniformly from [delay/2, delay] ("equal jitter") so that many nodes
restarted together do not dial in lockstep. The random source is passed in:
the daemon uses the OS's, tests and the simulator a seeded one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)

CHECK_INTERVAL = 5.0


@dataclass
class Backoff:
    """Exponential backoff with jitter (pure: no clock, no I/O)."""

    base: float = 0.5
    cap: float = 60.0
    rng: random.Random = field(default_factory=random.SystemRandom)
    failures: int = 0

    def next_delay(self) -> float:
        """The wait before the next attempt, after one more failure."""
        ceiling = min(self.cap, self.base * 2.0 ** min(self.failures, 62))
        self.failures += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


async def keep_connected(
    address: Multiaddr,
    *,
    dial: Callable[[Multiaddr], Awaitable[None]],
    is_connected: Callable[[], bool],
    backoff: Backoff,
    dial_timeout: float,
) -> None:
    """Keep one bootstrap peer connected, forever (until cancelled).

    `dial(address)` connects or raises; `is_connected()` says whether the
    peer is connected now.
    """
    last_cause = ""
    while True:
        if is_connected():
            backoff.reset()
            await trio.sleep(CHECK_INTERVAL)
            continue
        try:
            with trio.fail_after(dial_timeout):
                await dial(address)
        except Exception as error:  # noqa: BLE001 - any dial failure means: try again later
            delay = backoff.next_delay()
            cause = _describe(error)
            # A new cause is worth a warning; the same one again, retry after retry, only an info line.
            level = logging.WARNING if cause != last_cause else logging.INFO
            logger.log(level, "bootstrap dial to %s failed (%s); retrying in %.1f s", address, cause, delay)
            last_cause = cause
            await trio.sleep(delay)
            continue
        last_cause = ""
        if is_connected():
            logger.info("connected to bootstrap peer %s", address)
            backoff.reset()
            continue
        # The dial returned, yet the peer does not show as connected (py-libp2p can hand back a
        # connection that is closing). Without a pause this loop dialled back to back and held a
        # daemon's event loop at 100% CPU, its RPC unanswered, for good (seen with 8 daemons).
        delay = backoff.next_delay()
        logger.info("bootstrap peer %s dialled but not connected; retrying in %.1f s", address, delay)
        await trio.sleep(delay)


def _describe(error: BaseException) -> str:
    """What went wrong, in words a person can act on."""
    if isinstance(error, trio.TooSlowError):
        return "timed out"
    seen: BaseException | None = error
    while seen is not None:
        # py-libp2p's Noise handshake: the key the node at the address proved is not the one the
        # /p2p/ part of the bootstrap address names (a wrong or outdated peer ID).
        if type(seen).__name__ == "PeerIDMismatchesPubkey":
            actual = str(seen).rsplit("remote_peer_id_from_pubkey=", 1)[-1].strip()
            return f"peer ID mismatch: the node at this address is {actual[:60]}; fix the /p2p/ part of the address"
        seen = seen.__cause__ or seen.__context__
    return f"{type(error).__name__}: {error}"[:200]
