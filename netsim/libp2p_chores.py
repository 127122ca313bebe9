"""py-libp2p's Yamux chores, retuned for a simulation of many hosts.

Two things Yamux (py-libp2p 0.8.1) does on every connection cost a
simulation far more than they tell it; `libp2p_chores_retuned()` changes
both for the duration of a block and restores them afterwards. Neither
changes what our node code sees: no locomesh module reads Yamux's RTT
estimate or its window-update counters, and stream contents, ordering and
back-pressure stay as they were.

**RTT pings.** Yamux pings every connection 0.5 s after it opens and then
every `RTT_MEASURE_INTERVAL` (30 s) to keep a smoothed round-trip estimate
for its receive-window auto-tuning. A ping and its pong are two frames, each
through Noise, the simulated link and both Yamux loops. Spacing them out
cut a large share of the `connectivity` scenario's CPU time (docs/measurements.md),
for an estimate that the simulated links (fixed latency
plus small jitter) never change. The first ping stays (the window
auto-tuning sees a measured RTT, as on a real network); later ones come
every `SIMULATED_RTT_INTERVAL`.

**Window updates.** py-libp2p sends a WINDOW_UPDATE frame after nearly every
read (its "partial slack" rule: any credit below the half-window threshold
is returned at once), so every small message costs a second frame back,
through Noise and both Yamux loops. go-yamux returns credit only once half
the receive window has been consumed. In a simulation `_batched_credit`
applies go-yamux's rule: reads add to the stream's pending credit, and
py-libp2p's own update logic runs (and sends the frame, with its
auto-tuning) once the pending credit reaches its threshold
(`YamuxStream._grow_threshold()`, half the target window). The sender still
has the other half of its window, so no stream stalls. More than half of
all Yamux frames had been window updates (`connectivity`'s CPU time before
and after: docs/measurements.md).

**Thin waists.** Identify hands every observed address to py-libp2p's
`ObservedAddrManager`, which splits it and each of our listen addresses into
IP + transport and the rest (`extract_thin_waist`) several times over,
parsing multiaddrs each time, a visible share of `connectivity`'s CPU at
500 nodes (docs/measurements.md). The split is a pure function of the
address, so in a simulation it is memoised (`_memoised_thin_waist`);
results are the same immutable values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from libp2p.host import observed_addr_manager
from libp2p.stream_muxer.yamux import yamux

SIMULATED_RTT_INTERVAL = 600.0  # virtual seconds between Yamux RTT pings after the first one

_send_credit_now = yamux.YamuxStream._auto_tune_and_send_window_update


async def _batched_credit(self: yamux.YamuxStream, *, bytes_read: int = 0) -> None:
    """go-yamux's rule: give credit back only once half the receive window has been read."""
    if self._pending_recv_release + bytes_read < self._grow_threshold():
        self._pending_recv_release += bytes_read  # no await before this: nothing interleaves
        return
    await _send_credit_now(self, bytes_read=bytes_read)


_split_thin_waist = observed_addr_manager.extract_thin_waist
_THIN_WAISTS: dict[bytes, object] = {}
_THIN_WAIST_CACHE_SIZE = 1 << 16


def _memoised_thin_waist(maddr):  # as py-libp2p's extract_thin_waist
    key = maddr.to_bytes()
    try:
        return _THIN_WAISTS[key]
    except KeyError:
        if len(_THIN_WAISTS) >= _THIN_WAIST_CACHE_SIZE:
            _THIN_WAISTS.clear()
        result = _THIN_WAISTS[key] = _split_thin_waist(maddr)
        return result


@contextmanager
def libp2p_chores_retuned() -> Iterator[None]:
    """Space out Yamux's RTT pings, batch its window updates and memoise thin-waist splits (see
    above) until the block ends."""
    saved_interval = yamux.RTT_MEASURE_INTERVAL
    saved_credit = yamux.YamuxStream._auto_tune_and_send_window_update
    yamux.RTT_MEASURE_INTERVAL = SIMULATED_RTT_INTERVAL  # type: ignore[assignment]
    yamux.YamuxStream._auto_tune_and_send_window_update = _batched_credit  # type: ignore[method-assign]
    observed_addr_manager.extract_thin_waist = _memoised_thin_waist  # type: ignore[assignment]
    try:
        yield
    finally:
        yamux.RTT_MEASURE_INTERVAL = saved_interval  # type: ignore[assignment]
        yamux.YamuxStream._auto_tune_and_send_window_update = saved_credit  # type: ignore[method-assign]
        observed_addr_manager.extract_thin_waist = _split_thin_waist  # type: ignore[assignment]
        _THIN_WAISTS.clear()
