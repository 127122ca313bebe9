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
(`NatBox`), with no clock and no I/O: whoever routes packets calls `outbound`
when an endpoint behind the box opens a flow and `inbound` when a packet
arrives at the box's public address (`netsim.addressing` does, for the
`Network`).

Public ports (`PortAllocation`), a third behaviour, independent of the other
two:

* ``preserve`` (the default for EIM boxes): the public port is the inside
  port while no other inside endpoint holds it, as Linux masquerade and most
  home routers do, and as py-libp2p's hole puncher assumes when it advertises
  <observed ip>:<listen port>. A port already taken (two hosts behind one box
  both listening on 4001: the second is *remapped*) gets the next port in
  sequence from `FIRST_PUBLIC_PORT`.
* ``sequential`` (the default for symmetric boxes): every new mapping takes
  the next free port from `FIRST_PUBLIC_PORT`, never the inside port; a
  symmetric NAT's next port is then predictable only by counting.
* ``random``: every new mapping takes a port drawn from the box's seeded
  generator in [`RANDOM_PORTS`], never the inside port: an EIM box "without
  port preservation", as many carrier-grade NATs and some home routers are.
  Only the port a peer *observed* leads back in.

Where boxes sit is not the box's business: a box has one outside address,
and may itself sit behind another box (a home router behind a carrier-grade
NAT, CGNAT, is double NAT; a CGNAT is simply a box that several hosts and
home routers share, so they all have its outside address and collide on
ports). `netsim.addressing` keeps the address spaces and routes through
the boxes.

Simplifications, on purpose: mappings live as long as the box (no idle
timeout; a crash of the box, `reset`, forgets them); **no hairpinning**
(a host cannot reach a neighbour behind the same box at their shared public
address, not even through a CGNAT they share: the packet is dropped, as by
most CGNATs and many home routers; they reach each other only at addresses
of the realm they share). Nodes open outbound connections from their
listening port (as go-libp2p does with SO_REUSEPORT), so with an EIM box the
public endpoint a peer observes leads back to the listener.

The pair questions (can A dial B, does a hole punch work, for given chains
of boxes) replay these rules on fresh boxes: `netsim.nat_model`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Hashable

Endpoint = tuple[str, int]

FIRST_PUBLIC_PORT = 40000
RANDOM_PORTS = (1024, 65535)  # inclusive: where a `random` box draws its public ports


class Mapping(enum.Enum):
    ENDPOINT_INDEPENDENT = "endpoint-independent"
    ENDPOINT_DEPENDENT = "endpoint-dependent"


class Filtering(enum.Enum):
    ENDPOINT_INDEPENDENT = "endpoint-independent"
    ADDRESS_DEPENDENT = "address-dependent"
    ADDRESS_AND_PORT_DEPENDENT = "address-and-port-dependent"


class PortAllocation(enum.Enum):
    """How a box picks the public port of a new mapping (see the module docstring)."""

    PRESERVE = "preserve"
    SEQUENTIAL = "sequential"
    RANDOM = "random"


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


def default_ports(nat_type: NatType) -> PortAllocation:
    """The port allocation a box of `nat_type` gets unless told otherwise: EIM preserves, EDM counts."""
    mapping, _ = NAT_BEHAVIOURS[nat_type]
    return PortAllocation.PRESERVE if mapping is Mapping.ENDPOINT_INDEPENDENT else PortAllocation.SEQUENTIAL


class NatBox:
    """One NAT: a public IP, its mappings and its filters. Several nodes (and boxes) may sit behind it."""

    def __init__(
        self, public_ip: str, nat_type: NatType, *, ports: PortAllocation | None = None, seed: int = 0
    ) -> None:
        if nat_type is NatType.PUBLIC:
            raise ValueError("a public node has no NAT box")
        self.public_ip = public_ip
        self.nat_type = nat_type
        self.mapping, self.filtering = NAT_BEHAVIOURS[nat_type]
        self.ports = ports or default_ports(nat_type)
        self._rng = random.Random(seed)  # draws the ports of a `random` box; not reseeded by `reset`
        self.reset()

    @property
    def label(self) -> str:
        """The NAT type, and the port allocation when it is not the type's default (for reports)."""
        if self.ports is default_ports(self.nat_type):
            return self.nat_type.value
        return f"{self.nat_type.value}/{self.ports.value}"

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
        """A free public port for a new mapping of `inside`, by this box's `PortAllocation`."""
        if self.ports is PortAllocation.PRESERVE and inside[1] not in self._inside:
            return inside[1]
        if self.ports is PortAllocation.RANDOM:
            return self._random_port(avoid=inside[1])
        while self._next_port in self._inside or self._next_port == inside[1]:
            self._next_port += 1
        port, self._next_port = self._next_port, self._next_port + 1
        return port

    def _random_port(self, *, avoid: int) -> int:
        low, high = RANDOM_PORTS
        if len(self._inside) >= high - low:
            raise RuntimeError(f"NAT {self.public_ip} has no free port left")
        while True:
            port = self._rng.randint(low, high)
            if port != avoid and port not in self._inside:
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
