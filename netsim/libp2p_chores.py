"""py-libp2p's periodic chores, retuned for a simulation of many hosts.

Yamux (py-libp2p 0.8.1) pings every connection 0.5 s after it opens and then
every `RTT_MEASURE_INTERVAL` (30 s) to keep a smoothed round-trip estimate
for its receive-window auto-tuning. A ping and its pong are two frames, each
through Noise, the simulated link and both Yamux loops. On the
`connectivity` scenario at 100 nodes (136 virtual seconds, so about five
pings per connection) spacing them out took the run from 22.5 to 16.1 CPU
seconds (one measurement each, on a shared machine), for an estimate that the
simulated links (fixed latency plus small jitter) never change.

`libp2p_chores_retuned()` keeps the first ping of every connection (so the
window auto-tuning sees a measured RTT, as on a real network) and re-measures
every `SIMULATED_RTT_INTERVAL` instead of every 30 s. Like `libp2p_time`, it
sets a module attribute that py-libp2p reads at call time, for the duration
of a block, and restores it afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from libp2p.stream_muxer.yamux import yamux

SIMULATED_RTT_INTERVAL = 600.0  # virtual seconds between Yamux RTT pings after the first one


@contextmanager
def libp2p_chores_retuned() -> Iterator[None]:
    """Space out Yamux's RTT pings (see above) until the block ends."""
    saved = yamux.RTT_MEASURE_INTERVAL
    yamux.RTT_MEASURE_INTERVAL = SIMULATED_RTT_INTERVAL  # type: ignore[assignment]
    try:
        yield
    finally:
        yamux.RTT_MEASURE_INTERVAL = saved  # type: ignore[assignment]
