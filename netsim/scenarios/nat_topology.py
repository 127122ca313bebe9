"""Who sits where in scenario `nat`: kinds of attachment, and the topologies that mix them.

A `Kind` is how one node reaches the internet: its chain of NAT boxes
(`netsim.nat_model.Attachment`, innermost first), its label in reports, and
whether the outermost box is one of the topology's *shared* carrier-grade
NATs. Topologies (`TOPOLOGIES`, the scenario's ``topology`` option):

* ``homes``: public nodes and one home box per node, of each classic type
  (full cone, restricted, port-restricted, symmetric), ports preserved
  where the box maps endpoint-independently. What the scenario always ran.
* ``cgnat``: what broke behind a carrier-grade NAT (issue #25). Every home
  LAN is 192.168.30.0/24 and every home host is 192.168.30.2:4001, so a dial
  to another home's listen address reaches the dialer's own LAN (itself).
  Kinds: public; ``port-restricted`` home; ``symmetric`` home;
  ``port-restricted/random``, a home box that maps endpoint-independently
  without preserving ports; ``cgnat``, a host right behind a shared CGNAT
  (100.64.0.0/24 inside, port-restricted, ports preserved while free: the
  first host on 4001 keeps it, the others are remapped); and
  ``home+cgnat``, a port-restricted home box behind a shared CGNAT (double
  NAT). Nodes of the two CGNAT kinds are spread over `Config.cgnats` CGNATs,
  so some pairs share one (no hairpinning between them) and some do not.

`place` puts a node of a kind into the network; `shared_boxes` counts the
outermost boxes two placed nodes share, which with their kinds is what
`netsim.nat_model` needs for its verdict on the pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..nat import NatBox, NatType, PortAllocation
from ..nat_model import Attachment, BoxSpec, attachment
from ..network import Interface, Network

HOME_SUBNET, HOME_HOST = "192.168.30.0/24", "192.168.30.2"
CGNAT_SUBNET = "100.64.0.0/24"  # RFC 6598 shared address space, as carriers use inside a CGNAT
CGNAT_BOX = BoxSpec(NatType.PORT_RESTRICTED, PortAllocation.PRESERVE)


@dataclass(frozen=True)
class Kind:
    label: str
    attachment: Attachment
    behind_cgnat: bool = False  # the outermost box is a CGNAT shared with other nodes

    @property
    def nat_type(self) -> NatType:
        """The type of the node's own (innermost) box; PUBLIC without one."""
        boxes = self.attachment.boxes
        return boxes[0].nat_type if boxes else NatType.PUBLIC


def _home(nat_type: NatType, ports: PortAllocation | None = None, *, label: str | None = None) -> Kind:
    shape = Attachment((BoxSpec(nat_type, ports),), private_ip=HOME_HOST)
    return Kind(label or nat_type.value, shape)


HOMES = [Kind(nat_type.value, attachment(nat_type)) for nat_type in NatType]
CGNAT_KINDS = [
    Kind(NatType.PUBLIC.value, attachment(NatType.PUBLIC)),
    _home(NatType.PORT_RESTRICTED),
    _home(NatType.SYMMETRIC),
    _home(NatType.PORT_RESTRICTED, PortAllocation.RANDOM, label="port-restricted/random"),
    Kind("cgnat", Attachment((CGNAT_BOX,)), behind_cgnat=True),
    Kind("home+cgnat", Attachment((BoxSpec(NatType.PORT_RESTRICTED), CGNAT_BOX), private_ip=HOME_HOST),
         behind_cgnat=True),
]
TOPOLOGIES: dict[str, list[Kind]] = {"homes": HOMES, "cgnat": CGNAT_KINDS}


class Placer:
    """Creates the boxes each new node of a topology sits behind (its CGNATs once, shared round robin)."""

    def __init__(self, network: Network, cgnats: int) -> None:
        self.network = network
        self.cgnat_count = cgnats
        self._cgnats: list[NatBox] = []  # made when the first node needs one
        self._placed: dict[str, int] = {}  # kind label -> nodes of it behind CGNATs so far

    def place(self, kind: Kind) -> tuple[NatBox | None, str | None]:
        """Boxes for one node of `kind`: (the box it sits right behind, its LAN address if fixed)."""
        boxes = kind.attachment.boxes
        if not boxes:
            return None, None
        outer = None
        own = boxes
        if kind.behind_cgnat:
            outer = self._cgnat(kind)
            own = boxes[:-1]
        box = outer
        for index in reversed(range(len(own))):
            lan = HOME_SUBNET if index == 0 and kind.attachment.private_ip == HOME_HOST else None  # the innermost's
            box = self.network.add_nat(own[index].nat_type, behind=box, ports=own[index].ports, subnet=lan)
        return box, (kind.attachment.private_ip if own else None)

    def _cgnat(self, kind: Kind) -> NatBox:
        """The next shared CGNAT for a node of `kind`, round robin per kind (so every kind sits behind each)."""
        if self.cgnat_count < 1:
            raise ValueError("this topology puts nodes behind a CGNAT: cgnats must be at least 1")
        placed = self._placed.get(kind.label, 0)
        self._placed[kind.label] = placed + 1
        index = placed % self.cgnat_count
        while len(self._cgnats) <= index:
            self._cgnats.append(self.network.add_nat(CGNAT_BOX.nat_type, ports=CGNAT_BOX.ports, subnet=CGNAT_SUBNET))
        return self._cgnats[index]


def shared_boxes(network: Network, first: Interface, second: Interface) -> int:
    """How many of their outermost NAT boxes two interfaces share (1: one CGNAT; all: one LAN)."""
    a, b = network.boxes_of(first)[::-1], network.boxes_of(second)[::-1]
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] is b[shared]:
        shared += 1
    return shared
