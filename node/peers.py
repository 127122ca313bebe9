"""Who we are connected to, since when, and in which direction.

py-libp2p tells registered notifees about every connection that opens and
closes; `PeerTracker` is such a notifee and keeps one `PeerEntry` per
connected peer. It reads the clock through `now` (wall-clock seconds for the
daemon, so `connected_since` can be shown as a date).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from multiaddr import Multiaddr


@dataclass
class PeerEntry:
    peer_id: str
    direction: str  # "inbound", "outbound" or "unknown"
    connected_since: float
    remote_addrs: list[str]


class PeerTracker(INotifee):
    """Connected peers, kept up to date from connection events."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._peers: dict[str, PeerEntry] = {}
        self.connects_total = 0

    def peers(self) -> list[PeerEntry]:
        return sorted(self._peers.values(), key=lambda entry: entry.peer_id)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = str(conn.muxed_conn.peer_id)
        if peer_id in self._peers:
            return
        self.connects_total += 1
        self._peers[peer_id] = PeerEntry(
            peer_id=peer_id,
            direction=_direction(conn),
            connected_since=self._now(),
            remote_addrs=[str(addr) for addr in _transport_addrs(conn)],
        )

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id
        still_open = [other for other in network.connections.get(peer_id, []) if other is not conn]
        if not still_open:
            self._peers.pop(str(peer_id), None)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass


def _direction(conn: INetConn) -> str:
    # py-libp2p's Direction enum: UNKNOWN = -1, INBOUND = 0, OUTBOUND = 1.
    name = getattr(getattr(conn, "direction", None), "name", "").lower()
    return name if name in ("inbound", "outbound") else "unknown"


def _transport_addrs(conn: INetConn) -> list[Multiaddr]:
    try:
        return list(conn.get_transport_addresses())
    except Exception:  # noqa: BLE001 - addresses are informative only
        return []
