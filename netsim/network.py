"""The simulated internet: address space, routing through NAT boxes, partitions, crashes.

A `Network` owns every `Interface` (one per simulated node: its IP, its
listening port, the NAT box it sits behind if any, its access link and
capacity), every `NatBox`, and the `AddressPlan` that says which address is
whose in which realm (the internet, or the inside of a box; boxes may sit
behind boxes: a home router behind a carrier-grade NAT). A connection
attempt (`connect`) is routed in one step at the connection level, which is
all TCP hole punching and NAT filtering need; `AddressPlan.route` has the
rules (read `netsim.addressing` first), this adds liveness and partitions:

=========================  ===============================================  ==================
target address             rule                                             outcome
=========================  ===============================================  ==================
a public node              translate the source through the dialer's NATs   ``direct``
a NAT's outside ip:port    source translated, then the target box filters   ``nat-mapping`` or
                           (`NatBox.inbound`)                               SYN dropped
an address of a realm the  the node there (one's own address: oneself;     ``lan``
dialer is in or behind     a CGNAT's inside reached from a home LAN)
a private address of       not routed on the internet                       SYN dropped
another LAN
the dialer's own NAT       no hairpinning (a shared CGNAT's too)            SYN dropped
unknown address            nobody there                                     SYN dropped
across a partition         packets lost                                     SYN dropped
a node that is down, or    the host answers with a reset                    refused after 1 RTT
not listening on the port
=========================  ===============================================  ==================

A dropped SYN is retried, as TCP does, until `syn_timeout` (virtual seconds)
has passed; a SYN dropped by a NAT's filter is re-examined each time that box
opens a new flow, so two nodes dialling each other's mapped addresses at
about the same time get through when their NAT types allow it. Dials leave
from the node's listening port, so a SYN that reaches a node that is itself
dialling the SYN's source (its dial not answered yet) joins that dial: TCP
simultaneous open, one connection whose two ends are the two `connect`
calls, and no listener hears of it (DCUtR relies on this: its initiator
upgrades its dial as the responder). Otherwise the listener accepts. Not
modelled: a second dial on the same endpoint pair (a real kernel refuses it,
EADDRINUSE); here it is one more connection. Every attempt is logged in
`dials` as a `DialRecord`, which is what reports are built from.

Addresses: public nodes get 1.x.y.1 and boxes on the internet 2.x.y.1 (one
/24 each, and global: node code rightly ignores private and shared
addresses, such as a CGNAT's 100.64.0.0/10, as ones to advertise); a box
behind another box, and a node behind a box, gets the next free address of
that box's subnet (10.0.0.0 + index/24 unless `add_nat` names one, e.g.
100.64.0.0/24 for a CGNAT), or the address `attach` names, so two LANs can
be given the same addresses.

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

from .addressing import DIRECT, LAN, AddressPlan, Delivered
from .links import Capacity, Direction, LinkProfile, Serializer
from .nat import NatBox, NatType, PortAllocation
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
    port: int  # the port at the target
    source_seen: Endpoint  # the dialer's endpoint as the target sees it
    outcome: DialOutcome


@dataclass(eq=False)
class _SynSent:
    """A dial in progress (TCP's SYN-SENT): a SYN from the endpoint it dials, to its port, joins it."""

    source: Interface
    target: Endpoint
    joined: tuple[SimStream, str, DialOutcome] | None = None  # its end, the peer's name, how the SYN came
    wait: trio.CancelScope | None = None  # while it waits to resend its SYN; cancelled when joined


@dataclass
class _NoRoute:
    outcome: DialOutcome
    blocked_by: NatBox | None = None  # a NAT filter that may open later


Accept = Callable[[SimStream], None]


class Network:
    """Every node, NAT box, path and live connection of one simulation."""

    def __init__(self, seed: int, *, syn_timeout: float = 5.0, tick: float = DEFAULT_TICK) -> None:
        self._seed = seed
        self._rng = random.Random(seed)
        self.syn_timeout = syn_timeout
        self.wakeups = Wakeups(tick)  # wakes every pipe's readers; `tick` > 0: on a grid (see `wakeups`)
        self.dials: list[DialRecord] = []
        self.last_route: dict[tuple[str, str], DialOutcome] = {}  # (dialer, target node) -> how it got through
        self.plan = AddressPlan()
        self._by_name: dict[str, Interface] = {}
        self._boxes: list[NatBox] = []
        self._behind: dict[int, list[Interface]] = {}  # id(box) -> the nodes attached behind it
        self._box_changed: dict[int, trio.lowlevel.ParkingLot] = {}
        self._listeners: dict[tuple[str, int], Accept] = {}  # (node name, port) -> accept
        self._syn_sent: dict[tuple[str, Endpoint], list[_SynSent]] = {}  # (node name, dialled endpoint) -> dials
        self._paths: dict[tuple[str, str], LinkProfile] = {}
        self._side: dict[str, int] = {}
        self._connections: list[_Connection] = []
        self._public_hosts = 0

    # --- building ------------------------------------------------------------------------------

    def add_nat(
        self,
        nat_type: NatType,
        *,
        behind: NatBox | None = None,
        ports: PortAllocation | None = None,
        subnet: str | None = None,
    ) -> NatBox:
        """A new NAT box: on the internet (its own public address), or `behind` another box (a CGNAT).

        `ports` overrides the type's port allocation (`netsim.nat`); `subnet` is the LAN behind it
        (default 10.0.0.0 + index/24). Two boxes may be given the same subnet: identical private LANs."""
        index = len(self._boxes)
        if behind is None:
            outer, ip = self.plan.internet, str(ipaddress.IPv4Address("2.0.0.1") + (index << 8))
        else:
            outer = self.plan.inside(behind)
            ip = outer.next_address()
        seed = random.Random(f"{self._seed}/nat-ports/{index}").getrandbits(64)
        box = NatBox(ip, nat_type, ports=ports, seed=seed)
        default_subnet = f"{ipaddress.IPv4Address('10.0.0.0') + (index << 8)}/24"
        self.plan.add_box(box, outer=outer, subnet=subnet or default_subnet)
        self._boxes.append(box)
        self._box_changed[id(box)] = trio.lowlevel.ParkingLot()
        self._behind[id(box)] = []
        return box

    def attach(
        self,
        name: str,
        *,
        nat: NatBox | None = None,
        ip: str | None = None,
        profile: LinkProfile = LinkProfile(),
        capacity: Capacity = Capacity(),
    ) -> Interface:
        """Attach a node: public (a 1.0.0.0/8 address, one /24 each) or behind `nat` (the next address of its LAN,
        or `ip`: two LANs may use the same addresses).

        One /24 per public node, as on the internet: py-libp2p's Kademlia keeps at most two peers
        of one /24 in a bucket, so packed addresses would starve every routing table."""
        if name in self._by_name:
            raise ValueError(f"a node named {name!r} is already attached")
        realm = self.plan.realm_of(nat)
        if ip is None and nat is None:
            self._public_hosts += 1
            ip = str(ipaddress.IPv4Address("1.0.0.1") + (self._public_hosts << 8))
        elif ip is None:
            ip = realm.next_address()
        interface = Interface(name, ip, nat, profile, capacity)
        realm.place(ip, interface)
        if nat is not None:
            self._behind[id(nat)].append(interface)
        self._by_name[name] = interface
        return interface

    @property
    def nat_box_count(self) -> int:
        return len(self._boxes)

    def behind(self, box: NatBox) -> list[Interface]:
        """The nodes attached directly behind `box` (not those behind a box behind it)."""
        return list(self._behind.get(id(box), ()))

    def boxes_of(self, interface: Interface) -> list[NatBox]:
        """The NAT boxes between `interface` and the internet, innermost first (none for a public node)."""
        return self.plan.chain(self.plan.realm_of(interface.nat))

    def interface(self, name: str) -> Interface:
        return self._by_name[name]

    def set_path(self, a: str, b: str, profile: LinkProfile) -> None:
        """Use `profile` for bytes from node `a` to node `b` (instead of their access links joined)."""
        self._paths[(a, b)] = profile

    # --- listening ------------------------------------------------------------------------------

    def listen(self, interface: Interface, port: int, accept: Accept) -> None:
        """Deliver connections to ``interface.ip:port`` to `accept` (which must not block)."""
        key = (interface.name, port)
        if key in self._listeners:
            raise OpenConnectionError(f"{interface.ip}:{port} is already in use")
        self._listeners[key] = accept

    def unlisten(self, interface: Interface, port: int) -> None:
        self._listeners.pop((interface.name, port), None)

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
        for key in [key for key in self._listeners if key[0] == interface.name]:
            del self._listeners[key]
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
        dial = _SynSent(source, target)
        self._syn_sent.setdefault((source.name, target), []).append(dial)
        try:
            return await self._dial(dial)
        finally:
            dials = self._syn_sent[(source.name, target)]
            dials.remove(dial)
            if not dials:
                del self._syn_sent[(source.name, target)]

    async def _dial(self, dial: _SynSent) -> SimStream:
        """Send SYNs until one is routed (then `_open`), a crossing SYN joins this dial, or the dial fails."""
        source, target = dial.source, dial.target
        deadline = trio.current_time() + self.syn_timeout
        while True:
            if dial.joined is not None:
                return self._joined(dial)
            if not source.up:
                raise OpenConnectionError(f"{source.name} is down")
            route = self._route(source, target)
            if isinstance(route, _Route):
                break
            if route.outcome is DialOutcome.REFUSED or trio.current_time() >= deadline:
                return await self._fail(source, target, route.outcome)
            lot = self._box_changed[id(route.blocked_by)] if route.blocked_by is not None else None
            with trio.move_on_at(deadline) as dial.wait:
                await (lot.park() if lot is not None else trio.sleep_forever())
            dial.wait = None
        return await self._open(dial, route)

    async def _fail(self, source: Interface, target: Endpoint, outcome: DialOutcome) -> SimStream:
        if outcome is DialOutcome.REFUSED:
            await trio.sleep(2 * source.profile.latency)  # the reset takes a round trip
        self.dials.append(DialRecord(trio.current_time(), source.name, target, self._owner(source, target), outcome))
        raise OpenConnectionError(f"{source.name} -> {target[0]}:{target[1]}: {outcome.value}")

    async def _open(self, dial: _SynSent, route: _Route) -> SimStream:
        """The SYN travels; at the target it joins the target's own dial to us (simultaneous open) or its listener."""
        source, target = dial.source, dial.target
        forward = self._direction(source, route.target)
        backward = self._direction(route.target, source)
        a_to_b, b_to_a = Pipe(forward, self.wakeups), Pipe(backward, self.wakeups)
        end_a = SimStream(a_to_b, b_to_a, local=source.endpoint, remote=target)
        end_b = SimStream(b_to_a, a_to_b, local=route.target.endpoint, remote=route.source_seen)
        connection = _Connection(source, route.target, end_a, end_b)
        self._connections.append(connection)
        await trio.sleep(forward.profile.latency)  # SYN
        if dial.joined is not None:  # the target's SYN got here first: that made the connection
            connection.reset("crossed")
            return self._joined(dial)
        crossing = self._crossing(route, dial)
        accept = self._listeners.get((route.target.name, route.port))
        if not route.target.up or not self._can_talk(source, route.target) or (crossing is None and accept is None):
            connection.reset("refused")  # both ends, or it would stay among the live connections
            return await self._fail(source, target, DialOutcome.REFUSED)
        if crossing is None:
            accept(end_b)  # type: ignore[misc]  # not None: checked above
        else:
            dial.joined = (end_a, route.target.name, route.outcome)  # so that its crossing SYN joins nothing
            crossing.joined = (end_b, source.name, route.outcome)
            if crossing.wait is not None:
                crossing.wait.cancel()
        await trio.sleep(backward.profile.latency)  # SYN-ACK
        self.dials.append(DialRecord(trio.current_time(), source.name, target, route.target.name, route.outcome))
        self.last_route[(source.name, route.target.name)] = route.outcome
        return end_a

    def _crossing(self, route: _Route, ours: _SynSent) -> _SynSent | None:
        """The target's own dial, from the port our SYN reached, to the endpoint our SYN came from: TCP then
        opens one connection of the two SYNs (simultaneous open, what a hole punch needs), not a listener's.
        Not our own dial: a dial to one's own listen address reaches the listener (the handshake then fails)."""
        for dial in self._syn_sent.get((route.target.name, route.source_seen), ()):
            if dial is not ours and dial.joined is None and route.port == route.target.port:
                return dial
        return None

    def _joined(self, dial: _SynSent) -> SimStream:
        """Finish a dial that a crossing SYN joined: its end of that one connection."""
        assert dial.joined is not None
        end, peer, outcome = dial.joined
        self.dials.append(DialRecord(trio.current_time(), dial.source.name, dial.target, peer, outcome))
        self.last_route[(dial.source.name, peer)] = outcome
        return end

    def _route(self, source: Interface, target: Endpoint) -> _Route | _NoRoute:
        """Route a SYN by the address plan; wakes SYNs waiting on the dialer's NATs if it opened a filter."""
        realm = self.plan.realm_of(source.nat)
        boxes = self.plan.chain(realm)
        versions = [box.version for box in boxes]
        found = self.plan.route(realm, source.endpoint, target)
        for box, version in zip(boxes, versions):
            if box.version != version:
                self._box_changed[id(box)].unpark_all()
        if not isinstance(found, Delivered):
            return _NoRoute(DialOutcome.DROPPED, blocked_by=found.blocked_by)
        outcome = {LAN: DialOutcome.LAN, DIRECT: DialOutcome.DIRECT}.get(found.how, DialOutcome.NAT_MAPPING)
        return self._checked(source, _Route(found.host, found.port, found.seen, outcome))

    def _checked(self, source: Interface, route: _Route) -> _Route | _NoRoute:
        if not self._can_talk(source, route.target):
            return _NoRoute(DialOutcome.DROPPED)
        if not route.target.up or route.port != route.target.port:
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

    def _owner(self, source: Interface, target: Endpoint) -> str | None:
        """The node an address leads to from `source`, if any (a NAT's port: whoever it is mapped to)."""
        node = self.plan.resolve(self.plan.realm_of(source.nat), target)
        return node.name if isinstance(node, Interface) else None

    def _live_connections(self) -> list[_Connection]:
        self._connections = [c for c in self._connections if c.open]
        return self._connections
