"""NAT boxes, sans-IO: which outbound flows get which public endpoint, which inbound ones get in.

Theory of operation (RFC 4787 terms). A NAT has two independent behaviours:

* **Mapping**: when an inside endpoint (private ip, port) first sends to a
  remote endpoint, the NAT picks a public port for the flow. With
  *endpoint-independent mapping* (EIM) every flow from the same inside
  endpoint reuses one public port, whatever the destination; with
  *endpoint-dependent mapping* (EDM, the "symmetric" NAT) each destination
  endpoint gets a fresh port.
* **Filtering**: which inbound packets to a public port are let through to
  the inside endpoint it maps to. *Endpoint-independent* (full cone): anyone
  who knows the port. *Address-dependent* (restricted cone): only from an IP
  the inside endpoint has sent to. *Address-and-port-dependent*
  (port-restricted cone): only from an exact ip:port it has sent to.

The four classic NAT types are pairs of those (`NAT_BEHAVIOURS`), and the two
tables `MAPPING_KEY` and `FILTER_KEY` say, for each behaviour, which part of
the remote endpoint the NAT remembers. The whole NAT is then two dictionaries
(`NatBox`), with no clock and no I/O: the network calls `outbound` when a
node behind the box opens a connection and `inbound` when a connection
attempt arrives at the box's public address.

Public ports: an endpoint-independent box *preserves the port* (the public
port is the inside port while no other inside endpoint holds it), as Linux
masquerade and most home routers do, and as libp2p's hole puncher assumes when
it advertises <observed ip>:<listen port>; a taken port, and every flow of a
symmetric box, gets the next port in sequence from `FIRST_PUBLIC_PORT`, so a
symmetric NAT's next port is predictable only by counting.

Simplifications, on purpose: mappings live as long as the box (no idle
timeout; a crash of the box, `reset`, forgets them); no hairpinning (a
node cannot reach a neighbour through their shared NAT's public address).
Nodes open outbound connections from their listening port (as go-libp2p
does with SO_REUSEPORT), so with an EIM NAT the public endpoint a peer
observes leads back to the listener.

`reachable(dialer, target)` and `hole_punch_succeeds(a, b)` replay these
rules on fresh boxes to answer the classic questions for a pair of NAT types.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable

Endpoint = tuple[str, int]

FIRST_PUBLIC_PORT = 40000


class Mapping(enum.Enum):
    ENDPOINT_INDEPENDENT = "endpoint-independent"
    ENDPOINT_DEPENDENT = "endpoint-dependent"


class Filtering(enum.Enum):
    ENDPOINT_INDEPENDENT = "endpoint-independent"
    ADDRESS_DEPENDENT = "address-dependent"
    ADDRESS_AND_PORT_DEPENDENT = "address-and-port-dependent"


class NatType(enum.Enum):
    """How a node is attached. PUBLIC means no NAT at all."""

    PUBLIC = "public"
    FULL_CONE = "full-cone"
    RESTRICTED = "restricted"
    PORT_RESTRICTED = "port-restricted"
    SYMMETRIC = "symmetric"


NAT_BEHAVIOURS: dict[NatType, tuple[Mapping, Filtering]] = {
    NatType.FULL_CONE: (Mapping.ENDPOINT_INDEPENDENT, Filtering.ENDPOINT_INDEPENDENT),
    NatType.RESTRICTED: (Mapping.ENDPOINT_INDEPENDENT, Filtering.ADDRESS_DEPENDENT),
    NatType.PORT_RESTRICTED: (Mapping.ENDPOINT_INDEPENDENT, Filtering.ADDRESS_AND_PORT_DEPENDENT),
    NatType.SYMMETRIC: (Mapping.ENDPOINT_DEPENDENT, Filtering.ADDRESS_AND_PORT_DEPENDENT),
}

# Which part of the remote endpoint selects a mapping (None: the same for all remotes).
MAPPING_KEY: dict[Mapping, Callable[[Endpoint], Hashable]] = {
    Mapping.ENDPOINT_INDEPENDENT: lambda remote: None,
    Mapping.ENDPOINT_DEPENDENT: lambda remote: remote,
}

# Which part of the remote endpoint the filter remembers and an inbound packet must match.
FILTER_KEY: dict[Filtering, Callable[[Endpoint], Hashable]] = {
    Filtering.ENDPOINT_INDEPENDENT: lambda remote: None,
    Filtering.ADDRESS_DEPENDENT: lambda remote: remote[0],
    Filtering.ADDRESS_AND_PORT_DEPENDENT: lambda remote: remote,
}


class NatBox:
    """One NAT: a public IP, its mappings and its filters. Several nodes may sit behind it."""

    def __init__(self, public_ip: str, nat_type: NatType) -> None:
        if nat_type is NatType.PUBLIC:
            raise ValueError("a public node has no NAT box")
        self.public_ip = public_ip
        self.nat_type = nat_type
        self.mapping, self.filtering = NAT_BEHAVIOURS[nat_type]
        self.reset()

    def reset(self) -> None:
        """Forget every mapping (the box rebooted)."""
        self._ports: dict[tuple[Endpoint, Hashable], int] = {}
        self._inside: dict[int, Endpoint] = {}
        self._permits: dict[int, set[Hashable]] = {}
        self._next_port = FIRST_PUBLIC_PORT
        self.version = 0  # counts changes to mappings and filters: a dropped SYN may pass after one

    def outbound(self, inside: Endpoint, remote: Endpoint) -> Endpoint:
        """The public endpoint a flow from `inside` to `remote` leaves from; opens the filter for replies."""
        key = (inside, MAPPING_KEY[self.mapping](remote))
        port = self._ports.get(key)
        if port is None:
            port = self._ports[key] = self._public_port_for(inside)
            self._inside[port] = inside
            self._permits[port] = set()
        permits, permit = self._permits[port], FILTER_KEY[self.filtering](remote)
        if permit not in permits:
            permits.add(permit)
            self.version += 1
        return (self.public_ip, port)

    def _public_port_for(self, inside: Endpoint) -> int:
        """The inside port itself when this box preserves ports and it is free, else the next one."""
        if self.mapping is Mapping.ENDPOINT_INDEPENDENT and inside[1] not in self._inside:
            return inside[1]
        while self._next_port in self._inside:
            self._next_port += 1
        port, self._next_port = self._next_port, self._next_port + 1
        return port

    def inbound(self, public_port: int, remote: Endpoint) -> Endpoint | None:
        """The inside endpoint a packet from `remote` to `public_port` reaches, or None if dropped."""
        inside = self._inside.get(public_port)
        if inside is None:
            return None
        if FILTER_KEY[self.filtering](remote) not in self._permits[public_port]:
            return None
        return inside

    def inside_of(self, public_port: int) -> Endpoint | None:
        """The inside endpoint `public_port` maps to, filters aside (for reports)."""
        return self._inside.get(public_port)


# --- Pair questions, answered by replaying the rules on fresh boxes -----------------------------

_OBSERVER: Endpoint = ("198.51.100.1", 4001)  # a public peer both sides talked to first


def _attach(nat_type: NatType, public_ip: str, inside: Endpoint) -> tuple[NatBox | None, Endpoint]:
    """A fresh box (None for PUBLIC) and the endpoint the world saw when `inside` talked to the observer."""
    if nat_type is NatType.PUBLIC:
        return None, (public_ip, inside[1])
    box = NatBox(public_ip, nat_type)
    return box, box.outbound(inside, _OBSERVER)


def _send(box: NatBox | None, inside: Endpoint, public: Endpoint, remote: Endpoint) -> Endpoint:
    return public if box is None else box.outbound(inside, remote)


def _admits(box: NatBox | None, inside: Endpoint, target: Endpoint, source: Endpoint) -> bool:
    if box is None:
        return target == (target[0], inside[1])
    return box.inbound(target[1], source) == inside


def reachable(dialer: NatType, target: NatType) -> bool:
    """Can `dialer` open a connection to the address the observer saw for `target` (no help from target)?"""
    inside_a, inside_b = ("10.0.0.1", 4001), ("10.0.0.2", 4001)
    box_a, _ = _attach(dialer, "203.0.113.1", inside_a)
    box_b, seen_b = _attach(target, "203.0.113.2", inside_b)
    source = _send(box_a, inside_a, ("203.0.113.1", 4001), seen_b)
    return _admits(box_b, inside_b, seen_b, source)


def hole_punch_succeeds(a: NatType, b: NatType) -> bool:
    """Do simultaneous dials to each other's observed addresses connect (TCP simultaneous open)?

    Both sides first talk to a public observer (that is how each learns the
    other's address), then each sends to the address the observer saw for the
    other. One admitted direction suffices: the SYN that gets through meets a
    socket in SYN-SENT and the connection opens.
    """
    inside_a, inside_b = ("10.0.0.1", 4001), ("10.0.0.2", 4001)
    box_a, seen_a = _attach(a, "203.0.113.1", inside_a)
    box_b, seen_b = _attach(b, "203.0.113.2", inside_b)
    source_a = _send(box_a, inside_a, seen_a, seen_b)
    source_b = _send(box_b, inside_b, seen_b, seen_a)
    return _admits(box_b, inside_b, seen_b, source_a) or _admits(box_a, inside_a, seen_a, source_b)
