"""Scenario `connectivity`: who can reach whom through NATs, and does gossip get everywhere?

Story, in virtual time:

1. A few public **bootstrap** nodes start (they serve peer exchange only,
   and every `round_interval` ask each other for peers, so that a newcomer
   hears of nodes that joined through another bootstrap).
2. The other nodes, of mixed NAT types (some sharing one NAT box), join at
   random times over `join_window` seconds. Each connects to a random
   bootstrap, learns its own observed address and a sample of earlier
   joiners (peer exchange), and dials up to `degree` of them at the addresses
   the bootstrap observed (the private address for a neighbour behind the
   same NAT). It repeats that for up to `rounds` rounds, `round_interval`
   apart, until it has `degree` outbound connections. Each connection carries
   a flood link.
3. `messages` nodes each publish one message, a second apart, and the flood
   carries them over the mesh.

The report counts every deliberate dial by (dialer NAT type, target NAT
type) and how it got through: ``direct`` (target public), ``nat-mapping``
(through the target's NAT because its filter admitted the dialer), ``lan``
(behind the same NAT), or not at all: this scenario dials directly only (the
daemon's relays and hole punching are scenario `nat`'s). Next to it, the pure
NAT model's verdict for the same pairs; then the gossip's delivery. The
verdict: the largest mesh holds `min_connected` of the live nodes, the
connected nodes form one mesh, and the flood lost nothing on it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import trio
from libp2p.peer.id import ID

from ..flood import Flood
from ..links import Capacity, LinkProfile
from ..nat import NatBox, NatType
from ..nat_model import hole_punch_succeeds, reachable
from ..network import DialOutcome
from ..node import SimNode
from ..pex import PeerEntry, PeerExchange
from ..report import counted, criterion, glossary, percentile, table, verdict
from ..simulation import Simulation, run_simulation
from . import glossaries
from .options import option

Progress = Callable[[str], None]

NAT_MIX: dict[NatType, float] = {
    NatType.PUBLIC: 0.20,
    NatType.FULL_CONE: 0.10,
    NatType.RESTRICTED: 0.15,
    NatType.PORT_RESTRICTED: 0.30,
    NatType.SYMMETRIC: 0.25,
}


@dataclass(frozen=True)
class Config:
    nodes: int = 100
    bootstraps: int = option(0, "public bootstrap nodes that introduce nodes to each other (0: one per 100 nodes, "
                                "at least 2)")
    degree: int = option(4, "connections each node opens to other nodes (its flood neighbours)")
    want: int = option(16, "addresses of earlier joiners a node asks its bootstrap node for, per round")
    rounds: int = option(3, "times a node asks for addresses and dials until it has `degree` connections")
    round_interval: float = option(10.0, "virtual seconds between those rounds")
    join_window: float = option(20.0, "virtual seconds over which the nodes start, at random times")
    messages: int = option(10, "nodes that each broadcast one message once all have joined")
    settle: float = option(20.0, "virtual seconds the messages get to spread before the counting")
    shared_nat: float = option(0.15, "chance a NATed node joins the previous NAT box of its type (up to 3 nodes "
                                     "per box), as machines of one home share a router")
    min_connected: float = option(0.9, "verdict: the share of live nodes the largest mesh must hold")

    @property
    def bootstrap_count(self) -> int:
        return self.bootstraps or max(2, self.nodes // 100)


@dataclass
class _Attempt:
    dialer: NatType
    target: NatType
    how: DialOutcome | None  # None: did not connect


class _Run:
    """The state of one connectivity run."""

    def __init__(self, sim: Simulation, config: Config, progress: Progress) -> None:
        self.sim = sim
        self.config = config
        self.progress = progress
        self.rng = sim.rng_for("connectivity")
        self.bootstraps: list[SimNode] = []
        self.peers: list[SimNode] = []
        self.floods: dict[str, Flood] = {}
        self.exchanges: dict[str, PeerExchange] = {}
        self.by_peer_id: dict[str, SimNode] = {}
        self.bootstrap_ids: set[str] = set()  # bootstrap nodes learn of each other by asking; peers skip them
        self.attempts: list[_Attempt] = []
        self.published: dict[bytes, float] = {}
        self.publisher_of: dict[bytes, str] = {}  # message id -> the node that published it (for the report)

    # --- building the population ----------------------------------------------------------------

    def build(self) -> None:
        network = self.sim.network
        for index in range(self.config.bootstrap_count):
            node = self.sim.add_node(f"boot{index:02d}", profile=LinkProfile(latency=0.01))
            self._add_services(node, flood=False)
            self.bootstraps.append(node)
            self.bootstrap_ids.add(str(node.peer_id))
        last_box: dict[NatType, NatBox] = {}
        types, weights = list(NAT_MIX), list(NAT_MIX.values())
        for index in range(self.config.nodes - self.config.bootstrap_count):
            nat_type = self.rng.choices(types, weights)[0]
            box = None
            if nat_type is not NatType.PUBLIC:
                box = last_box.get(nat_type)
                if box is None or self.rng.random() >= self.config.shared_nat or len(network.behind(box)) >= 3:
                    box = last_box[nat_type] = network.add_nat(nat_type)
            node = self.sim.add_node(f"n{index:04d}", nat=box, profile=self._access_link(), capacity=self._capacity())
            self._add_services(node, flood=True)
            self.peers.append(node)

    def _access_link(self) -> LinkProfile:
        return LinkProfile(
            latency=round(self.rng.uniform(0.005, 0.05), 4),
            jitter=0.002,
            loss=self.rng.choice([0.0, 0.0, 0.001, 0.01]),
        )

    def _capacity(self) -> Capacity:
        megabyte = 1_000_000
        return Capacity(upload=self.rng.choice([1, 2, 5, 10]) * megabyte, download=self.rng.choice([10, 20, 50]) * megabyte)

    def _add_services(self, node: SimNode, *, flood: bool) -> None:
        self.by_peer_id[str(node.peer_id)] = node
        exchange = self.exchanges[node.name] = PeerExchange(node, self.sim.rng_for(f"pex/{node.name}"))
        if not flood:
            exchange.serve()
            return
        self.floods[node.name] = Flood(node)
        self.floods[node.name].serve()

    # --- running --------------------------------------------------------------------------------

    async def run(self) -> None:
        for node in self.bootstraps:
            await self.sim.start(node)
        self.progress(f"{len(self.bootstraps)} bootstrap nodes up; {len(self.peers)} nodes joining")
        self.sim.nursery.start_soon(self._share_between_bootstraps)
        join_times = sorted((self.rng.uniform(0, self.config.join_window), node.name) for node in self.peers)
        async with trio.open_nursery() as nursery:
            for at, name in join_times:
                node = self.sim.nodes[name]
                nursery.start_soon(self._join, node, at, random.Random(self.rng.getrandbits(64)))
        self.progress(f"t={trio.current_time():.1f}s: joining done; {len(self.attempts)} dials")
        await trio.sleep(self.config.round_interval)
        await self._gossip()

    async def _share_between_bootstraps(self) -> None:
        while True:
            await trio.sleep(self.config.round_interval / 2)
            for asker in self.bootstraps:
                for other in self.bootstraps:
                    if other is not asker and await asker.connect(other.peer_id, other.listen_addr):
                        answer = await self.exchanges[asker.name].ask(other.peer_id, self.config.want * 4)
                        self.exchanges[asker.name].learn(answer[1] if answer else [])

    async def _join(self, node: SimNode, at: float, rng: random.Random) -> None:
        await trio.sleep_until(at)
        await self.sim.start(node)
        outbound: list[str] = []
        bootstrap = rng.choice(self.bootstraps)
        for _ in range(self.config.rounds):
            entries, observed = await self._ask_bootstrap(node, bootstrap)
            connected = {str(peer) for peer in node.connected_peers()}
            skip = connected | self.bootstrap_ids | {str(node.peer_id)}
            candidates = [entry for entry in entries if entry.peer_id not in skip]
            rng.shuffle(candidates)
            wanted = candidates[: self.config.degree - len(outbound)]
            async with trio.open_nursery() as nursery:
                for entry in wanted:
                    nursery.start_soon(self._dial, node, entry, observed, outbound)
            if len(outbound) >= self.config.degree:
                return
            await trio.sleep(self.config.round_interval)

    async def _ask_bootstrap(self, node: SimNode, bootstrap: SimNode) -> tuple[list[PeerEntry], tuple[str, int] | None]:
        if not await node.connect(bootstrap.peer_id, bootstrap.listen_addr):
            return [], None
        answer = await self.exchanges[node.name].ask(bootstrap.peer_id, self.config.want)
        if answer is None:
            return [], None
        observed, entries = answer
        return entries, observed

    async def _dial(self, node: SimNode, entry: PeerEntry, observed: tuple[str, int] | None, outbound: list[str]) -> None:
        target = self.by_peer_id[entry.peer_id]
        same_nat = observed is not None and observed[0] == entry.observed[0]
        connected = await node.connect(target.peer_id, entry.listen if same_nat else entry.observed)
        how = self.sim.network.last_route.get((node.name, target.name)) if connected else None
        self.attempts.append(_Attempt(node.interface.nat_type, target.interface.nat_type, how))
        if connected:
            outbound.append(entry.peer_id)
            self.floods[node.name].attach(ID.from_base58(entry.peer_id))

    async def _gossip(self) -> None:
        live = [node for node in self.peers if node.running]
        publishers = self.rng.sample(live, min(self.config.messages, len(live)))
        self.progress(f"t={trio.current_time():.1f}s: {len(publishers)} messages to flood")
        for node in publishers:
            ident = self.floods[node.name].publish(f"hello from {node.name}".encode())
            self.published[ident] = trio.current_time()
            self.publisher_of[ident] = node.name
            await trio.sleep(1.0)
        await trio.sleep(self.config.settle)
        self.progress(f"t={trio.current_time():.1f}s: done")

    # --- reporting ------------------------------------------------------------------------------

    def report(self) -> dict:
        judged = verdict(self._criteria())
        return {
            "scenario": "connectivity",
            "overview": self._overview(),
            "verdict": judged,
            "config": asdict(self.config),
            "summary": self._summary(),
            "tables": [self._pair_table(), self._model_table(), self._gossip_table(), self._error_table()],
            "glossary": glossary(glossaries.CONNECTIVITY,
                                 common=("seed", "virtual seconds", "p50, p90, p99", "errors counted by nodes")),
        }

    def _overview(self) -> str:
        live = [node for node in self.peers if node.running]
        groups = self._components()
        largest = max(map(len, groups), default=0)
        alone = sum(1 for group in groups if len(group) == 1)
        delivered, expected, _ = self._delivery()
        by_type = Counter(node.interface.nat_type.value for node in self.peers)
        types = ", ".join(f"{count} {name}" for name, count in by_type.items())
        return (
            f"{self.config.nodes} simulated nodes, {len(self.bootstraps)} public bootstrap nodes and {len(self.peers)} "
            f"others by NAT type ({types}), started over {self.config.join_window:g} virtual seconds; each of the "
            f"others tried to connect directly to {counted(self.config.degree, 'node')} it learnt of from a bootstrap "
            "node, then "
            f"{len(self.published)} of them each broadcast a message by flooding. "
            f"The largest connected mesh held {largest} of the {len(live)} nodes, "
            + (f"and {counted(alone, 'node')} could connect to nobody (direct connections only: the relays and hole "
               "punching that reach such nodes are `sim nat`'s). " if alone else "and every node had a connection. ")
            + f"The messages reached {_share_text(delivered, expected)} of the (message, node) pairs."
        )

    def _criteria(self) -> list[dict]:
        live = sum(1 for node in self.peers if node.running)
        groups = self._components()
        largest = max(map(len, groups), default=0)
        meshes = sum(1 for group in groups if len(group) > 1)
        delivered, expected, within = self._delivery()
        return [
            criterion(f"the largest mesh holds at least {self.config.min_connected:.0%} of the live nodes",
                      f"{largest} of {live}", live > 0 and largest >= self.config.min_connected * live),
            criterion("the nodes that got connections form one mesh, not several", counted(meshes, "mesh", "meshes"),
                      meshes <= 1),
            criterion("every message reached every node with a path to its publisher (the flood lost nothing)",
                      f"{delivered} of {within} such deliveries", delivered >= within),
        ]

    def _delivery(self) -> tuple[int, int, int]:
        """Deliveries made, deliveries to every live node, and deliveries to every live node in its
        publisher's part of the mesh (what a lossless flood must make)."""
        live = [node for node in self.peers if node.running]
        part = {name: len(group) for group in self._components() for name in group}
        delivered = sum(1 for ident in self.published for node in live if ident in self.floods[node.name].arrivals)
        within = sum(part.get(self.publisher_of[ident], 0) for ident in self.published)
        return delivered, len(self.published) * len(live), within

    def _summary(self) -> dict:
        degrees = [len(self.floods[node.name].neighbours) for node in self.peers]
        alone = Counter(node.interface.nat_type.value for node in self.peers if not self.floods[node.name].neighbours)
        components = self._component_sizes()
        return {
            "seed": self.sim.seed,
            "nodes": self.config.nodes,
            "bootstrap nodes": len(self.bootstraps),
            "nat boxes": self.sim.network.nat_box_count,
            "nodes by NAT type": dict(Counter(node.interface.nat_type.value for node in self.peers)),
            "virtual seconds": round(trio.current_time(), 3),
            "connection attempts (all, incl. libp2p's own)": len(self.sim.network.dials),
            "flood degree mean": round(sum(degrees) / len(degrees), 3) if degrees else None,
            "nodes without flood neighbours": sum(1 for d in degrees if d == 0),
            # Why islands: such a node's dials all met NATs it cannot get through (this scenario has no
            # relays), and nobody could dial it either (it sits behind a port-restricted or symmetric NAT).
            "nodes without flood neighbours, by NAT type": dict(sorted(alone.items())),
            "flood mesh components": len(components),
            "largest flood mesh component": max(components, default=0),
        }

    def _component_sizes(self) -> list[int]:
        """Sizes of the connected components of the flood mesh among running nodes, largest first."""
        return sorted(map(len, self._components()), reverse=True)

    def _components(self) -> list[set[str]]:
        """The connected components of the flood mesh among running nodes, as sets of node names."""
        names = {str(node.peer_id): node.name for node in self.peers if node.running}
        parent = {name: name for name in names.values()}

        def root(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        for peer_id, name in names.items():
            for neighbour in self.floods[name].neighbours:
                if neighbour in names:
                    parent[root(name)] = root(names[neighbour])
        groups: dict[str, set[str]] = {}
        for name in parent:
            groups.setdefault(root(name), set()).add(name)
        return list(groups.values())

    def _pair_table(self) -> dict:
        rows = []
        for dialer in NatType:
            for target in NatType:
                hows = Counter(a.how for a in self.attempts if a.dialer is dialer and a.target is target)
                total = sum(hows.values())
                if total == 0:
                    continue
                reached = total - hows[None]
                rows.append([
                    dialer.value, target.value, total,
                    hows[DialOutcome.DIRECT], hows[DialOutcome.NAT_MAPPING], hows[DialOutcome.LAN],
                    hows[None], round(reached / total, 3),
                ])
        return table(
            "Dials by NAT type pair (dialer -> target) and how they got through",
            ["dialer", "target", "attempts", "direct", "nat-mapping", "lan", "failed", "reached"],
            rows,
            note="Deliberate dials of the scenario (to addresses a bootstrap observed), direct only: this scenario "
            "has no relays and no hole punching (`locomesh sim nat` runs the daemon's). direct: the target is "
            "public; nat-mapping: through the target's NAT, whose filter let the dialer in; lan: both behind the "
            "same NAT; reached: the share of attempts that connected.",
        )

    def _model_table(self) -> dict:
        rows = [
            [dialer.value] + ["yes" if reachable(dialer, target) else "no" for target in NatType]
            + ["yes" if hole_punch_succeeds(dialer, target) else "no" for target in NatType]
            for dialer in NatType
        ]
        columns = ["dialer \\ target"] + [f"dial {t.value}" for t in NatType] + [f"punch {t.value}" for t in NatType]
        return table("What the NAT model predicts", columns, rows,
                     note="dial: can the dialer connect to the target without help; punch: can a hole punch (both "
                     "sides dialling at once, coordinated through a relay) connect them. yes or no by NAT type, "
                     "from `netsim/nat_model.py`, for comparison with the dials above.")

    def _gossip_table(self) -> dict:
        live = [node for node in self.peers if node.running]
        latencies, hops, delivered = [], [], 0
        for ident, sent_at in self.published.items():
            for node in live:
                arrival = self.floods[node.name].arrivals.get(ident)
                if arrival is not None:
                    delivered += 1
                    latencies.append(arrival.at - sent_at)
                    hops.append(arrival.hops)
        expected = len(self.published) * len(live)
        rows = [
            ["messages", len(self.published)],
            ["receivers (live nodes)", len(live)],
            ["delivered", delivered],
            ["delivery ratio", round(delivered / expected, 4) if expected else None],
            ["latency p50 (s)", _rounded(percentile(latencies, 50))],
            ["latency p90 (s)", _rounded(percentile(latencies, 90))],
            ["latency max (s)", _rounded(max(latencies, default=None))],
            ["hops p50", percentile(hops, 50)],
            ["hops max", max(hops, default=None)],
            ["duplicates", sum(flood.duplicates for flood in self.floods.values())],
            ["queue drops", sum(flood.dropped for flood in self.floods.values())],
        ]
        return table("Gossip (flood) delivery", ["measure", "value"], rows)

    def _error_table(self) -> dict:
        errors: Counter[str] = Counter()
        for node in self.sim.nodes.values():
            errors.update(node.errors)
        return table("Errors counted by nodes", ["code", "count"], sorted(errors.items()))


def _share_text(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "none"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def run(*, nodes: int = 100, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.nodes <= config.bootstrap_count:
        raise ValueError(f"need more than {config.bootstrap_count} nodes (the bootstrap nodes)")

    async def main(sim: Simulation) -> dict:
        state = _Run(sim, config, progress)
        state.build()
        await state.run()
        return state.report()

    return run_simulation(seed, main)
