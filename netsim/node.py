"""A simulated node: the daemon's `Node` (its host built by `build_host`) on a simulated interface.

`SimNode` is what a scenario holds for each node. Each run creates a
`locomesh.node.runtime.Node` with a `SimTransport` injected, so the host
is built by the same factory as the daemon's (`build_host`) and Noise,
Yamux, multistream and Identify all run for real; only the bytes travel
through the `Network` instead of sockets. Protocols are added as services
(`add_service`) and registered through `Node.set_stream_handler`, which
guards them like the daemon's, so a misbehaving peer costs a counted error
(`errors`), never the host.

Lifecycle: `run` serves until cancelled; `crash` makes the node vanish at
once (connections reset, no goodbye), after which `run` may be called again
(`Simulation.restart`): a new `Node` and host with the same identity and
the same service objects (their state stands for what the node had
persisted). Error counts carry over.

py-libp2p's auto-connector is stopped unless `auto_connect` is set: with
its defaults (aim for 200 connections, dial everything in the peerstore every
30 s) every node would try to connect to every peer it heard of, which is
neither what a scenario wants to measure nor affordable at a thousand nodes.
Scenarios decide whom a node dials.

Daemon services (`locomesh.node.service.Service`, e.g. the NAT traversal
ones) are added to `services` before the node starts; they run after the
stream handlers, in order, as in the daemon. Peers in `bootstrap` are kept
connected by the `Node` itself (dialled at start, and again with backoff
whenever the connection drops), as the daemon's bootstrap list.

Byzantine behaviour enters through `hooks` (`ByzantineHooks`): a scenario can
replace a service's handler, or rewrite or drop every frame a service sends.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from locomesh.node.runtime import DialError, Node
from locomesh.node.service import Service
from locomesh.protocol import Identity

from .network import Interface, Network
from .pipe import Endpoint
from .transport import SimTransport, multiaddr_of

Handler = Callable[[INetStream], Awaitable[None]]
FrameHook = Callable[[str, bytes], "bytes | None"]

DIAL_TIMEOUT = 15.0
STREAM_TIMEOUT = 10.0
_PROTOCOL_ERRORS = "locomesh_protocol_errors_total"


@dataclass
class ByzantineHooks:
    """How a scenario makes a node misbehave. Empty hooks: an honest node."""

    handlers: dict[str, Handler] = field(default_factory=dict)  # protocol -> replacement handler
    outgoing: FrameHook | None = None  # (protocol, frame) -> frame to send instead, or None to drop it

    def frame(self, protocol: str, frame: bytes) -> bytes | None:
        """The frame a service should actually send (None: send nothing)."""
        return frame if self.outgoing is None else self.outgoing(protocol, frame)


@dataclass
class _Handler:
    handler: Handler
    timeout: float | None


class _HandlerService:
    """A `locomesh.node.service.Service` that registers the simulated node's stream handlers."""

    name = "netsim-handlers"

    def __init__(self, sim_node: SimNode) -> None:
        self._sim_node = sim_node

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        for protocol, entry in self._sim_node.handlers.items():
            handler = self._sim_node.hooks.handlers.get(protocol, entry.handler)
            node.set_stream_handler(protocol, handler, timeout=entry.timeout)
        task_status.started()


class SimNode:
    """One node of a simulation."""

    def __init__(
        self,
        name: str,
        identity: Identity,
        interface: Interface,
        network: Network,
        *,
        rng: random.Random,
        auto_connect: bool = False,
    ) -> None:
        self.name = name
        self.identity = identity
        self.interface = interface
        self.network = network
        self.rng = rng
        self.auto_connect = auto_connect
        self.peer_id = ID.from_base58(identity.peer_id)
        self.hooks = ByzantineHooks()
        self.handlers: dict[str, _Handler] = {}
        self.services: list[Service] = []  # daemon services run after the handlers (e.g. NAT traversal)
        self.bootstrap: list[tuple[ID, Endpoint]] = []  # kept connected by its `Node`, as the daemon's list
        self.node: Node | None = None
        self.nursery: trio.Nursery | None = None
        self._errors: Counter[str] = Counter()
        self._stopped = trio.Event()
        self._stopped.set()

    @property
    def host(self) -> IHost | None:
        return None if self.node is None else self.node.host

    @property
    def listen_addr(self) -> Endpoint:
        return self.interface.endpoint

    @property
    def running(self) -> bool:
        return self.nursery is not None

    @property
    def errors(self) -> Counter[str]:
        """Errors counted so far: the node's protocol errors (by code) and failed dials and streams."""
        return self._errors + self._protocol_errors()

    def count_error(self, code: str) -> None:
        """Count an error a service met outside a guarded handler (a failed exchange it started)."""
        self._errors[code] += 1

    def add_service(self, protocol: str, handler: Handler, *, timeout: float | None = 60.0) -> None:
        """Serve `protocol` with `handler` (guarded; `timeout` bounds each stream, None for long-lived ones)."""
        self.handlers[protocol] = _Handler(handler, timeout)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the `Node`, listen, serve until cancelled or crashed; the node closes its host."""
        if not self._stopped.is_set():
            raise RuntimeError(f"{self.name} is already running")
        self._stopped = trio.Event()
        node = Node.create(
            self.identity,
            listen_addrs=[multiaddr_of(self.listen_addr)],
            transports=[SimTransport(self.network, self.interface)],
            services=[_HandlerService(self), *self.services],
            bootstrap=[multiaddr_of(endpoint).encapsulate(f"/p2p/{peer}") for peer, endpoint in self.bootstrap],
            rng=self.rng,
        )
        self.node = node
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._run_node, node, nursery.cancel_scope)
                if not self.auto_connect:
                    await node.host.get_network().auto_connector.stop()
                self.nursery = nursery
                task_status.started()
        finally:
            self._errors += self._protocol_errors()
            self.nursery = self.node = None
            self._stopped.set()

    async def _run_node(self, node: Node, scope: trio.CancelScope, *, task_status: Any) -> None:
        await node.run(task_status=task_status)
        scope.cancel()  # a graceful stop: end the node's other tasks too

    def stop(self) -> None:
        """Leave gracefully (connections closed): `run` returns once the node has shut down."""
        if self.node is not None:
            self.node.request_stop()

    def crash(self) -> None:
        """Vanish now: every connection is reset and `run` returns."""
        self.network.crash(self.interface)
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    async def wait_stopped(self) -> None:
        """Return once `run` has finished (at once if it is not running)."""
        await self._stopped.wait()

    async def connect(self, peer_id: ID, endpoint: Endpoint, *, timeout: float = DIAL_TIMEOUT) -> bool:
        """Connect to `peer_id` at `endpoint`; False (counted) if that failed within `timeout`."""
        if self.node is None:
            return False
        try:
            await self.node.connect(multiaddr_of(endpoint).encapsulate(f"/p2p/{peer_id}"), timeout=timeout)
            return True
        except DialError as error:
            self._errors["dial-" + _reason(error)] += 1
            return False

    async def open_stream(self, peer_id: ID, protocol: str, *, timeout: float = STREAM_TIMEOUT) -> INetStream | None:
        """A new stream to a connected peer, or None (counted) if that fails within `timeout`."""
        if self.node is None:
            return None
        try:
            return await self.node.open_stream(str(peer_id), [protocol], timeout=timeout)
        except DialError as error:
            self._errors["stream-" + _reason(error)] += 1
            return None

    def connected_peers(self) -> list[ID]:
        return [] if self.host is None else list(self.host.get_connected_peers())

    def _protocol_errors(self) -> Counter[str]:
        if self.node is None:
            return Counter()
        samples = self.node.metrics[_PROTOCOL_ERRORS].samples()
        return Counter({labels[0]: int(value) for labels, value in samples})

    def __repr__(self) -> str:
        return f"SimNode({self.name}, {self.interface.nat_type.value}, {self.interface.ip})"


def _reason(error: DialError) -> str:
    """A short label for a failed dial: "timeout", or the py-libp2p exception's class name."""
    text = str(error)
    if " within " in text:
        return "timeout"
    cause = error.__cause__
    return type(cause).__name__.lower() if cause is not None else "failed"
