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

`HolePuncher` changes these things:

* **What we advertise** (`punch_candidates`): the endpoints peers observed
  our connections at (Identify's observed address; our dials leave from the
  listen port, `locomesh.node.listen_port`, so with an
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
* **How long a try takes**: a session is a plain direct dial to what we
  know of the peer (`_try_unilateral_upgrade`, given `DIRECT_DIAL_TIMEOUT`:
  a dial that will answer does so within a few round trips, while one whose
  SYNs a NAT drops would hold the session for py-libp2p's whole dial
  timeout), then one round of punch dials (py-libp2p runs three per
  session). A round that fails seldom fails from timing: the usual cause is
  a symmetric NAT on our side, whose punch SYN reaches the peer's listener
  instead of its dial, so the connection comes up with both ends in the
  server role and the handshake fails; rounds two and three fail the same
  way. That same round opened the peer's NAT filter to us, though, so the
  plain dial that starts the next session (`DRIVE_INTERVAL` later) gets
  through. Each pair gets `MAX_HOLE_PUNCH_ATTEMPTS` sessions.
* **What we dial**: a relayed peer names the addresses we dial (CONNECT,
  Identify), and may be hostile. A session dials only `punch_targets`: plain
  TCP, public unicast (never our host or LAN: no peer can make us probe
  ports there), never one of our own addresses (the transport refuses our
  listen endpoints; our observed mappings, which a peer behind the same NAT
  may advertise, are left out too), at most `MAX_CANDIDATES` from its
  CONNECT and `MAX_PUNCH_ADDRS` in all; `_dial_peer` dials nothing else.
  What a CONNECT names is filtered before py-libp2p stores it.
* **How many at once**: one session per peer (a second CONNECT while one
  runs is refused: py-libp2p would run both) and at most
  `MAX_PUNCH_SESSIONS` in all, ours and theirs.

``allow_private_addrs`` (tests, local swarms on loopback or one LAN) lets
punches go to private addresses too (`locomesh.node.addresses`).
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol, _local_tcp_listen_addrs
from multiaddr import Multiaddr

from locomesh.node.addresses import is_private_ip, is_relayed, punch_targets, tcp_address, tcp_endpoint
from locomesh.node.connections import RELAYED, facts_of
from locomesh.node.streams import reset_quietly

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 4  # addresses we advertise, and take from a peer's CONNECT
MAX_PUNCH_ADDRS = 6  # addresses one session dials: the CONNECT's, then what we knew of the peer
MAX_CONCURRENT_PUNCHES = 8  # sessions we start at once
MAX_PUNCH_SESSIONS = 16  # sessions at once, ours and the peers'
DRIVE_INTERVAL = 2.0
DIRECT_DIAL_TIMEOUT = 3.0  # a plain dial to an address that answers is done within a few round trips
PUNCH_ROUND_TIMEOUT = 5.0
PUNCH_POLL = 0.2


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
    """py-libp2p's DCUtR with our candidate addresses, one session per pair, dials only to `punch_targets`."""

    def __init__(self, host: Any, *, allow_private_addrs: bool = False, **options: Any) -> None:
        """`allow_private_addrs` lets punches go to private and loopback addresses: tests and local swarms only."""
        super().__init__(host, **options)
        self.allow_private_addrs = allow_private_addrs
        self._responding: set[ID] = set()  # peers whose session we answer now

    async def _handle_dcutr_stream(self, stream: Any) -> None:
        """Answer a peer's session unless one with it runs already or `MAX_PUNCH_SESSIONS` do (then reset)."""
        peer_id = stream.muxed_conn.peer_id
        running = self._in_progress | self._responding
        if peer_id in running or len(running) >= MAX_PUNCH_SESSIONS:
            logger.debug("hole punch: refusing a session from %s (%d running)", peer_id, len(running))
            await reset_quietly(stream)
            return
        self._responding.add(peer_id)
        try:
            await super()._handle_dcutr_stream(stream)
        finally:
            self._responding.discard(peer_id)

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

    def _decode_observed_addrs(self, addr_bytes: list[bytes]) -> list[Multiaddr]:
        """The `punch_targets` of a peer's CONNECT (at most `MAX_CANDIDATES`); py-libp2p stores and dials these."""
        named = [str(address) for address in super()._decode_observed_addrs(addr_bytes)]
        return [Multiaddr(address) for address in self._targets(named, MAX_CANDIDATES)]

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        """Dial the peer's known `punch_targets` at once for `DIRECT_DIAL_TIMEOUT` s; True if a direct connection is up.

        Every session starts with it, and it is what succeeds after a punch
        that failed: the peer's punch dials opened its NAT's filter to us.
        """
        targets = self._targets(self._known_addrs(peer_id), MAX_PUNCH_ADDRS)
        if not targets:
            return False
        with trio.move_on_after(DIRECT_DIAL_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for address in targets:
                    nursery.start_soon(self._dial_peer, peer_id, Multiaddr(address))
        return await self._verify_direct_connection(peer_id)

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr], as_responder: bool = False) -> bool:
        """One round of dials from our listen port to the `punch_targets` of `addrs` and of what we knew of the peer.

        True once a direct connection is up (the relayed one is then closed
        after py-libp2p's grace period). Dials still out after
        `PUNCH_ROUND_TIMEOUT` s are cancelled.
        """
        targets = self._targets([str(address) for address in addrs] + self._known_addrs(peer_id), MAX_PUNCH_ADDRS)
        if not targets:
            return False
        source = next(((ip, port) for _, ip, port in _local_tcp_listen_addrs(self.host)), None)
        async with trio.open_nursery() as nursery:
            for address in targets:
                nursery.start_soon(self._dial_peer, peer_id, Multiaddr(address), source, as_responder)
            with trio.move_on_after(PUNCH_ROUND_TIMEOUT):
                while not await self._verify_direct_connection(peer_id):
                    await trio.sleep(PUNCH_POLL)
            nursery.cancel_scope.cancel()
        if not await self._verify_direct_connection(peer_id):
            return False
        self._schedule_relay_close(peer_id)
        return True

    async def _dial_peer(
        self, peer_id: ID, addr: Multiaddr, source: tuple[str, int] | None = None, as_responder: bool = False
    ) -> None:
        """Dial `addr` only if `punch_targets` allows it (every dial of a session is picked there already)."""
        if not self._targets([str(addr)], 1):
            logger.debug("hole punch: not dialling %s at %s", peer_id, addr)
            return
        await super()._dial_peer(peer_id, addr, source, as_responder)

    def _targets(self, addrs: list[str], limit: int) -> list[str]:
        own = frozenset(tcp_address(*endpoint) for address, _ in observed_mappings(self.host)
                        if (endpoint := tcp_endpoint(address.split("/p2p/")[0])) is not None)
        return punch_targets(addrs, limit=limit, own=own, allow_private_addrs=self.allow_private_addrs)

    def _known_addrs(self, peer_id: ID) -> list[str]:
        """The peer's direct addresses in our peerstore (Identify, its peer record, an earlier CONNECT)."""
        try:
            known = self.host.get_peerstore().addrs(peer_id)
        except Exception:  # noqa: BLE001 - py-libp2p raises when it knows no address of the peer
            return []
        return [str(address) for address in known if not is_relayed(str(address))]
