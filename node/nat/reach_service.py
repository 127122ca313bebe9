"""`/locomesh/reach/1`: the dial-back reachability check on the wire, in all three roles.

Every node plays all three roles of `locomesh.node.nat.reachability` (read
that first): it *asks* helpers about itself (a probe round every `interval`
seconds; while the verdict is unknown after `retry_interval` seconds,
doubling each time; at once after `probe_soon`, when we have a new address
to try), it *helps*
(finds a dialer for a peer that asks), and it *dials back* (on a fresh
connection, for a helper). One stream carries one exchange: a signed request
frame and a signed `reach.result` frame back.

What bounds the work a peer can make us do:

* a request or delegation from one peer is rate-limited (`RateLimiter`,
  a few per minute); over the limit the answer is ``busy``;
* at most `MAX_DIALBACKS` dial-backs run at once, each address dial within
  `DIAL_TIMEOUT`, at most `MAX_DIAL_ADDRS` addresses per request;
* a helper forwards only addresses at the IP the asking peer's connection
  comes from (`addrs_at_ip`), and only plain TCP ones, so no one can use the
  mesh to dial a third party; a request over a relayed connection has no
  such IP and is answered ``no-address``;
* the dialer does not trust the helper for that (the helper may be the one
  attacking): it dials only public unicast addresses, all at one IP
  (`dial_back_targets`), so a peer can make it dial neither its own host or
  LAN nor several hosts at once; anything else is answered ``no-address``.
  Both ends take private addresses only with ``allow_private_addrs`` (tests,
  local swarms; `locomesh.node.addresses`).
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import DialError, Node
from locomesh.node.streams import close_quietly, read_frame, write_frame
from locomesh.protocol import Envelope, ProtocolError, decode, encode
from locomesh.protocol.kinds import REACH_DELEGATE, REACH_DIALBACK, REACH_REQUEST, REACH_RESULT

from locomesh.node.addresses import addrs_at_ip, dial_back_targets, is_private_ip, tcp_address, tcp_endpoint
from locomesh.node.connections import DIRECT, ConnectionFacts, facts_of, facts_of_stream
from locomesh.node.listen_port import from_ephemeral_port
from locomesh.node.nat.reachability import UNKNOWN, RateLimiter, ReachabilityTracker

logger = logging.getLogger(__name__)

PROTOCOL_ID = "/locomesh/reach/1"
FRAME_TIMEOUT = 10.0
DIAL_TIMEOUT = 5.0
MAX_DIAL_ADDRS = 3
MAX_DIALBACKS = 4
MAX_DELEGATES_TRIED = 3
DELEGATE_TIMEOUT = MAX_DIAL_ADDRS * DIAL_TIMEOUT + 2 * FRAME_TIMEOUT  # one dialer's whole answer
REQUEST_TIMEOUT = MAX_DELEGATES_TRIED * DELEGATE_TIMEOUT  # a helper's whole answer, worst case
# How one exchange with a peer can fail without it being our bug: no stream, bad input, a reset or
# closed stream, a dropped connection.
EXCHANGE_FAILURES = (
    DialError, ProtocolError, BaseLibp2pError, OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError
)
_MAX_FRAME = max(kind.max_size for kind in (REACH_REQUEST, REACH_DELEGATE, REACH_DIALBACK, REACH_RESULT))
_INBOUND_KINDS = frozenset({REACH_REQUEST.name, REACH_DELEGATE.name, REACH_DIALBACK.name})
_RESULT_KINDS = frozenset({REACH_RESULT.name})

AddressSource = Callable[[Node], list[str]]


def advertised_addrs(node: Node) -> list[str]:
    """The TCP addresses we could be reached at: where we listen, and where peers saw us (Identify)."""
    candidates = [str(address) for address in node.host.get_transport_addrs()] + node.observed_addresses()
    found: list[str] = []
    for address in candidates:
        endpoint = tcp_endpoint(address.split("/p2p/")[0])
        if endpoint is not None and tcp_address(*endpoint) not in found:
            found.append(tcp_address(*endpoint))
    return found


class ReachabilityService:
    """Asks, helps and dials back; shows the verdict as the status field ``reachability``."""

    name = "reach"

    def __init__(
        self,
        *,
        interval: float = 600.0,
        retry_interval: float = 10.0,
        first_delay: float = 2.0,
        helpers_per_round: int = 2,
        addresses: AddressSource = advertised_addrs,
        clock: Callable[[], float] = time.time,
        libp2p_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        nonces: Callable[[int], bytes] = secrets.token_bytes,
        allow_private_addrs: bool = False,
    ) -> None:
        """`allow_private_addrs` lets dial-backs go to private and loopback addresses: tests and local swarms only."""
        self.interval = interval
        self.retry_interval = retry_interval
        self.first_delay = first_delay
        self.helpers_per_round = helpers_per_round
        self._addresses = addresses
        self._clock = clock
        self._libp2p_clock = libp2p_clock  # what py-libp2p stamps connections with (virtual in netsim)
        self._rng = rng or random.SystemRandom()
        self._nonces = nonces  # unpredictable bytes; only a simulation passes a seeded source (a repeatable run)
        self.allow_private_addrs = allow_private_addrs
        self.tracker = ReachabilityTracker(now=clock)
        self._request_limit = RateLimiter(clock, burst=3, interval=20.0)
        self._delegate_limit = RateLimiter(clock, burst=6, interval=10.0)
        self._dialbacks = trio.Semaphore(MAX_DIALBACKS)
        # nonce -> how many peers we had met when the probe went out (`PeerTracker.met_by`)
        self._met_horizon: OrderedDict[bytes, int] = OrderedDict()
        self._wake = trio.Event()
        self._node: Node | None = None

    @property
    def verdict(self) -> str:
        return self.tracker.verdict()

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        node.set_stream_handler(PROTOCOL_ID, self._handle, timeout=REQUEST_TIMEOUT + FRAME_TIMEOUT)
        node.add_status_field("reachability", self.tracker.status)
        node.peers.stranger_listeners.append(self._stranger_connected)
        node.rpc.register("nat.probe", self._rpc_probe)
        task_status.started()
        await trio.sleep(self.first_delay)
        idle_rounds = 0
        while True:
            decisive = self.tracker.decisive()
            await self.probe_round()
            # While unsure, ask again soon; back off while rounds bring no evidence at all (a node
            # whose peers all know each other finds no dialer and stays unsure).
            idle_rounds = 0 if self.tracker.decisive() > decisive else idle_rounds + 1
            backoff = 2 ** max(0, idle_rounds - 1)
            unsure = self.tracker.verdict() == UNKNOWN
            with trio.move_on_after(min(self.retry_interval * backoff, self.interval) if unsure else self.interval):
                await self._wake.wait()
            self._wake = trio.Event()

    def _stranger_connected(self, facts: ConnectionFacts) -> None:
        """A stranger dialled us: evidence that we are public at our global listen address, if we have one."""
        node = self._require_node()
        for address in node.host.get_transport_addrs():
            endpoint = tcp_endpoint(str(address).split("/p2p/")[0])
            if endpoint is not None and not is_private_ip(endpoint[0]):
                self.tracker.on_stranger(tcp_address(*endpoint), facts.peer_id)
                logger.info("reachable at %s: %s, a peer we had never met, dialled us", tcp_address(*endpoint), facts.peer_id)
                return

    def probe_soon(self) -> None:
        """Run the next probe round now: we have a new address to try (a gateway just mapped one)."""
        self._wake.set()

    # --- asking: one probe round -------------------------------------------------------

    async def probe_round(self) -> str:
        """Ask up to `helpers_per_round` directly connected peers about us; return the verdict after."""
        node = self._require_node()
        self.tracker.expire()
        busy = self.tracker.pending_helpers()
        helpers = [peer for peer in self._direct_peers() if peer not in busy]
        self._rng.shuffle(helpers)
        addrs = self._addresses(node)[: REACH_REQUEST.body.fields["addrs"].max_len]
        if addrs:
            async with trio.open_nursery() as nursery:
                for helper in helpers[: self.helpers_per_round]:
                    nursery.start_soon(self._ask, helper, addrs)
        self.tracker.expire()
        return self.tracker.verdict()

    async def _ask(self, helper: str, addrs: list[str]) -> None:
        node = self._require_node()
        nonce = self._nonces(16)
        self.tracker.start_probe(nonce, helper, addrs)
        self._met_horizon[nonce] = node.peers.connects_total
        while len(self._met_horizon) > self.tracker.max_probes:
            self._met_horizon.popitem(last=False)
        try:
            reply = await self._exchange(helper, REACH_REQUEST.name, {"nonce": nonce, "addrs": addrs}, REQUEST_TIMEOUT)
        except EXCHANGE_FAILURES as error:
            logger.debug("reachability probe via %s failed: %s", helper, error)
            self.tracker.on_result(nonce, helper, "no-dialer", "", "")
            return
        body = reply.body
        if body["nonce"] != nonce:
            node.count_protocol_error("wrong-nonce")
            return
        self.tracker.on_result(nonce, helper, body["outcome"], body["addr"], body["dialer"])
        logger.info("reachability probe via %s: %s %s", helper, body["outcome"], body["addr"])

    async def _exchange(self, peer: str, kind: str, body: dict[str, Any], timeout: float) -> Envelope:
        """Send one signed request to `peer` on a new stream and return its signed `reach.result`."""
        node = self._require_node()
        stream = await node.open_stream(peer, [PROTOCOL_ID])
        try:
            await write_frame(stream, encode(node.identity, kind, body), timeout=FRAME_TIMEOUT)
            frame = await read_frame(stream, max_size=REACH_RESULT.max_size, timeout=timeout)
        finally:
            await close_quietly(stream)
        reply = decode(frame, kinds=_RESULT_KINDS)
        if reply.author_peer_id != peer:
            raise ProtocolError("wrong-author", f"reach result signed by {reply.author_peer_id}, not {peer}")
        return reply

    # --- serving: dispatch by kind ---------------------------------------------------------

    async def _handle(self, stream: Any) -> None:
        frame = await read_frame(stream, max_size=_MAX_FRAME, timeout=FRAME_TIMEOUT)
        envelope = decode(frame, kinds=_INBOUND_KINDS)
        remote = str(stream.muxed_conn.peer_id)
        if envelope.author_peer_id != remote:
            raise ProtocolError("wrong-author", f"{envelope.kind} signed by {envelope.author_peer_id}, sent by {remote}")
        if envelope.kind == REACH_REQUEST.name:
            outcome, addr, dialer = await self._help(stream, remote, envelope.body)
        elif envelope.kind == REACH_DELEGATE.name:
            outcome, addr, dialer = await self._dial_back(remote, envelope.body)
        else:
            outcome, addr, dialer = self._accept_dialback(stream, remote, envelope.body)
        reply = {"nonce": envelope.body["nonce"], "outcome": outcome, "addr": addr, "dialer": dialer}
        await write_frame(stream, encode(self._require_node().identity, REACH_RESULT.name, reply), timeout=FRAME_TIMEOUT)

    async def _help(self, stream: Any, asker: str, body: dict[str, Any]) -> tuple[str, str, str]:
        """As helper B: keep the addrs at the asker's IP and find a dialer not connected to it."""
        if not self._request_limit.allow(asker):
            return "busy", "", ""
        facts = facts_of_stream(stream)
        addrs = addrs_at_ip(body["addrs"], facts.remote_ip if facts else None, limit=MAX_DIAL_ADDRS,
                            allow_private_addrs=self.allow_private_addrs)
        if not addrs:
            return "no-address", "", ""
        dialers = [peer for peer in self._direct_peers() if peer != asker]
        self._rng.shuffle(dialers)
        delegate = {"nonce": body["nonce"], "target": asker, "addrs": addrs}
        for dialer in dialers[:MAX_DELEGATES_TRIED]:
            try:
                reply = await self._exchange(dialer, REACH_DELEGATE.name, delegate, DELEGATE_TIMEOUT)
            except EXCHANGE_FAILURES as error:
                logger.debug("dialer %s failed: %s", dialer, error)
                continue
            if reply.body["outcome"] in ("dialed", "unreachable"):
                return reply.body["outcome"], reply.body["addr"], dialer
        return "no-dialer", "", ""

    async def _dial_back(self, helper: str, body: dict[str, Any]) -> tuple[str, str, str]:
        """As dialer C: dial the target on a fresh connection at each address until one answers.

        Only the addresses `dial_back_targets` keeps are dialled (public
        unicast, one IP, at most `MAX_DIAL_ADDRS`); a request with none is
        answered ``no-address`` without any dial.
        """
        node = self._require_node()
        target = body["target"]
        try:
            target_id = ID.from_base58(target)
        except Exception:  # noqa: BLE001 - base58 / multihash errors of several types
            raise ProtocolError("bad-field", "target: not a peer ID") from None
        if target in (node.peer_id, helper) or target in node.peers:
            return "no-dialer", "", ""
        if not self._delegate_limit.allow(helper):
            return "busy", "", ""
        addrs = dial_back_targets(body["addrs"], limit=MAX_DIAL_ADDRS, allow_private_addrs=self.allow_private_addrs)
        if not addrs:
            return "no-address", "", ""
        try:
            self._dialbacks.acquire_nowait()
        except trio.WouldBlock:
            return "busy", "", ""
        try:
            for addr in addrs:
                if await self._dial_and_prove(target_id, addr, body["nonce"]):
                    return "dialed", addr, node.peer_id
        finally:
            self._dialbacks.release()
        return "unreachable", addrs[-1], node.peer_id

    async def _dial_and_prove(self, target: ID, addr: str, nonce: bytes) -> bool:
        """Connect to `target` at exactly `addr` (a new connection), hand it the nonce, then hang up."""
        node = self._require_node()
        network = node.host.get_network()
        node.forget_failed_dials(str(target))
        try:
            with trio.fail_after(DIAL_TIMEOUT), from_ephemeral_port():
                conn = await network.dial_addr(Multiaddr(f"{addr}/p2p/{target}"), target)
        except Exception as error:  # noqa: BLE001 - trio.TooSlowError and py-libp2p's many dial errors
            logger.debug("dial-back to %s at %s failed: %s", target, addr, error)
            return False
        try:
            reply = await self._exchange(str(target), REACH_DIALBACK.name, {"nonce": nonce, "addr": addr}, FRAME_TIMEOUT)
            return reply.body["outcome"] == "dialed" and reply.body["nonce"] == nonce
        except EXCHANGE_FAILURES as error:
            logger.debug("dial-back to %s at %s: no proof: %s", target, addr, error)
            return False
        finally:
            await _hang_up(conn)

    def _accept_dialback(self, stream: Any, dialer: str, body: dict[str, Any]) -> tuple[str, str, str]:
        """As the asker A: a dialback counts only on an inbound direct connection opened after the probe."""
        facts = facts_of_stream(stream)
        if facts is None or facts.direction != "inbound" or facts.kind != DIRECT:
            raise ProtocolError("bad-dialback", "a dialback must arrive on an inbound direct connection")
        opened_at = self._clock() - (self._libp2p_clock() - facts.opened_at)  # the connection's age, on our clock
        horizon = self._met_horizon.get(body["nonce"])
        if horizon is not None and self._require_node().peers.met_by(dialer, horizon):
            # A port-restricted NAT still admits a peer we talked to (filters outlive connections;
            # with a port-preserving NAT that made such nodes think they were public): the dialback
            # is answered, but proves nothing, and the probe ends inconclusive.
            logger.info("dialled back at %s by %s, a peer we met before: no proof", body["addr"], dialer)
            return "dialed", body["addr"], dialer
        if not self.tracker.on_dialback(body["nonce"], body["addr"], dialer, opened_at=opened_at):
            raise ProtocolError("bad-dialback", "no probe of ours matches this dialback")
        logger.info("reachable at %s: dialled back by %s", body["addr"], dialer)
        return "dialed", body["addr"], dialer

    # --- helpers ---------------------------------------------------------------------------

    def _direct_peers(self) -> list[str]:
        """Peers we hold a direct (not relayed) connection to."""
        node = self._require_node()
        found: set[str] = set()
        for connections in list(node.host.get_network().connections.values()):
            for conn in connections:
                facts = facts_of(conn)
                if facts.kind == DIRECT:
                    found.add(facts.peer_id)
        return sorted(found)

    def _require_node(self) -> Node:
        assert self._node is not None, "the service is not running"
        return self._node

    async def _rpc_probe(self) -> dict[str, Any]:
        """RPC ``nat.probe``: run one probe round now and return the ``reachability`` status."""
        if self._node is None:
            raise RpcError(-32000, "the reachability service is not running")
        await self.probe_round()
        return self.tracker.status()


async def _hang_up(conn: Any) -> None:
    """Close a dial-back connection within `FRAME_TIMEOUT`; it may be gone already."""
    with trio.move_on_after(FRAME_TIMEOUT):
        try:
            await conn.close()
        except Exception as error:  # noqa: BLE001 - best effort: the peer may have hung up first
            logger.debug("closing a dial-back connection failed: %s", error)
