"""The node: one libp2p host, its services, and what they share (RPC methods, metrics, peer table).

`Node` is what the daemon runs and what the network simulator runs many of.
It owns no files and no RPC socket (that is `locomesh.node.daemon`'s job), so
it can live anywhere a trio event loop does::

    node = Node.create(identity, listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")],
                       services=[PingService()], bootstrap=[...])
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)      # returns once listening and every service started
        ...
        node.request_stop()                # run() then cancels services and closes the host

`run` listens, starts each service in order (see `locomesh.node.service`),
starts the bootstrap dialers, reports itself started, and then waits for
`request_stop()`. On the way out it cancels the services and closes the host
(`host.run()` alone leaves the listening sockets open).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import trio
from libp2p.abc import IHost, INetStream, ITransport
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from locomesh.node import version
from locomesh.protocol import Identity

from locomesh.node.bootstrap import Backoff, keep_connected
from locomesh.node.dial_addrs import CachedInterfaceIps, dial_addresses
from locomesh.node.host import DIAL_TIMEOUT, build_host
from locomesh.node.meter import ByteMeter
from locomesh.node.metrics import Metrics
from locomesh.node.peer_scores import PeerScores
from locomesh.node.peers import PeerTracker
from locomesh.node.rpc.dispatch import RpcRegistry
from locomesh.node.service import DRAIN_SECONDS, SHUTDOWN_GRACE, Service
from locomesh.node.stream_pool import StreamPool
from locomesh.node.streams import NOT_PROTOCOL_ERRORS, Handler, guarded

logger = logging.getLogger(__name__)

STREAM_OPEN_TIMEOUT = 10.0


class DialError(Exception):
    """A peer could not be reached, or would not open a stream, in time."""


class ListenError(Exception):
    """The node could not listen on one of its addresses (in use, not local, ...)."""


class AddressInUse(ListenError):
    """Something else listens on an address we were told to listen on."""


class Node:
    """A running locomesh peer. See the module docstring for its life cycle."""

    def __init__(
        self,
        identity: Identity,
        host: IHost,
        *,
        listen_addrs: Sequence[Multiaddr],
        meter: ByteMeter,
        services: Sequence[Service] = (),
        bootstrap: Sequence[Multiaddr] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.identity = identity
        self.host = host
        self.listen_addrs = list(listen_addrs)
        self.meter = meter
        self.services = list(services)
        self.bootstrap = [addr for addr in bootstrap if _peer_of(addr) != identity.peer_id]
        self.rng = rng or random.SystemRandom()
        self.rpc = RpcRegistry()
        self.metrics = Metrics()
        self.peers = PeerTracker()
        self.stream_pool = StreamPool()  # idle data plane streams to providers (stream_pool.py)
        self.scores = PeerScores(self.metrics)  # what each peer served us, good and bad, across services
        self._status_fields: dict[str, Callable[[], Any]] = {"runs": list}
        self.interface_ips = CachedInterfaceIps()  # the host's IPs, behind a listen address of 0.0.0.0 (tests replace it)
        self._stop = trio.Event()
        self._started_at: float | None = None
        self._register_metrics()
        self.host.get_network().register_notifee(self.peers)

    @classmethod
    def create(
        cls,
        identity: Identity,
        *,
        listen_addrs: Sequence[Multiaddr],
        transports: Sequence[ITransport] | None = None,
        **options: Any,
    ) -> Node:
        """Build the host (`build_host`, with `transports` injected) and the node around it."""
        meter = ByteMeter()
        host = build_host(identity, listen_addrs=listen_addrs, transports=transports, meter=meter)
        return cls(identity, host, listen_addrs=listen_addrs, meter=meter, **options)

    # --- what services use ----------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def set_stream_handler(self, protocol_id: str, handler: Handler, *, timeout: float | None = 60.0) -> None:
        """Serve `protocol_id` with `handler`, guarded: its errors are logged, counted, and reset the stream."""
        wrapped = guarded(handler, name=protocol_id, on_error=self.count_protocol_error, timeout=timeout)
        self.host.set_stream_handler(protocol_id, wrapped)

    async def open_stream(
        self, peer_id: str, protocols: Sequence[str], *, timeout: float = STREAM_OPEN_TIMEOUT
    ) -> INetStream:
        """A new stream to `peer_id` speaking one of `protocols`, or `DialError` within `timeout` s."""
        try:
            with trio.fail_after(timeout):
                return await self.host.new_stream(ID.from_base58(peer_id), list(protocols))
        except trio.TooSlowError:
            raise DialError(f"no stream to {peer_id} within {timeout:g} s") from None
        except Exception as error:  # py-libp2p raises many unrelated types here
            raise DialError(f"no stream to {peer_id}: {type(error).__name__}: {error}") from error

    async def connect(self, address: Multiaddr, *, timeout: float = DIAL_TIMEOUT) -> None:
        """Connect to the peer at exactly `address` (ending in ``/p2p/<peer id>``) unless already
        connected to it, or `DialError` within `timeout` s.

        Not `host.connect`: that dials whatever the peerstore holds for the peer, and py-libp2p
        picks at most one address per transport class, so a peer known at a private and a public
        TCP address was dialled only at the first one, and a dial at the public one never left."""
        info = info_from_p2p_addr(address)
        network = self.host.get_network()
        try:
            with trio.fail_after(timeout):
                self.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 120)
                if network.connections.get(info.peer_id):
                    await self.host.connect(info)  # returns once the existing connection is ready
                else:
                    await network.dial_addr(address, info.peer_id)
        except trio.TooSlowError:
            raise DialError(f"no connection to {address} within {timeout:g} s") from None
        except Exception as error:  # as in open_stream
            raise DialError(f"no connection to {address}: {type(error).__name__}: {error}") from error

    async def connect_any(self, addresses: Sequence[Multiaddr], *, timeout: float = DIAL_TIMEOUT) -> Multiaddr:
        """Connect to one peer at the first of `addresses` (each as `connect` takes it) that answers,
        tried in order, each within `timeout` s; the address that worked, or `DialError` naming
        every failure."""
        errors = []
        for address in addresses:
            try:
                await self.connect(address, timeout=timeout)
                return address
            except DialError as error:
                errors.append(str(error))
        raise DialError("; ".join(errors) or "no address to dial")

    def count_protocol_error(self, code: str) -> None:
        """Count a stream dropped with error `code`: as a protocol error (bad or slow input), or,
        for the codes a healthy peer causes (`NOT_PROTOCOL_ERRORS`), as a stream that ended early."""
        if code in NOT_PROTOCOL_ERRORS:
            self._streams_ended_early.inc(code=code)
        else:
            self._protocol_errors.inc(code=code)

    def add_status_field(self, name: str, value: Callable[[], Any]) -> None:
        """Add (or replace) a field of `node.status`, computed by `value()` at each call."""
        self._status_fields[name] = value

    # --- life cycle ---------------------------------------------------------------------

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, start services and bootstrap dialers, report started, run until `request_stop()`."""
        try:
            async with self.host.run(listen_addrs=self.listen_addrs):
                self._check_listening()
                self._started_at = trio.current_time()
                async with trio.open_nursery() as nursery:
                    for service in self.services:
                        await nursery.start(service.run, self)
                        logger.debug("service %s started", service.name)
                    self._start_bootstrap(nursery)
                    logger.info("node %s listening on %s", self.peer_id, ", ".join(self.listen_addresses()))
                    task_status.started()
                    await self._stop.wait()
                    await self._drain()
                    nursery.cancel_scope.cancel()
                await self.stream_pool.aclose()
                await self._close_connections()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_GRACE):
                await self.host.close()

    async def _drain(self) -> None:
        """Let every service that drains say what it must before it goes (node/service.py, 4)."""
        drains = [service.drain for service in self.services if hasattr(service, "drain")]
        with trio.move_on_after(DRAIN_SECONDS):
            async with trio.open_nursery() as nursery:
                for drain in drains:
                    nursery.start_soon(drain)

    def _check_listening(self) -> None:
        # py-libp2p logs a failed listen and carries on without it; a node that
        # cannot be reached where it was told to listen should say so and stop.
        listening = self.host.get_network().listeners
        missing = [str(address) for address in self.listen_addrs if str(address) not in listening]
        if missing:
            raise ListenError(f"cannot listen on {', '.join(missing)} (address in use or not on this machine?)")

    async def _close_connections(self) -> None:
        """Close every connection while the host still runs.

        py-libp2p 0.8.1 cancels its tasks before it closes connections when
        `host.run()` exits, so the sockets stay open (the peers never see us
        leave); closing them first fixes that.
        """
        network = self.host.get_network()
        with trio.move_on_after(SHUTDOWN_GRACE):
            for connections in list(network.connections.values()):
                for connection in list(connections):
                    try:
                        await connection.close()
                    except Exception as error:  # noqa: BLE001 - best effort on the way out
                        logger.debug("closing a connection failed: %s", error)

    def request_stop(self) -> None:
        """Ask `run` to shut down; returns at once (idempotent)."""
        self._stop.set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def uptime(self) -> float:
        return 0.0 if self._started_at is None else trio.current_time() - self._started_at

    def _start_bootstrap(self, nursery: trio.Nursery) -> None:
        for address in self.bootstrap:
            nursery.start_soon(self._keep_bootstrap_peer, address)

    async def _keep_bootstrap_peer(self, address: Multiaddr) -> None:
        peer = _peer_of(address)

        async def dial(address: Multiaddr) -> None:
            self.forget_failed_dials(peer)
            await self.connect(address)

        await keep_connected(
            address,
            dial=dial,
            is_connected=lambda: peer in self.peers,
            backoff=Backoff(rng=self.rng),
            dial_timeout=DIAL_TIMEOUT,
        )

    def forget_failed_dials(self, peer_id: str | None) -> None:
        """Let the next dial to `peer_id` go out even if one failed in the last 60 s."""
        # py-libp2p refuses every dial to a peer for 60 s after one failed
        # ("negative cache"), which would make our own backoff moot: a
        # bootstrap peer that comes up 1 s after our first try would wait a
        # minute. The cache is private; if it is gone in another version,
        # nothing is lost but this shortcut.
        cache = getattr(self.host.get_network(), "_negative_peer_cache", None)
        if cache is not None and peer_id is not None:
            cache.evict(peer_id)

    # --- what the RPC shows --------------------------------------------------------------

    def listen_addresses(self) -> list[str]:
        return [f"{addr}/p2p/{self.peer_id}" for addr in self.host.get_transport_addrs()]

    def observed_addresses(self) -> list[str]:
        """Addresses other peers saw us at (via Identify) that we do not listen on ourselves."""
        own = set(self.listen_addresses())
        return [str(addr) for addr in self.host.get_addrs() if str(addr) not in own]

    def status(self) -> dict[str, Any]:
        status = {
            "peer_id": self.peer_id,
            "version": version(),
            "listen_addrs": self.listen_addresses(),
            "observed_addrs": self.observed_addresses(),
            "uptime_s": round(self.uptime(), 3),
            "peers_connected": len(self.peers),
            "bytes_in": self.meter.bytes_in,
            "bytes_out": self.meter.bytes_out,
            "protocol_errors": int(sum(self._protocol_errors.values.values())),
            "protocol_errors_by_code": _by_code(self._protocol_errors.samples()),
            "streams_ended_early": _by_code(self._streams_ended_early.samples()),
            "services": [service.name for service in self.services],
            "bootstrap": {
                "configured": len(self.bootstrap),
                "connected": sum(_peer_of(address) in self.peers for address in self.bootstrap),
            },
        }
        status.update({name: value() for name, value in self._status_fields.items()})
        # Last: it reads the other fields (the reachability verdict's proofs, the relays' addresses).
        status["dial_addrs"] = dial_addresses(status, self.interface_ips)
        return status

    def peer_list(self) -> list[dict[str, Any]]:
        store = self.host.get_peerstore()
        result = []
        for entry in self.peers.peers():
            try:
                known = [str(addr) for addr in store.addrs(ID.from_base58(entry.peer_id))]
            except Exception:  # noqa: BLE001 - the peerstore raises when it knows no address
                known = []
            result.append(
                {
                    "peer_id": entry.peer_id,
                    "direction": entry.direction,
                    "connection": entry.connection,
                    "connected_since": entry.connected_since,
                    "connection_addrs": entry.remote_addrs,
                    "addrs": known,
                }
            )
        return result

    def _register_metrics(self) -> None:
        metrics = self.metrics
        metrics.gauge("locomesh_peers_connected", "Peers with an open connection.", value=lambda: len(self.peers))
        meter = self.meter
        metrics.counter("locomesh_bytes_in_total", "Bytes received (wire bytes).", value=lambda: meter.bytes_in)
        metrics.counter("locomesh_bytes_out_total", "Bytes sent (wire bytes).", value=lambda: meter.bytes_out)
        metrics.gauge("locomesh_uptime_seconds", "Seconds since the node started listening.", value=self.uptime)
        self._protocol_errors = metrics.counter(
            "locomesh_protocol_errors_total",
            "Streams dropped for bad or slow input from the peer (or a bug: code internal), by error code.",
            labels=("code",),
        )
        self._streams_ended_early = metrics.counter(
            "locomesh_streams_ended_early_total",
            "Streams that ended before their exchange did with nothing wrong in the input "
            "(the peer closed or reset it, or asked about a run not replicated here), by code.",
            labels=("code",),
        )


def _by_code(samples: Any) -> dict[str, int]:
    """A labelled counter's samples as {code: count}."""
    return {labels[0]: int(value) for labels, value in samples}


def _peer_of(address: Multiaddr) -> str | None:
    try:
        return address.value_for_protocol("p2p")
    except Exception:  # noqa: BLE001 - multiaddr raises ProtocolLookupError and others
        return None
