"""Circuit relay v2 and hole punching: relay for others when public, reserve relays when private.

Theory of operation
-------------------
The service runs py-libp2p's circuit relay v2 (as `CircuitRelay`, which fixes how its
circuits end) and,
unless turned off, its DCUtR hole puncher; every `CHECK_INTERVAL` seconds it
looks at the reachability verdict (`locomesh.node.nat.reachability`) and
adjusts what this node offers and uses, by this table::

    verdict / mode           offers a relay (hop)        holds reservations
    public, mode "auto"      yes                         none (dropped)
    public through a NAT     yes (mode "auto")           up to `reservations` relays
    private                  mode "on" only              up to `reservations` relays
    unknown                  mode "on" only              keeps what it has
    any, mode "off"          no                          as above

*Public through a NAT*: every address a dial-back proved is at an IP we do
not listen on (a port forward, a gateway mapping, a port-preserving NAT).
Such reachability is fragile: mappings expire, and a port-restricted NAT
also admits any peer it sent a packet to, which a dial-back cannot tell from
a stranger's, so the node keeps its relay path as a fallback.

A *private* node reserves a slot on up to `reservations` directly connected
peers that speak the hop protocol, re-reserves every `REFRESH_INTERVAL`
(well inside the relay's reservation TTL) and replaces a relay whose
connection dropped. Its relay addresses
(``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<us>``) are published in our DHT
peer record whenever they change, so others can reach us through them
(`connect`, RPC ``nat.connect``). Once a relayed connection exists, DCUtR
(on both sides) tries a simultaneous direct dial and, when it works, moves
traffic to the direct connection and closes the relayed one.

A relay is bounded by `RelayBounds`: reservations held at once, circuits at
once, and per circuit a duration and a byte budget; py-libp2p enforces them
(and refuses hop requests that come over relayed connections).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from typing import Any

import trio
from libp2p.identity.identify_push.identify_push import push_identify_to_peers
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import DialError, Node
from locomesh.node.streams import close_quietly, reset_quietly

from locomesh.node.addresses import is_relayed, tcp_endpoint
from locomesh.node.nat.circuit_relay import CircuitRelay
from locomesh.node.connections import DIRECT, RELAYED, facts_of
from locomesh.node.nat.hole_punch import HolePuncher
from locomesh.node.nat.link_keeper import MAX_KEPT, LinkKeeper
from locomesh.node.nat.reachability import PRIVATE, PUBLIC
from locomesh.node.nat.relay_plan import RelayBounds, plan_reservations

logger = logging.getLogger(__name__)

RELAY_MODES = ("auto", "on", "off")
CHECK_INTERVAL = 5.0
RESERVE_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
RELAY_DIAL_DELAY = 2.0  # direct dials get this head start over relayed ones
MAX_CONNECT_ADDRS = 4
LINK_CHECK_INTERVAL = 2.0
RELINK_TIMEOUT = 3 * CONNECT_TIMEOUT  # a DHT lookup, then the dials


class _Race:
    """The dials of one `RelayService.connect`: `over` is set at the first success, or once all failed."""

    def __init__(self, dials: int) -> None:
        self.left = dials
        self.winner = ""
        self.errors: list[str] = []
        self.over = trio.Event()
        if dials == 0:
            self.over.set()

    def finish(self, *, winner: str = "", error: str = "") -> None:
        self.left -= 1
        self.winner = self.winner or winner
        if error:
            self.errors.append(error)
        if self.winner or self.left == 0:
            self.over.set()


class RelayService:
    """Relay (hop) when public, reservations when private, DCUtR on relayed connections."""

    name = "relay"

    def __init__(
        self,
        reachability: Callable[[], str],
        *,
        mode: str = "auto",
        reservations: int = 2,
        hole_punch: bool = True,
        bounds: RelayBounds = RelayBounds(),
        discovery: Callable[[], Any] | None = None,
        extra_addrs: Callable[[], list[str]] = list,
        allow_private_addrs: bool = False,
    ) -> None:
        """`allow_private_addrs` lets hole punches go to private and loopback addresses: tests and local swarms only."""
        if mode not in RELAY_MODES:
            raise ValueError(f"relay mode {mode!r} is not one of {RELAY_MODES}")
        self._reachability = reachability
        self.mode = mode
        self.want_reservations = reservations
        self.hole_punch = hole_punch
        self.bounds = bounds
        self._discovery = discovery or (lambda: None)
        self._extra_addrs = extra_addrs  # proved addresses beside our listen ones (a gateway's port mapping)
        self.allow_private_addrs = allow_private_addrs
        self.reserved: dict[str, float] = {}  # relay peer ID -> when we last reserved (trio clock)
        self.offering = False
        self._published: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (extra addrs, relay addrs)
        self._node: Node | None = None
        self._protocol: CircuitRelay | None = None
        self._transport: CircuitV2Transport | None = None
        self._nursery: trio.Nursery | None = None  # where `connect`'s dials run
        self._asked_to_keep: list[str] = []  # peers an RPC ``nat.connect`` asked us to keep linked to
        self._wanted: list[Callable[[], Iterable[str]]] = [lambda: self._asked_to_keep]  # see `keep_linked`
        self.links = LinkKeeper()

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        limits = self.bounds.limits()
        self._protocol = CircuitRelay(node.host, limits, allow_hop=False)
        config = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits)
        self._transport = CircuitV2Transport(node.host, self._protocol, config)
        node.add_status_field("relay", self.status)
        node.rpc.register("nat.connect", self._rpc_connect)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(self._protocol))
            # py-libp2p registered its stop handler bare; an error escaping it would take the host down.
            node.host.set_stream_handler(STOP_PROTOCOL_ID, _contained(self._protocol._handle_stop_stream, node))
            if self.hole_punch:
                await stack.enter_async_context(background_trio_service(
                    HolePuncher(node.host, allow_private_addrs=self.allow_private_addrs)))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._keep_links)
                task_status.started()
                while True:
                    await self.adjust(nursery)
                    await trio.sleep(CHECK_INTERVAL)

    # --- the decision table --------------------------------------------------------------

    async def adjust(self, nursery: trio.Nursery) -> None:
        """Apply the module docstring's table once."""
        verdict = self._reachability()
        if not self.offering and (self.mode == "on" or (self.mode == "auto" and verdict == PUBLIC)):
            self._offer_hop(nursery)
        through_nat = verdict == PUBLIC and self._public_through_nat()
        if verdict == PUBLIC and not through_nat:
            self.reserved.clear()
        elif (verdict == PRIVATE or through_nat) and self.want_reservations > 0:
            await self._keep_reservations(nursery)
        await self._publish_relay_addrs()

    def _public_through_nat(self) -> bool:
        """Is every address a dial-back proved at an IP we do not listen on (see the module docstring)?"""
        listen_ips = {endpoint[0] for a in self._require_node().host.get_transport_addrs()
                      if (endpoint := tcp_endpoint(str(a).split("/p2p/")[0])) is not None}
        proven_ips = [endpoint[0] for a in self._extra_addrs() if (endpoint := tcp_endpoint(a)) is not None]
        return bool(proven_ips) and not listen_ips.intersection(proven_ips)

    def _offer_hop(self, nursery: trio.Nursery) -> None:
        node, protocol = self._require_node(), self._protocol
        assert protocol is not None
        protocol.allow_hop = True
        # py-libp2p registers the hop handler only at start (when allow_hop was
        # already set); we turn it on later, once we know we are public.
        node.host.set_stream_handler(HOP_PROTOCOL_ID, _contained(protocol._handle_hop_stream, node))
        self.offering = True
        logger.info("offering a circuit relay (%s)", self.bounds)
        # Peers learned our protocols when they met us (Identify), before the hop handler
        # existed: without a push they would never count us among their relay candidates.
        nursery.start_soon(self._announce_protocols)

    async def _announce_protocols(self) -> None:
        """Identify push to every connected peer, so each sees the protocols we speak now."""
        with trio.move_on_after(CONNECT_TIMEOUT * 3):
            await push_identify_to_peers(self._require_node().host)

    async def _keep_reservations(self, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        candidates = self.relay_candidates()
        to_reserve, to_drop = plan_reservations(self.reserved, candidates, want=self.want_reservations, now=now)
        for relay in to_drop:
            logger.info("relay %s is gone; dropping its reservation", relay)
            del self.reserved[relay]
        for relay in to_reserve:
            if await self._reserve(relay, nursery):
                self.reserved[relay] = now

    async def _reserve(self, relay: str, nursery: trio.Nursery) -> bool:
        node, transport = self._require_node(), self._transport
        assert transport is not None
        try:
            stream = await node.open_stream(relay, [HOP_PROTOCOL_ID], timeout=RESERVE_TIMEOUT)
        except DialError as error:
            logger.info("no reservation on %s: %s", relay, error)
            return False
        try:
            with trio.move_on_after(RESERVE_TIMEOUT):
                if await transport.reserve(stream, ID.from_base58(relay), nursery):
                    logger.info("reserved a relay slot on %s", relay)
                    return True
            logger.info("relay %s refused or did not answer a reservation", relay)
            return False
        finally:
            await close_quietly(stream)

    def relay_candidates(self) -> list[str]:
        """Directly connected peers that said (Identify) they relay, in a stable order."""
        node = self._require_node()
        store = node.host.get_peerstore()
        found = []
        for peer_id in sorted(self._direct_connections()):
            try:
                protocols = store.get_protocols(ID.from_base58(peer_id))
            except Exception:  # noqa: BLE001 - the peerstore raises for unknown peers
                continue
            if HOP_PROTOCOL_ID in protocols:
                found.append(peer_id)
        return found

    # --- links we keep: dialled again when they drop ----------------------------------------

    def keep_linked(self, peers: Callable[[], Iterable[str]]) -> None:
        """Keep us connected to the peers `peers()` names at each check (e.g. a run's members), for good."""
        self._wanted.append(peers)

    async def _keep_links(self) -> None:
        """Every `LINK_CHECK_INTERVAL` s, dial again the wanted peers we lost (`LinkKeeper` says who, when)."""
        node = self._require_node()
        while True:
            wanted = [peer for source in self._wanted for peer in source() if peer != node.peer_id]
            connected = {str(peer) for peer in node.host.get_connected_peers()}
            for peer in self.links.due(wanted, connected, trio.current_time()):
                self._require_nursery().start_soon(self._relink, peer)
            await trio.sleep(LINK_CHECK_INTERVAL)

    async def _relink(self, peer_id: str) -> None:
        """One dial of a lost link: at its addresses in its DHT peer record (relayed ones too; the relay
        may have come back at another address) and, if the DHT has none, those we knew, then `connect`."""
        try:
            with trio.move_on_after(RELINK_TIMEOUT):
                try:
                    addrs = await self.lookup_addrs(peer_id)
                except RpcError:
                    addrs = self._known_addrs(peer_id)
                kind = await self.connect(peer_id, addrs)
                logger.info("link to %s is back (%s)", peer_id, kind)
        except Exception as error:  # noqa: BLE001 - DialError, RpcError (no record): tried again later
            logger.debug("link to %s not back yet: %s", peer_id, error)
        finally:
            self.links.finished(peer_id, connected=peer_id in self._require_node().peers, now=trio.current_time())

    def _known_addrs(self, peer_id: str) -> list[str]:
        """The plain TCP addresses our peerstore holds for `peer_id`."""
        try:
            known = self._require_node().host.get_peerstore().addrs(ID.from_base58(peer_id))
        except Exception:  # noqa: BLE001 - the peerstore raises for a peer it holds no address of
            return []
        return [str(address) for address in known if tcp_endpoint(str(address).split("/p2p/")[0])]

    # --- addresses: ours through relays, and dialling others ------------------------------

    def relay_addrs(self) -> list[str]:
        """Our addresses through the relays we hold a reservation on (at the address we dialled each one)."""
        node = self._require_node()
        direct = self._direct_connections(outbound_only=True)
        found = []
        for relay in sorted(self.reserved):
            for address in direct.get(relay, ()):
                found.append(f"{address}/p2p/{relay}/p2p-circuit/p2p/{node.peer_id}")
        return found

    def record_addrs(self) -> tuple[list[str], list[str]]:
        """What our peer record says: (our plain addresses, our relay addresses). The plain ones are
        where we listen plus every address a dial-back proved (`extra_addrs`)."""
        node = self._require_node()
        listen = [str(address) for address in node.host.get_transport_addrs()]
        return listen + [a for a in self._extra_addrs() if a not in listen], self.relay_addrs()

    async def _publish_relay_addrs(self) -> None:
        wanted = (tuple(self._extra_addrs()), tuple(self.relay_addrs()))
        discovery = self._discovery()
        if wanted == self._published or discovery is None:
            return
        addrs, relay_addrs = self.record_addrs()
        try:
            with trio.move_on_after(CONNECT_TIMEOUT * 3):
                await discovery.publish_peer_record(addrs, relay_addrs)
                self._published = wanted
                logger.info("published our relay addresses: %s", ", ".join(relay_addrs) or "none")
        except Exception as error:  # noqa: BLE001 - DiscoveryError and DHT failures: retried next check
            logger.info("publishing our relay addresses failed: %s", error)

    async def connect(self, peer_id: str, addrs: list[str]) -> str:
        """Connect to `peer_id` at its plain TCP `addrs` and, from `RELAY_DIAL_DELAY` s on, through its relay ones.

        All dials run at once (a private address that leads nowhere must not
        hold the relayed path up); this returns as soon as one succeeds. The
        others are left to finish in the service's nursery, each within its own
        timeout, and are not cancelled: a second relayed dial cancelled in the
        middle of its upgrade could take the connection that had just won down
        with it (netsim `nat`: fewer pairs went direct when the others were
        cancelled; docs/measurements.md).
        A dial not yet started when one has won is skipped. DCUtR later upgrades a relayed
        connection where it can.
        Returns how we are connected ("direct" or "relayed"); `DialError` if nothing worked.
        """
        node = self._require_node()
        if peer_id in node.peers:
            return self.connection_kind(peer_id) or DIRECT
        direct = [a for a in addrs if not is_relayed(a) and tcp_endpoint(a.split("/p2p/")[0])][:MAX_CONNECT_ADDRS]
        relayed = [a for a in addrs if is_relayed(a)][:MAX_CONNECT_ADDRS]
        plan = [(DIRECT, address, 0.0) for address in direct]
        plan += [(RELAYED, address, RELAY_DIAL_DELAY if direct else 0.0) for address in relayed]
        race = _Race(len(plan))
        for kind, address, delay in plan:
            self._require_nursery().start_soon(self._attempt, race, peer_id, kind, address, delay)
        await race.over.wait()
        if race.winner:
            return race.winner
        raise DialError(f"no connection to {peer_id}: {'; '.join(race.errors) or 'no usable address'}")

    async def _attempt(self, race: _Race, peer_id: str, kind: str, address: str, delay: float) -> None:
        """One dial of `race`; it reports to the race whatever happens (a shutdown's cancellation too)."""
        outcome = {"error": "cancelled"}
        try:
            await trio.sleep(delay)
            if race.winner:
                outcome = {}
                return
            await (self._dial_direct(peer_id, address) if kind == DIRECT else self._dial_relayed(address))
            outcome = {"winner": kind}
        except Exception as error:  # noqa: BLE001 - DialError, or a malformed address: it must not end the service
            outcome = {"error": str(error)}
        finally:
            race.finish(**outcome)

    async def _dial_direct(self, peer_id: str, address: str) -> None:
        node = self._require_node()
        node.forget_failed_dials(peer_id)
        await node.connect(Multiaddr(address if "/p2p/" in address else f"{address}/p2p/{peer_id}"))

    async def _dial_relayed(self, address: str) -> None:
        transport = self._transport
        assert transport is not None
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                await transport.dial(Multiaddr(address))
        except Exception as error:  # noqa: BLE001 - trio.TooSlowError and py-libp2p's relay errors
            raise DialError(f"{address}: {type(error).__name__}: {error}") from None

    def connection_kind(self, peer_id: str) -> str | None:
        """"direct" if we hold a direct connection to `peer_id`, "relayed" if only relayed ones, else None."""
        kinds = {facts_of(conn).kind for conn in self._connections_to(peer_id)}
        return DIRECT if DIRECT in kinds else (RELAYED if kinds else None)

    async def _rpc_connect(self, peer_id: str, addrs: list[str] | None = None, keep: bool = False) -> dict[str, Any]:
        """RPC ``nat.connect``: connect to a peer by ID, finding its addresses in the DHT if none are given;
        with `keep`, the link is also dialled again whenever it drops, from now on."""
        if not isinstance(peer_id, str) or not peer_id:
            raise RpcError.invalid_params("peer_id must be a peer ID string")
        if not isinstance(keep, bool):
            raise RpcError.invalid_params("keep must be true or false")
        try:
            ID.from_base58(peer_id)
        except Exception:  # noqa: BLE001 - base58 / multihash errors of several types
            raise RpcError.invalid_params("peer_id is not a peer ID") from None
        if keep and peer_id not in self._asked_to_keep:
            if len(self._asked_to_keep) >= MAX_KEPT:
                raise RpcError(-32000, f"already keeping {MAX_KEPT} links")
            self._asked_to_keep.append(peer_id)
        if addrs is None:
            addrs = await self.lookup_addrs(peer_id)
        if not isinstance(addrs, list) or not all(isinstance(address, str) for address in addrs):
            raise RpcError.invalid_params("addrs must be a list of multiaddr strings")
        try:
            kind = await self.connect(peer_id, addrs)
        except DialError as error:
            raise RpcError(-32000, str(error)) from None
        return {"peer_id": peer_id, "connection": kind}

    async def lookup_addrs(self, peer_id: str) -> list[str]:
        """`peer_id`'s addresses, relayed ones included, from its signed DHT peer record; `RpcError` if none."""
        discovery = self._discovery()
        if discovery is None:
            raise RpcError(-32000, "no DHT to look the peer up in: give its addrs")
        try:
            record = await discovery.find_peer_record(peer_id)
        except Exception as error:  # noqa: BLE001 - DiscoveryError, ProtocolError
            raise RpcError(-32000, f"peer record lookup failed: {error}") from None
        if record is None:
            raise RpcError(-32004, f"no peer record for {peer_id} in the DHT")
        return list(record.body["addrs"]) + list(record.body["relay_addrs"])

    # --- what is shown -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ``relay`` status field."""
        protocol = self._protocol
        circuits = len(getattr(protocol, "_active_relays", {})) if protocol is not None else 0
        return {
            "mode": self.mode,
            "offering": self.offering,
            "active_circuits": circuits,
            "reservations": sorted(self.reserved),
            "relay_addrs": self.relay_addrs() if self._node is not None else [],
            "published_relay_addrs": list(self._published[1]),  # in our DHT peer record (the put finished)
            "hole_punching": self.hole_punch,
            "kept_links": len(self.links.links),
            "relinks_waiting": self.links.status(trio.current_time()) if self._node is not None else {},
        }

    def _connections_to(self, peer_id: str) -> list[Any]:
        network = self._require_node().host.get_network()
        return list(network.get_connections(ID.from_base58(peer_id)))

    def _direct_connections(self, *, outbound_only: bool = False) -> dict[str, list[str]]:
        """Peer -> the plain TCP addresses of our direct connections to it (an inbound one shows the peer's
        source port, not where it listens: `outbound_only` leaves those out)."""
        found: dict[str, list[str]] = {}
        for connections in list(self._require_node().host.get_network().connections.values()):
            for conn in connections:
                facts = facts_of(conn)
                if facts.kind == DIRECT and (facts.direction == "outbound" or not outbound_only):
                    addrs = [address.split("/p2p/")[0] for address in facts.addrs if tcp_endpoint(address)]
                    found.setdefault(facts.peer_id, []).extend(addrs)
        return found

    def _require_node(self) -> Node:
        assert self._node is not None, "the service is not running"
        return self._node

    def _require_nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "the service is not running"
        return self._nursery


def _contained(handler: Callable[[Any], Any], node: Node) -> Callable[[Any], Any]:
    """`handler`, but an exception it lets out resets the stream instead of taking the host down.

    Not `node.set_stream_handler`'s guard: that one closes the stream when the
    handler returns, and a relay handler may return while its circuit lives on.
    """

    async def run(stream: Any) -> None:
        try:
            await handler(stream)
        except Exception as error:  # noqa: BLE001 - the point of this wrapper
            logger.info("relay handler failed: %s: %s", type(error).__name__, error)
            node.count_protocol_error("relay")
            await reset_quietly(stream)

    return run
