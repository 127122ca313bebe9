"""Hole punching (DCUtR) aimed at where peers really see us, never at ourselves.

py-libp2p's `DCUtRProtocol` runs the protocol: over a relayed connection both
sides swap candidate addresses (CONNECT), measure the round trip, and the
initiator sends SYNC and waits half of it, so both sides dial each other's
candidates at the same moment, in parallel, from their listen ports (TCP
simultaneous open), in up to three rounds. What it gets wrong behind a
carrier-grade NAT is *which* addresses: it advertises "outside IP + listen
port", a guess that holds only for a NAT that kept our port. Two hosts behind
one carrier NAT on the same listen port then advertise the same address,
though the carrier had to give one of them another port: punches meant for
one reach the other, and the remapped host is never reached.

`HolePuncher` changes two things:

* **What we advertise** (`punch_candidates`): the endpoints peers observed
  our connections at (Identify's observed address; our dials leave from the
  listen port, `locomesh.node.nat.listen_port`, so with an
  endpoint-independent NAT each observation is the mapping a punch must aim
  at), the most widely observed first; then where we listen, if that is a
  public address. Never a private or shared (CGNAT) address: a peer dialling
  one would reach some host of its own network, maybe itself. No guess:
  with no observation and no public listen address we advertise nothing,
  and the peer dials nothing (the relayed connection stays).
* **Who starts**: one side of each pair (`initiates`), never both at once;
  and it drives the punches toward all its relayed peers at once (at most
  `MAX_CONCURRENT_PUNCHES`), where py-libp2p's loop awaits them one by one:
  a punch toward a symmetric NAT fails only after up to three rounds, and
  every pair queued behind it waited (netsim `nat`: p90 time to direct).
* **What we dial**: never one of our own addresses (the transport refuses
  our listen endpoints; `_dial_peer` also skips our own observed mappings,
  which a peer behind the same NAT may advertise).
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol
from multiaddr import Multiaddr

from locomesh.node.nat.addresses import is_private_ip, tcp_address, tcp_endpoint
from locomesh.node.nat.connections import RELAYED, facts_of

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 4
MAX_CONCURRENT_PUNCHES = 8
DRIVE_INTERVAL = 2.0


def punch_candidates(observed: list[tuple[str, int]], listening: list[str]) -> list[str]:
    """The addresses we advertise to a hole-punching peer, best first, at most `MAX_CANDIDATES`.

    `observed`: (address, number of distinct peers that saw us there), as
    py-libp2p's observed-address manager counts them. `listening`: our listen
    addresses. Private, shared and loopback addresses are left out (see the
    module docstring).
    """
    ranked = [address for address, _ in sorted(observed, key=lambda item: -item[1])]
    found: list[str] = []
    for address in ranked + listening:
        endpoint = tcp_endpoint(address.split("/p2p/")[0])
        if endpoint is None or is_private_ip(endpoint[0]):
            continue
        canonical = tcp_address(*endpoint)
        if canonical not in found:
            found.append(canonical)
    return found[:MAX_CANDIDATES]


def observed_mappings(host: Any) -> list[tuple[str, int]]:
    """(address, distinct observers) of every endpoint peers saw our connections at (one observer is enough).

    py-libp2p keeps these in the host's observed-address manager, whose
    public view (`host.get_addrs()`) shows only addresses 4 peers agree on;
    a hole punch usually has one or two observers (the relays), so we read
    the counts themselves. Empty if this py-libp2p has no such manager.
    """
    manager = getattr(host, "_observed_addr_manager", None)
    table = getattr(manager, "_external_addrs", None)
    if not isinstance(table, dict):
        return []
    counts: dict[str, int] = {}
    for external in table.values():
        for address, observers in external.items():
            counts[address] = max(counts.get(address, 0), len(observers))
    return sorted(counts.items())


def initiates(ours: str, theirs: str) -> bool:
    """Which side of a pair starts the hole punch: the one whose peer ID sorts first."""
    return ours < theirs


class HolePuncher(DCUtRProtocol):
    """py-libp2p's DCUtR with our candidate addresses, one session per pair, no dial to an address of ours."""

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        """Start a session only if we are the pair's initiator (`initiates`); else the peer starts one.

        py-libp2p lets both sides start sessions at once (each side's loop drives
        every relayed peer). Each side then dials in two roles at the same moment,
        from the same port to the same endpoints: the dials of one session take
        the endpoint pair the other's need (EADDRNOTAVAIL), and a SYN that lands
        on the peer's listener meets a handshake in the wrong role.
        """
        if not initiates(str(self.host.get_id()), str(peer_id)):
            return await self._have_direct_connection(peer_id)
        return await super().initiate_hole_punch(peer_id)

    async def _auto_drive_loop(self) -> None:
        """Every `DRIVE_INTERVAL` s, start a punch toward each relayed peer not yet driven, concurrently."""
        limit = trio.Semaphore(MAX_CONCURRENT_PUNCHES)
        driving: set[ID] = set()
        while True:
            await trio.sleep(DRIVE_INTERVAL)
            for peer_id in self._relayed_peers():
                if peer_id in driving or peer_id in self._direct_connections:
                    continue
                if self._hole_punch_attempts.get(peer_id, 0) >= MAX_HOLE_PUNCH_ATTEMPTS:
                    continue
                driving.add(peer_id)
                assert self._nursery is not None  # set by `run` before this loop starts
                self._nursery.start_soon(self._drive, peer_id, limit, driving)

    async def _drive(self, peer_id: ID, limit: trio.Semaphore, driving: set[ID]) -> None:
        try:
            async with limit:
                await self.initiate_hole_punch(peer_id)
        except Exception as error:  # noqa: BLE001 - a failed punch leaves the relayed connection; never the service
            logger.debug("hole punch toward %s failed: %s", peer_id, error)
        finally:
            driving.discard(peer_id)

    def _relayed_peers(self) -> list[ID]:
        """Peers we hold a relayed connection to (and may hold a direct one too)."""
        found = []
        for peer_id, connections in list(self.host.get_network().connections.items()):
            if peer_id != self.host.get_id() and any(facts_of(conn).kind == RELAYED for conn in connections):
                found.append(peer_id)
        return found

    async def _get_observed_addrs(self) -> list[bytes]:
        listening = [str(address) for address in self.host.get_transport_addrs()]
        candidates = punch_candidates(observed_mappings(self.host), listening)
        logger.debug("hole punch: advertising %s", ", ".join(candidates) or "nothing")
        return [Multiaddr(address).to_bytes() for address in candidates]

    async def _dial_peer(
        self, peer_id: ID, addr: Multiaddr, source: tuple[str, int] | None = None, as_responder: bool = False
    ) -> None:
        endpoint = tcp_endpoint(str(addr).split("/p2p/")[0])
        own = {address for address, _ in observed_mappings(self.host)}
        if endpoint is not None and tcp_address(*endpoint) in own:
            logger.debug("hole punch: %s is our own mapping; not dialling it", addr)
            return
        await super()._dial_peer(peer_id, addr, source, as_responder)
