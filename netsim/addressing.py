"""Address realms and routing through NAT boxes, sans-IO: where a SYN sent to ip:port ends up.

Theory of operation. The internet is one *realm* (address space), and every
NAT box opens another, its inside. A host lives in exactly one realm; a box's
outside address lives in the realm above it: the internet, or the inside of
another box (a home router behind a carrier-grade NAT is such a box; a CGNAT
is a box several hosts and home routers share). Addresses are unique within
a realm only, so two home LANs may both use 192.168.30.2.

A SYN from a host to ``ip:port`` is routed hop by hop (`AddressPlan.route`):

1. *Up.* Look `ip` up in the current realm, at first the sender's own. If
   nothing there has it, the SYN leaves through the realm's box, which
   translates its source (`NatBox.outbound`), and the lookup repeats in the
   realm above. A SYN to the outside address of the box it is about to
   leave through is dropped: **no hairpinning** (`netsim.nat`). Nothing at
   `ip` on the internet: dropped (a private address of someone else's LAN
   ends here; its SYN still made a mapping on the way, as on a real router).
2. *Down.* Found a box's outside address: the box's filter admits the SYN to
   an inside endpoint (`NatBox.inbound`) or drops it; the lookup repeats in
   the box's realm with that endpoint, until it reaches a host.
3. *Delivered* to the host found. A host's own address in its realm is its
   own: dialling one's own listen address reaches oneself, as on a real host
   (py-libp2p then fails the security handshake on a peer-ID mismatch), and
   dialling a private address that another LAN also uses reaches whoever has
   it on *one's own* LAN, never the other LAN's host.

How it got there (`Delivered.how`): ``nat-mapping`` when it went down
through a box, ``direct`` when found on the internet, ``lan`` when found in a
realm behind a box (the sender's own LAN, or a CGNAT's inside it shares).
No clock and no I/O: the `Network` adds timing, partitions, crashes and
retransmissions; `netsim.nat_model` replays routes on fresh plans to answer
the pair questions.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from .nat import Endpoint, NatBox

LAN, DIRECT, NAT_MAPPING = "lan", "direct", "nat-mapping"


@dataclass(eq=False)
class Realm:
    """One address space: the internet (`box` None) or the inside of `box`, with what sits at each address."""

    box: NatBox | None
    outer: Realm | None  # the realm `box`'s outside address is in
    subnet: ipaddress.IPv4Network | None = None  # where `next_address` draws from
    occupants: dict[str, Any] = field(default_factory=dict)  # ip -> a host, or a NatBox (its outside address)

    def next_address(self) -> str:
        """The lowest free host address of `subnet`; ValueError when there is none."""
        if self.subnet is None:
            raise ValueError("this realm has no subnet to allocate from")
        for address in self.subnet.hosts():
            if str(address) not in self.occupants:
                return str(address)
        raise ValueError(f"no free address left in {self.subnet}")

    def place(self, ip: str, occupant: Any) -> None:
        """Put `occupant` at `ip`; ValueError if the address is taken in this realm."""
        if ip in self.occupants:
            raise ValueError(f"{ip} is already in use in this realm")
        self.occupants[ip] = occupant


@dataclass(frozen=True)
class Delivered:
    host: Any
    port: int  # the port at the host
    seen: Endpoint  # the sender's endpoint as the host sees it
    how: str  # LAN, DIRECT or NAT_MAPPING


@dataclass(frozen=True)
class Dropped:
    blocked_by: NatBox | None = None  # the box whose filter dropped it (it may admit a later SYN)


class AddressPlan:
    """Every realm, host and box of one network, and the routing rule of the module docstring."""

    def __init__(self) -> None:
        self.internet = Realm(None, None)
        self._inside: dict[int, Realm] = {}  # id(box) -> the realm behind it

    def add_box(self, box: NatBox, *, outer: Realm, subnet: str) -> Realm:
        """Place `box`'s outside address (`box.public_ip`) in `outer`; returns the new realm behind it."""
        outer.place(box.public_ip, box)
        realm = self._inside[id(box)] = Realm(box, outer, ipaddress.IPv4Network(subnet))
        return realm

    def inside(self, box: NatBox) -> Realm:
        return self._inside[id(box)]

    def realm_of(self, box: NatBox | None) -> Realm:
        """The realm behind `box`; the internet for None."""
        return self.internet if box is None else self._inside[id(box)]

    def route(self, realm: Realm, source: Endpoint, target: Endpoint) -> Delivered | Dropped:
        """Where a SYN from `source` (in `realm`) to `target` ends up; NAT boxes on the way update their tables."""
        ip, port = target
        seen = source
        while (occupant := realm.occupants.get(ip)) is None:
            box, outer = realm.box, realm.outer
            if box is None or outer is None:
                return Dropped()  # nobody has that address on the internet
            if outer.occupants.get(ip) is box:
                return Dropped()  # to the box's own outside address: no hairpinning
            seen = box.outbound(seen, target)
            realm = outer
        went_down = False
        while isinstance(occupant, NatBox):
            inside = occupant.inbound(port, seen)
            if inside is None:
                return Dropped(blocked_by=occupant)
            realm, (ip, port), went_down = self.inside(occupant), inside, True
            occupant = realm.occupants.get(ip)
            if occupant is None:
                return Dropped()
        how = NAT_MAPPING if went_down else (DIRECT if realm is self.internet else LAN)
        return Delivered(occupant, port, seen, how)

    def resolve(self, realm: Realm, target: Endpoint) -> Any | None:
        """The host a SYN to `target` from `realm` would be meant for, filters aside and nothing changed (reports)."""
        ip, port = target
        while (occupant := realm.occupants.get(ip)) is None:
            if realm.outer is None or realm.outer.occupants.get(ip) is realm.box:
                return None
            realm = realm.outer
        while isinstance(occupant, NatBox):
            inside = occupant.inside_of(port)
            if inside is None:
                return None
            (ip, port), realm = inside, self.inside(occupant)
            occupant = realm.occupants.get(ip)
        return occupant

    def chain(self, realm: Realm) -> list[NatBox]:
        """The boxes between `realm` and the internet, innermost first."""
        boxes = []
        while realm.box is not None and realm.outer is not None:
            boxes.append(realm.box)
            realm = realm.outer
        return boxes
