"""py-libp2p's view of the simulated network: an `ITransport` for ``/ip4/A.B.C.D/tcp/P`` addresses.

One `SimTransport` belongs to one node's `Interface`. Dialing routes through
the `Network` (NATs, partitions, link delays); listening registers the
interface's endpoint with it. The connections are `SimStream`s wrapped in
`RawConnection`s, so py-libp2p runs Noise and Yamux over them exactly as it
does over TCP. The addresses look like TCP ones but never touch a socket.

Parsing a multiaddr is slow in the `multiaddr` package (docs/measurements.md),
and the swarm asks `can_dial` of every address it considers, so
both conversions are memoised (a simulation has a few addresses per node;
multiaddrs are immutable).
"""

from __future__ import annotations

from functools import lru_cache

import trio
from libp2p.abc import IListener, IRawConnection, ITransport
from libp2p.connection_types import ConnectionType
from libp2p.custom_types import THandler
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.transport.exceptions import OpenConnectionError
from multiaddr import Multiaddr

from .network import Interface, Network
from .pipe import Endpoint, SimStream

_DIALABLE = ("ip4", "tcp")


def endpoint_of(maddr: Multiaddr) -> Endpoint:
    """``/ip4/A.B.C.D/tcp/P[/p2p/...]`` -> ("A.B.C.D", P); raises `OpenConnectionError` otherwise."""
    endpoint = _endpoint_of_bytes(maddr.to_bytes())
    if endpoint is None:
        raise OpenConnectionError(f"the simulator routes only /ip4/.../tcp/... addresses, not {maddr}")
    return endpoint


@lru_cache(maxsize=1 << 16)
def _endpoint_of_bytes(packed: bytes) -> Endpoint | None:
    maddr = Multiaddr(packed)
    names = [p.name for p in maddr.protocols()]
    if names[:2] != list(_DIALABLE) or any(name != "p2p" for name in names[2:]):
        return None
    return (maddr.value_for_protocol("ip4"), int(maddr.value_for_protocol("tcp")))


@lru_cache(maxsize=1 << 16)
def multiaddr_of(endpoint: Endpoint) -> Multiaddr:
    return Multiaddr(f"/ip4/{endpoint[0]}/tcp/{endpoint[1]}")


class SimListener(IListener):
    """Accepts connections to the interface's endpoint; each runs `handler` in the swarm's nursery."""

    background_nursery: trio.Nursery | None = None  # set by the swarm before `listen`

    def __init__(self, network: Network, interface: Interface, handler: THandler) -> None:
        self._network = network
        self._interface = interface
        self._handler = handler
        self._addrs: tuple[Multiaddr, ...] = ()

    async def listen(self, maddr: Multiaddr) -> None:
        ip, port = endpoint_of(maddr)
        if ip not in (self._interface.ip, "0.0.0.0"):
            raise OpenConnectionError(f"{self._interface.name} has address {self._interface.ip}, not {ip}")
        nursery = self.background_nursery
        if nursery is None:
            raise OpenConnectionError("listen() needs the swarm's background nursery")

        def accept(stream: SimStream) -> None:
            nursery.start_soon(self._handler, stream)

        self._network.listen(self._interface, port, accept)
        self._addrs = (multiaddr_of((self._interface.ip, port)),)
        await trio.lowlevel.checkpoint()

    def get_addrs(self) -> tuple[Multiaddr, ...]:
        return self._addrs

    async def close(self) -> None:
        for maddr in self._addrs:
            self._network.unlisten(self._interface, endpoint_of(maddr)[1])
        self._addrs = ()
        await trio.lowlevel.checkpoint()


class SimTransport(ITransport):
    """The in-memory transport of one simulated node."""

    def __init__(self, network: Network, interface: Interface) -> None:
        self.network = network
        self.interface = interface

    async def dial(self, maddr: Multiaddr) -> IRawConnection:
        stream = await self.network.connect(self.interface, endpoint_of(maddr))
        return RawConnection(stream, True, ConnectionType.DIRECT, [maddr])

    def create_listener(self, handler_function: THandler) -> IListener:
        return SimListener(self.network, self.interface, handler_function)

    def can_dial(self, maddr: Multiaddr) -> bool:
        try:
            endpoint_of(maddr)
        except (OpenConnectionError, ValueError, LookupError):
            return False
        return True

    can_listen = can_dial

    def protocols(self) -> list[str]:
        return ["tcp"]

    def __repr__(self) -> str:
        return f"SimTransport({self.interface.name}@{self.interface.ip})"

