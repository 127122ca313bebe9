"""Idle request streams to providers, kept for the next download from the same peer.

Why: a checkpoint download opens up to `MAX_WINDOW` streams per provider, and a round of the run
downloads one payload per peer. On the data plane each new stream is a handshake (a libp2p
stream, two signatures, an X25519 exchange, a TCP connect): 8 daemons on one machine opened
hundreds a round, ran into the providers' cap on pending handshakes ("busy: 64 data plane
handshakes are pending") and fell back to the slower libp2p streams. A stream whose last
request was answered in full is at a frame boundary, so the next download can go on using it.

Rules: a stream goes back only after a complete answer (a cancelled or failed request resets
it instead); it is reused for at most `IDLE_SECONDS` (well under the provider's idle timeout of
60 s, `service.IDLE_TIMEOUT`); at most `PER_PEER` wait per provider. A reused
stream may still have died meanwhile (the provider restarted): the caller asks again on a fresh
one (`ProviderSession.ask`).
"""

from __future__ import annotations

from typing import Any

import trio

from locomesh.node.streams import close_quietly

IDLE_SECONDS = 20.0
PER_PEER = 4  # a download runs up to download.MAX_WINDOW (4) streams per provider


class StreamPool:
    """Idle streams by peer ID, newest last."""

    def __init__(self, *, idle_seconds: float = IDLE_SECONDS, per_peer: int = PER_PEER) -> None:
        self.idle_seconds = idle_seconds
        self.per_peer = per_peer
        self._idle: dict[str, list[tuple[float, Any]]] = {}

    def __len__(self) -> int:
        return sum(len(streams) for streams in self._idle.values())

    async def take(self, peer_id: str) -> Any | None:
        """The most recently returned stream to `peer_id` that has not idled too long, or None.
        Streams past their time are closed on the way."""
        streams = self._idle.get(peer_id, [])
        fresh_after = trio.current_time() - self.idle_seconds
        stale = [stream for returned, stream in streams if returned < fresh_after]
        streams[:] = [(returned, stream) for returned, stream in streams if returned >= fresh_after]
        chosen = streams.pop()[1] if streams else None
        if not streams:
            self._idle.pop(peer_id, None)
        await _close_all(stale)
        return chosen

    async def give(self, peer_id: str, stream: Any) -> None:
        """Keep `stream` (idle, at a frame boundary) for the next request to `peer_id`; the
        oldest beyond `per_peer` is closed."""
        streams = self._idle.setdefault(peer_id, [])
        streams.append((trio.current_time(), stream))
        surplus = streams[: max(0, len(streams) - self.per_peer)]
        del streams[: len(surplus)]
        await _close_all(stream for _, stream in surplus)

    async def aclose(self) -> None:
        """Close every idle stream (at shutdown)."""
        idle, self._idle = self._idle, {}
        await _close_all(stream for streams in idle.values() for _, stream in streams)


async def _close_all(streams) -> None:
    with trio.CancelScope(shield=True):  # bounded: close_quietly gives up after a short timeout
        for stream in streams:
            await close_quietly(stream)
