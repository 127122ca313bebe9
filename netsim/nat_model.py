"""The NAT model's pair questions, answered by replaying the routing rules on a fresh topology.

Theory of operation. A node's `Attachment` is the chain of NAT boxes between
it and the internet, innermost first (none: public), and optionally its
address on its LAN (two LANs may use the same one). A `NatType` is shorthand
for one box of that type with its default port allocation. Two nodes may
*share* their outermost boxes: ``shared=1`` puts both behind one CGNAT
(their own home boxes, if any, below it); sharing every box puts them on one
LAN.

Each question builds that topology from scratch (`_World`: fresh `NatBox`es
in a fresh `AddressPlan`, plus a public observer, the relay both sides talked
to first, whose view of each side is that side's *observed address*) and
routes SYNs through it with `netsim.addressing`, so the verdicts follow from
the very rules the simulated network applies:

* `reachable(dialer, target)`: a plain dial to the target's observed address
  connects (no help from the target);
* `listen_dial_reaches(dialer, target)`: a dial to the target's listen address
  (in its peer record) reaches the target, not nobody and not the dialer
  itself (identical private addresses);
* `hole_punch_succeeds(a, b)`: after both talked to the observer, dials to
  each other's observed addresses at about the same time connect (one SYN
  admitted suffices: it meets a socket in SYN-SENT; TCP simultaneous open).
  That is the punch done right, at the observed *mappings*; a puncher that
  dials <observed ip>:<listen port> instead misses every box that remapped
  its port;
* `best_path` names the first path that works from the dialer: ``direct``,
  ``lan``, ``punch`` or ``relay``. It is not symmetric: a host in a home
  behind a CGNAT reaches a host right behind that CGNAT at its listen
  address, not the other way round. `direct_possible` is the verdict a
  report compares outcomes with ("pairs the model says can go direct"): a
  path other than the relay from either side (py-libp2p's hole puncher
  first dials the peer's known addresses itself, from whichever side runs
  it); `pair_verdict` says which.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from .addressing import AddressPlan, Delivered, Realm
from .nat import Endpoint, NatBox, NatType, PortAllocation

_OBSERVER: Endpoint = ("198.51.100.1", 4001)
_LISTEN_PORT = 4001


@dataclass(frozen=True)
class BoxSpec:
    """One NAT box of an attachment: its type and, if not the type's default, how it picks ports."""

    nat_type: NatType
    ports: PortAllocation | None = None


@dataclass(frozen=True)
class Attachment:
    """How a node reaches the internet: its boxes, innermost first (empty: public), and maybe its LAN address."""

    boxes: tuple[BoxSpec, ...] = ()
    private_ip: str | None = None


Shape = NatType | Attachment


def attachment(shape: Shape) -> Attachment:
    """`shape` as an `Attachment` (a NatType: one box of that type, or none for PUBLIC)."""
    if isinstance(shape, Attachment):
        return shape
    return Attachment(() if shape is NatType.PUBLIC else (BoxSpec(shape),))


@dataclass(eq=False)
class _Host:
    name: str
    endpoint: Endpoint
    realm: Realm


class _World:
    """A fresh topology: the observer on the internet, and hosts "a" and "b" behind their boxes."""

    def __init__(self, a: Shape, b: Shape, shared: int) -> None:
        self.plan = AddressPlan()
        self._boxes = 0
        first, second = attachment(a), attachment(b)
        if not 0 <= shared <= min(len(first.boxes), len(second.boxes)):
            raise ValueError(f"cannot share {shared} boxes: the chains have {len(first.boxes)} and {len(second.boxes)}")
        if shared and first.boxes[-shared:] != second.boxes[-shared:]:
            raise ValueError("shared boxes must be alike in both attachments")
        observer = _Host("observer", _OBSERVER, self.plan.internet)
        self.plan.internet.place(_OBSERVER[0], observer)
        realms_a = self._chain(first, [])
        self.a = self._host("a", first, realms_a[0])
        self.b = self._host("b", second, self._chain(second, realms_a[len(realms_a) - shared:])[0])

    def _chain(self, shape: Attachment, shared_realms: list[Realm]) -> list[Realm]:
        """The realms behind each box of `shape`, innermost first, reusing `shared_realms` for the outermost."""
        realms = list(shared_realms)
        own = shape.boxes[: len(shape.boxes) - len(shared_realms)]
        for index in reversed(range(len(own))):
            outer = realms[0] if realms else self.plan.internet
            innermost = index == 0
            realms.insert(0, self._box(own[index], outer, shape.private_ip if innermost else None))
        return realms or [self.plan.internet]

    def _box(self, spec: BoxSpec, outer: Realm, private_ip: str | None) -> Realm:
        self._boxes += 1
        ip = f"203.0.113.{self._boxes}" if outer is self.plan.internet else outer.next_address()
        box = NatBox(ip, spec.nat_type, ports=spec.ports, seed=self._boxes)
        subnet = f"10.0.{self._boxes}.0/24"
        if private_ip is not None:
            subnet = str(ipaddress.IPv4Network(f"{private_ip}/24", strict=False))
        return self.plan.add_box(box, outer=outer, subnet=subnet)

    def _host(self, name: str, shape: Attachment, realm: Realm) -> _Host:
        if realm is self.plan.internet:
            ip = f"192.0.2.{1 + len(realm.occupants)}"
        else:
            ip = shape.private_ip or realm.next_address()
        host = _Host(name, (ip, _LISTEN_PORT), realm)
        realm.place(ip, host)
        return host

    def send(self, source: _Host, target: Endpoint) -> _Host | None:
        """The host a SYN from `source` to `target` reaches (at its listen port), or None."""
        found = self.plan.route(source.realm, source.endpoint, target)
        if isinstance(found, Delivered) and found.port == found.host.endpoint[1]:
            return found.host
        return None

    def observed(self, host: _Host) -> Endpoint:
        """`host`'s endpoint as the observer sees it (and every box on the way now maps it)."""
        found = self.plan.route(host.realm, host.endpoint, _OBSERVER)
        assert isinstance(found, Delivered)
        return found.seen


def reachable(dialer: Shape, target: Shape, *, shared: int = 0) -> bool:
    """Can `dialer` open a connection to the address the observer saw for `target` (no help from target)?"""
    world = _World(dialer, target, shared)
    world.observed(world.a)
    seen_target = world.observed(world.b)
    return world.send(world.a, seen_target) is world.b


def listen_dial_reaches(dialer: Shape, target: Shape, *, shared: int = 0) -> bool:
    """Does a dial to `target`'s listen address (its LAN address) reach `target`, not nobody, not the dialer?"""
    world = _World(dialer, target, shared)
    return world.send(world.a, world.b.endpoint) is world.b


def hole_punch_succeeds(a: Shape, b: Shape, *, shared: int = 0) -> bool:
    """Do simultaneous dials to each other's observed addresses connect (TCP simultaneous open)?

    Both sides first talk to the observer (that is how each learns the
    other's address), then each sends to the address the observer saw for the
    other; the first SYN is sent again after the second (TCP retransmits), so
    the order of the two does not matter. One admitted SYN suffices.
    """
    world = _World(a, b, shared)
    seen_a, seen_b = world.observed(world.a), world.observed(world.b)
    first = world.send(world.a, seen_b) is world.b
    second = world.send(world.b, seen_a) is world.a
    return first or second or world.send(world.a, seen_b) is world.b


@functools.lru_cache(maxsize=1024)
def best_path(dialer: Shape, target: Shape, *, shared: int = 0) -> str:
    """The model's best path from `dialer` to `target`: "direct", "lan", "punch" or "relay"."""
    if reachable(dialer, target, shared=shared):
        return "direct"
    if listen_dial_reaches(dialer, target, shared=shared):
        return "lan"
    return "punch" if hole_punch_succeeds(dialer, target, shared=shared) else "relay"


def direct_possible(a: Shape, b: Shape, *, shared: int = 0) -> bool:
    """Can the pair end up directly connected: a dial from either side to an address of the other's peer
    record (observed or listen address; hole punchers also try the peer's known addresses on their own),
    or a punch?"""
    return best_path(a, b, shared=shared) != "relay" or best_path(b, a, shared=shared) != "relay"


def pair_verdict(dialer: Shape, target: Shape, *, shared: int = 0) -> str:
    """The model's word on a pair, for reports: the dialer's best path, else the target's towards the
    dialer ("lan from the target"), else "relay"."""
    forward = best_path(dialer, target, shared=shared)
    if forward != "relay":
        return forward
    backward = best_path(target, dialer, shared=shared)
    return "relay" if backward == "relay" else f"{backward} from the target"
