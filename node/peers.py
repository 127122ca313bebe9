"""Who we are connected to, since when, in which direction, and how: direct, hole-punched or relayed.

py-libp2p tells registered notifees about every connection that opens and
closes; `PeerTracker` is such a notifee and keeps one `PeerEntry` per
connected peer. It reads the clock through `now` (wall-clock seconds for the
daemon, so `connected_since` can be shown as a date).

How a peer is connected (`PeerEntry.connection`) follows its open connections:

    open connections                      connection
    only relayed ones                     "relayed"
    a direct one that opened while a      "hole-punched" (DCUtR, or any later direct
      relayed one was open                  dial: the relayed path was upgraded)
    any other direct one                  "direct"
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from multiaddr import Multiaddr

from locomesh.node.connections import DIRECT, RELAYED, ConnectionFacts, facts_of

HOLE_PUNCHED = "hole-punched"
MAX_MET = 100_000  # peers remembered as met (the oldest are forgotten first)


@dataclass
class PeerEntry:
    peer_id: str
    direction: str  # "inbound", "outbound" or "unknown"
    connected_since: float
    remote_addrs: list[str]
    connection: str = DIRECT  # DIRECT, RELAYED or HOLE_PUNCHED (see the module docstring)


class PeerTracker(INotifee):
    """Connected peers, kept up to date from connection events."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._peers: dict[str, PeerEntry] = {}
        self.connects_total = 0
        # peer -> `connects_total` when we first connected to it. A NAT's filter may still let in a
        # peer we once talked to, so the reachability check needs to know who is a stranger.
        self._first_met: OrderedDict[str, int] = OrderedDict()
        # Called with the facts of a direct inbound connection from a peer we had never met.
        self.stranger_listeners: list[Callable[[ConnectionFacts], None]] = []

    def peers(self) -> list[PeerEntry]:
        return sorted(self._peers.values(), key=lambda entry: entry.peer_id)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def met_by(self, peer_id: str, horizon: int) -> bool:
        """Had we connected to `peer_id` by the time `connects_total` was `horizon`?"""
        first = self._first_met.get(peer_id)
        return first is not None and first <= horizon

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        facts = facts_of(conn)
        entry = self._peers.get(facts.peer_id)
        if entry is None:
            self.connects_total += 1
            if facts.peer_id not in self._first_met:
                if facts.direction == "inbound" and facts.kind == DIRECT:
                    for listener in self.stranger_listeners:
                        listener(facts)
                self._first_met[facts.peer_id] = self.connects_total
                if len(self._first_met) > MAX_MET:
                    self._first_met.popitem(last=False)
            self._peers[facts.peer_id] = PeerEntry(
                peer_id=facts.peer_id,
                direction=facts.direction,
                connected_since=self._now(),
                remote_addrs=list(facts.addrs),
                connection=facts.kind,
            )
        elif facts.kind == DIRECT and entry.connection == RELAYED:
            entry.connection, entry.remote_addrs = HOLE_PUNCHED, list(facts.addrs)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id
        still_open = [other for other in network.connections.get(peer_id, []) if other is not conn]
        entry = self._peers.get(str(peer_id))
        if entry is None:
            return
        if not still_open:
            del self._peers[str(peer_id)]
            return
        remaining = [facts_of(other) for other in still_open]
        direct = [facts for facts in remaining if facts.kind == DIRECT]
        if not direct:
            entry.connection, entry.remote_addrs = RELAYED, list(remaining[0].addrs)
        elif entry.connection == RELAYED:  # the relayed path went first: what is left is an upgrade
            entry.connection, entry.remote_addrs = HOLE_PUNCHED, list(direct[0].addrs)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

