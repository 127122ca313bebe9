"""The simulated internet: address space, routing through NAT boxes, partitions, crashes.

A `Network` owns every `Interface` (one per simulated node: its IP, its
listening port, the NAT box it sits behind if any, its access link and
capacity) and every `NatBox`. A connection attempt (`connect`) is routed in
one step at the connection level, which is all TCP hole punching and NAT
filtering need:

=========================  ===============================================  ==================
target address             rule                                             outcome
=========================  ===============================================  ==================
a public node              translate the source through the dialer's NAT    ``direct``
a NAT's public ip:port     source translated, then the target box filters   ``nat-mapping`` or
                           (`NatBox.inbound`)                               SYN dropped
a private address          only from behind the same NAT box                ``lan`` or dropped
the dialer's own NAT       no hairpinning                                   SYN dropped
unknown address            nobody there                                     SYN dropped
across a partition         packets lost                                     SYN dropped
a node that is down, or    the host answers with a reset                    refused after 1 RTT
not listening on the port
=========================  ===============================================  ==================

A dropped SYN is retried, as TCP does, until `syn_timeout` (virtual seconds)
has passed; a SYN dropped by a NAT's filter is re-examined each time that box
opens a new flow, so two nodes dialling each other's mapped addresses at
about the same time get through when their NAT types allow it (TCP
simultaneous open, what DCUtR relies on). Every attempt is logged in
`dials` as a `DialRecord`, which is what reports are built from.

Relays and hole-punching protocols are not here: they run *on top*, as
libp2p protocols over connections this network makes.
"""

from __future__ import annotations

import enum
import ipaddress
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio
from libp2p.transport.exceptions import OpenConnectionError

from .links import Capacity, Direction, LinkProfile, Serializer
from .nat import NatBox, NatType
from .pipe import Endpoint, Pipe, SimStream
from .wakeups import DEFAULT_TICK, Wakeups

DEFAULT_PORT = 4001
LAN_PROFILE = LinkProfile(latency=0.0005)


class DialOutcome(enum.Enum):
    DIRECT = "direct"  # to a public node
    NAT_MAPPING = "nat-mapping"  # through the target's NAT, by a mapping its filter admitted
    LAN = "lan"  # two nodes behind the same NAT, private addresses
    DROPPED = "dropped"  # SYN never answered (filtered, unroutable, partitioned): timed out
    REFUSED = "refused"  # nobody listening there (crashed node, wrong port, stale mapping)


CONNECTED = (DialOutcome.DIRECT, DialOutcome.NAT_MAPPING, DialOutcome.LAN)


@dataclass
class DialRecord:
    """One connection attempt, for reports."""

    at: float
    source: str
    target: Endpoint
    target_node: str | None
    outcome: DialOutcome


@dataclass(eq=False)
class Interface:
    """One node's attachment to the network."""

    name: str
    ip: str
    nat: NatBox | None
    profile: LinkProfile
    capacity: Capacity
    port: int = DEFAULT_PORT
    up: bool = True
    uplink: Serializer = field(init=False)
    downlink: Serializer = field(init=False)

    def __post_init__(self) -> None:
        self.uplink = Serializer(self.capacity.upload)
        self.downlink = Serializer(self.capacity.download)

    @property
    def endpoint(self) -> Endpoint:
        return (self.ip, self.port)

    @property
    def nat_type(self) -> NatType:
        return NatType.PUBLIC if self.nat is None else self.nat.nat_type


@dataclass(eq=False)
class _Connection:
    a: Interface
    b: Interface
    end_a: SimStream
    end_b: SimStream

    @property
    def open(self) -> bool:
        return not (self.end_a.closed and self.end_b.closed)

    def reset(self, reason: str) -> None:
        self.end_a.reset(reason)
        self.end_b.reset(reason)


@dataclass
class _Route:
    target: Interface
    source_seen: Endpoint  # the dialer's endpoint as the target sees it
    outcome: DialOutcome


@dataclass
class _NoRoute:
    outcome: DialOutcome
    blocked_by: NatBox | None = None  # a NAT filter that may open later


Accept = Callable[[SimStream], None]


class Network:
    """Every node, NAT box, path and live connection of one simulation."""

    def __init__(self, seed: int, *, syn_timeout: float = 5.0, tick: float = DEFAULT_TICK) -> None:
        self._rng = random.Random(seed)
        self.syn_timeout = syn_timeout
        self.wakeups = Wakeups(tick)  # wakes every pipe's readers; `tick` > 0: on a grid (see `wakeups`)
        self.dials: list[DialRecord] = []
        self.last_route: dict[tuple[str, str], DialOutcome] = {}  # (dialer, target node) -> how it got through
        self._by_ip: dict[str, Interface] = {}
        self._by_name: dict[str, Interface] = {}
        self._boxes: dict[str, NatBox] = {}
        self._behind: dict[int, list[Interface]] = {}  # id(box) -> the nodes attached behind it
        self._box_changed: dict[int, trio.lowlevel.ParkingLot] = {}
        self._listeners: dict[Endpoint, Accept] = {}
        self._paths: dict[tuple[str, str], LinkProfile] = {}
        self._side: dict[str, int] = {}
        self._connections: list[_Connection] = []
        self._public_hosts = 0

    # --- building ------------------------------------------------------------------------------

    def add_nat(self, nat_type: NatType) -> NatBox:
        """A new NAT box with its own public IP (in 100.64.0.0/10)."""
        ip = str(ipaddress.IPv4Address("100.64.0.1") + len(self._boxes))
        box = self._boxes[ip] = NatBox(ip, nat_type)
        self._box_changed[id(box)] = trio.lowlevel.ParkingLot()
        self._behind[id(box)] = []
        return box

    def attach(
        self,
        name: str,
        *,
        nat: NatBox | None = None,
        profile: LinkProfile = LinkProfile(),
        capacity: Capacity = Capacity(),
    ) -> Interface:
        """Attach a node: public (a 1.0.0.0/8 address, one /24 each) or behind `nat` (a 10.x address of that LAN).

        One /24 per public node, as on the internet: py-libp2p's Kademlia keeps at most two peers
        of one /24 in a bucket, so packed addresses would starve every routing table."""
        if name in self._by_name:
            raise ValueError(f"a node named {name!r} is already attached")
        if nat is None:
            self._public_hosts += 1
            ip = str(ipaddress.IPv4Address("1.0.0.1") + (self._public_hosts << 8))
        else:
            box_index = int(ipaddress.IPv4Address(nat.public_ip)) - int(ipaddress.IPv4Address("100.64.0.1"))
            ip = str(ipaddress.IPv4Address("10.0.0.0") + (box_index << 8) + len(self._behind[id(nat)]) + 1)
        interface = Interface(name, ip, nat, profile, capacity)
        if nat is not None:
            self._behind[id(nat)].append(interface)
        self._by_ip[ip] = interface
        self._by_name[name] = interface
        return interface

    @property
    def nat_box_count(self) -> int:
        return len(self._boxes)

    def behind(self, box: NatBox) -> list[Interface]:
        """The nodes attached behind `box`."""
        return list(self._behind.get(id(box), ()))

    def interface(self, name: str) -> Interface:
        return self._by_name[name]

    def set_path(self, a: str, b: str, profile: LinkProfile) -> None:
        """Use `profile` for bytes from node `a` to node `b` (instead of their access links joined)."""
        self._paths[(a, b)] = profile

    # --- listening ------------------------------------------------------------------------------

    def listen(self, interface: Interface, port: int, accept: Accept) -> None:
        """Deliver connections to ``interface.ip:port`` to `accept` (which must not block)."""
        endpoint = (interface.ip, port)
        if endpoint in self._listeners:
            raise OpenConnectionError(f"{endpoint[0]}:{port} is already in use")
        self._listeners[endpoint] = accept

    def unlisten(self, interface: Interface, port: int) -> None:
        self._listeners.pop((interface.ip, port), None)

    # --- faults ---------------------------------------------------------------------------------

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the network: nodes in different groups (unlisted ones form one more) cannot talk.

        Connections that cross the new boundary are reset.
        """
        self._side = {name: index for index, group in enumerate(groups, start=1) for name in group}
        for connection in self._live_connections():
            if not self._can_talk(connection.a, connection.b):
                connection.reset("partitioned")

    def heal(self) -> None:
        """Remove every partition (connections that were reset stay reset)."""
        self._side = {}

    def crash(self, interface: Interface) -> None:
        """The node vanishes: it stops listening, its connections are reset; `recover` brings it back."""
        interface.up = False
        # Its listeners go with it: the host's own close may not get to them before a restart.
        for endpoint in [endpoint for endpoint in self._listeners if endpoint[0] == interface.ip]:
            del self._listeners[endpoint]
        for connection in self._live_connections():
            if interface in (connection.a, connection.b):
                connection.reset(f"{interface.name} crashed")

    def recover(self, interface: Interface) -> None:
        interface.up = True

    def connections_of(self, interface: Interface) -> int:
        return sum(1 for c in self._live_connections() if interface in (c.a, c.b))

    # --- connecting -----------------------------------------------------------------------------

    async def connect(self, source: Interface, target: Endpoint) -> SimStream:
        """Open a connection from `source` to `target`; raises `OpenConnectionError` (refused, timed out)."""
        deadline = trio.current_time() + self.syn_timeout
        while True:
            if not source.up:
                raise OpenConnectionError(f"{source.name} is down")
            route = self._route(source, target)
            if isinstance(route, _Route):
                break
            if route.outcome is DialOutcome.REFUSED or trio.current_time() >= deadline:
                return await self._fail(source, target, route.outcome)
            lot = self._box_changed[id(route.blocked_by)] if route.blocked_by is not None else None
            with trio.move_on_at(deadline):
                await (lot.park() if lot is not None else trio.sleep_forever())
        return await self._open(source, route, target)

    async def _fail(self, source: Interface, target: Endpoint, outcome: DialOutcome) -> SimStream:
        if outcome is DialOutcome.REFUSED:
            await trio.sleep(2 * source.profile.latency)  # the reset takes a round trip
        self.dials.append(DialRecord(trio.current_time(), source.name, target, self._owner(target), outcome))
        raise OpenConnectionError(f"{source.name} -> {target[0]}:{target[1]}: {outcome.value}")

    async def _open(self, source: Interface, route: _Route, target: Endpoint) -> SimStream:
        forward = self._direction(source, route.target)
        backward = self._direction(route.target, source)
        a_to_b, b_to_a = Pipe(forward, self.wakeups), Pipe(backward, self.wakeups)
        end_a = SimStream(a_to_b, b_to_a, local=source.endpoint, remote=target)
        end_b = SimStream(b_to_a, a_to_b, local=route.target.endpoint, remote=route.source_seen)
        connection = _Connection(source, route.target, end_a, end_b)
        self._connections.append(connection)
        await trio.sleep(forward.profile.latency)  # SYN
        accept = self._listeners.get(route.target.endpoint)
        if accept is None or not route.target.up or not self._can_talk(source, route.target):
            connection.reset("refused")  # both ends, or it would stay among the live connections
            return await self._fail(source, target, DialOutcome.REFUSED)
        accept(end_b)
        await trio.sleep(backward.profile.latency)  # SYN-ACK
        self.dials.append(DialRecord(trio.current_time(), source.name, target, route.target.name, route.outcome))
        self.last_route[(source.name, route.target.name)] = route.outcome
        return end_a

    def _route(self, source: Interface, target: Endpoint) -> _Route | _NoRoute:
        ip, port = target
        node, box = self._by_ip.get(ip), self._boxes.get(ip)
        if node is None and box is None:
            return _NoRoute(DialOutcome.DROPPED)
        if box is not None and box is source.nat:
            return _NoRoute(DialOutcome.DROPPED)  # no hairpinning
        if node is not None and node.nat is not None:
            if node.nat is not source.nat:
                return _NoRoute(DialOutcome.DROPPED)  # a private address of another LAN
            return self._checked(source, _Route(node, source.endpoint, DialOutcome.LAN), port)
        seen = self._translate(source, target)
        if node is not None:
            return self._checked(source, _Route(node, seen, DialOutcome.DIRECT), port)
        assert box is not None
        inside = box.inbound(port, seen)
        if inside is None:
            return _NoRoute(DialOutcome.DROPPED, blocked_by=box)
        return self._checked(source, _Route(self._by_ip[inside[0]], seen, DialOutcome.NAT_MAPPING), inside[1])

    def _translate(self, source: Interface, target: Endpoint) -> Endpoint:
        """The dialer's endpoint as the world sees it; wakes SYNs waiting on its NAT if that opened a filter."""
        if source.nat is None:
            return source.endpoint
        version = source.nat.version
        seen = source.nat.outbound(source.endpoint, target)
        if source.nat.version != version:
            self._box_changed[id(source.nat)].unpark_all()
        return seen

    def _checked(self, source: Interface, route: _Route, port: int) -> _Route | _NoRoute:
        if not self._can_talk(source, route.target):
            return _NoRoute(DialOutcome.DROPPED)
        if not route.target.up or port != route.target.port:
            return _NoRoute(DialOutcome.REFUSED)
        return route

    def _direction(self, sender: Interface, receiver: Interface) -> Direction:
        if sender.nat is not None and sender.nat is receiver.nat:
            profile = LAN_PROFILE
        else:
            profile = self._paths.get((sender.name, receiver.name)) or sender.profile.joined(receiver.profile)
        rng = random.Random(self._rng.getrandbits(64))
        return Direction(profile, rng, uplink=sender.uplink, downlink=receiver.downlink)

    def _can_talk(self, a: Interface, b: Interface) -> bool:
        return self._side.get(a.name, 0) == self._side.get(b.name, 0)

    def _owner(self, target: Endpoint) -> str | None:
        """The node an address leads to, if any (a NAT's port: whoever it is mapped to)."""
        box = self._boxes.get(target[0])
        inside = box.inside_of(target[1]) if box is not None else target
        node = self._by_ip.get(inside[0]) if inside is not None else None
        return node.name if node is not None else None

    def _live_connections(self) -> list[_Connection]:
        self._connections = [c for c in self._connections if c.open]
        return self._connections
