"""Scenario `nat`: the daemon's real NAT traversal between every pair of NAT types.

Story, in virtual time:

1. `relays` public nodes start, each linked to the next in a ring (so each
   has peers that are *not* connected to a given neighbour: the dial-back
   check needs such a third party). They run the daemon's reachability check
   and relay service with relay mode ``on``, as a bootstrap node would be
   configured.
2. The other nodes start, each of NAT type public, full cone, restricted,
   port-restricted or symmetric in turn, each behind its own NAT box (public
   ones behind none). Each connects to `bootstraps_per_node` relays and runs
   the same services as the daemon (`locomesh.node.nat.services`'s
   reachability check and relay service; no port mapping, as the simulated
   NAT boxes have no gateway protocol). Within `settle` seconds the check
   finds each node public or private, and private ones reserve relay slots.
3. For each chosen pair (every pair for small runs, else up to
   `pairs_per_type_pair` per NAT-type pair, seeded), the first node connects
   to the second with `RelayService.connect`, at the addresses the second
   would put in its peer record: its listen address and its relay
   addresses. A relayed connection is then given `upgrade_wait` seconds for
   DCUtR to punch a direct one.

Outcomes per pair: ``direct`` (the dial to the listen address worked),
``hole-punched`` (first relayed, then direct), ``relayed`` (only through a
relay, and still connected at the end of `upgrade_wait`), ``none`` (no
connection, or a relayed one that did not last). The report has the table
by NAT-type pair (each unordered pair counted under the dialer's and
target's types in that order), the share of NATed pairs (at least one side
behind a NAT) that connected, the share upgraded to direct among pairs
where the NAT model says a direct path exists (`reachable` or
`hole_punch_succeeds`), and time to the first
connection. The peer record is built in the scenario rather than fetched
from the DHT (the `dht` scenario covers that path).

Repeatability: the same seed gives the same summary and tables, except the
count of errors by code (which code a torn-down stream is counted under
follows py-libp2p's iteration over sets of objects hashed by address). Two
things keep the rest repeatable: links have no jitter here (any such order
difference would otherwise shift every later random draw of the links), and
py-libp2p's service task IDs are seeded (`_seeded_service_task_ids`).

Model: cone NATs keep the inside port while it is free (as Linux masquerade
and most home routers do), so py-libp2p's DCUtR, which advertises
``<external ip>:<listen port>``, punches through them; symmetric NATs pick a
new port per destination, so a symmetric node punches only towards peers
whose NAT admits any source port.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import trio

from locomesh.node.nat.reach_service import ReachabilityService
from locomesh.node.nat.reachability import PUBLIC
from locomesh.node.nat.relay_service import DIRECT, RelayService
from locomesh.node.runtime import DialError

from .. import clock
from ..links import LinkProfile
from ..nat import NatType, hole_punch_succeeds, reachable
from ..node import SimNode
from ..report import percentile, table
from ..simulation import Simulation, derive_seed, run_simulation

Progress = Callable[[str], None]
TYPES = list(NatType)  # public, full cone, restricted, port-restricted, symmetric
OUTCOMES = ("direct", "hole-punched", "relayed", "none")


@dataclass(frozen=True)
class Config:
    nodes: int = 30
    relays: int = 5  # public relay + bootstrap nodes, in a ring (included in `nodes`)
    bootstraps_per_node: int = 2
    settle: float = 60.0
    pairs_per_type_pair: int = 4
    upgrade_wait: float = 30.0
    pair_spacing: float = 0.5  # seconds between the starts of two pairs' connects


@dataclass
class _Member:
    sim_node: SimNode
    nat_type: NatType
    reach: ReachabilityService
    relay: RelayService


@dataclass
class _Pair:
    dialer: _Member
    target: _Member
    outcome: str = "none"
    first_connection: float | None = None  # seconds from the start of the connect
    to_direct: float | None = None

    @property
    def types(self) -> tuple[NatType, NatType]:
        return self.dialer.nat_type, self.target.nat_type

    @property
    def natted(self) -> bool:
        return self.types != (NatType.PUBLIC, NatType.PUBLIC)

    @property
    def direct_possible(self) -> bool:
        """The NAT model's word: can these two end up directly connected (a dial either way, or a punch)?"""
        a, b = self.types
        return reachable(a, b) or reachable(b, a) or hole_punch_succeeds(a, b)


class _Run:
    def __init__(self, sim: Simulation, config: Config, progress: Progress) -> None:
        self.sim = sim
        self.config = config
        self.progress = progress
        self.rng = sim.rng_for("nat")
        self.relays: list[_Member] = []
        self.members: list[_Member] = []
        self.pairs: list[_Pair] = []

    # --- building ------------------------------------------------------------------------------

    def build(self) -> None:
        for index in range(self.config.relays):
            self.relays.append(self._add(f"relay{index:02d}", NatType.PUBLIC, relay_mode="on"))
        for index in range(self.config.nodes - self.config.relays):
            self.members.append(self._add(f"n{index:04d}", TYPES[index % len(TYPES)], relay_mode="auto"))

    def _add(self, name: str, nat_type: NatType, *, relay_mode: str) -> _Member:
        box = None if nat_type is NatType.PUBLIC else self.sim.network.add_nat(nat_type)
        latency = round(self.rng.uniform(0.005, 0.04), 4)
        node = self.sim.add_node(name, nat=box, profile=LinkProfile(latency=latency))
        rng = self.sim.rng_for(f"reach/{name}")
        reach = ReachabilityService(clock=clock.wall, libp2p_clock=clock.wall, rng=rng, nonces=rng.randbytes)
        # As the daemon wires it (node/nat/services.py), less the gateway port mapper: addresses a
        # dial-back proved go into the peer record.
        relay = RelayService(lambda: reach.verdict, mode=relay_mode, extra_addrs=reach.tracker.confirmed_addrs)
        node.services = [reach, relay]
        return _Member(node, nat_type, reach, relay)

    # --- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        for member in self.relays:
            await self.sim.start(member.sim_node)
        for index, member in enumerate(self.relays):
            neighbour = self.relays[index - 1].sim_node
            await member.sim_node.connect(neighbour.peer_id, neighbour.listen_addr)
        async with trio.open_nursery() as nursery:
            for member in self.members:
                nursery.start_soon(self._join, member, random.Random(self.rng.getrandbits(64)))
        self.progress(f"t={trio.current_time():.1f}s: {len(self.members)} nodes joined; settling")
        await trio.sleep(self.config.settle)
        self.pairs = self._choose_pairs()
        self.progress(f"t={trio.current_time():.1f}s: connecting {len(self.pairs)} pairs")
        async with trio.open_nursery() as nursery:
            for pair in self.pairs:
                nursery.start_soon(self._connect, pair)
                await trio.sleep(self.config.pair_spacing)
        self.progress(f"t={trio.current_time():.1f}s: done")

    async def _join(self, member: _Member, rng: random.Random) -> None:
        await self.sim.start(member.sim_node)
        for relay in rng.sample(self.relays, min(self.config.bootstraps_per_node, len(self.relays))):
            await member.sim_node.connect(relay.sim_node.peer_id, relay.sim_node.listen_addr)

    def _choose_pairs(self) -> list[_Pair]:
        """Every unordered pair of members, or up to `pairs_per_type_pair` per NAT-type pair (seeded)."""
        by_types: dict[tuple[NatType, NatType], list[_Pair]] = defaultdict(list)
        for first, second in itertools.combinations(self.members, 2):
            dialer, target = (first, second) if self.rng.random() < 0.5 else (second, first)
            by_types[(dialer.nat_type, target.nat_type)].append(_Pair(dialer, target))
        chosen: list[_Pair] = []
        for types in sorted(by_types, key=lambda pair: (TYPES.index(pair[0]), TYPES.index(pair[1]))):
            candidates = by_types[types]
            chosen += self.rng.sample(candidates, min(self.config.pairs_per_type_pair, len(candidates)))
        return chosen

    async def _connect(self, pair: _Pair) -> None:
        """Connect as the daemon does (`RelayService.connect`), then watch for the upgrade to direct."""
        target = pair.target
        node = target.sim_node.node
        if node is None or pair.dialer.sim_node.node is None:
            return
        addrs, relay_addrs = target.relay.record_addrs()  # what its DHT peer record says
        record = addrs + relay_addrs
        started = trio.current_time()
        try:
            kind = await pair.dialer.relay.connect(str(target.sim_node.peer_id), record)
        except DialError:
            pair.dialer.sim_node.count_error("pair-connect-failed")
            return
        pair.first_connection = trio.current_time() - started
        if kind == DIRECT:
            pair.outcome, pair.to_direct = "direct", pair.first_connection
            return
        pair.outcome = "relayed"
        with trio.move_on_after(self.config.upgrade_wait):
            while pair.dialer.relay.connection_kind(str(target.sim_node.peer_id)) != DIRECT:
                await trio.sleep(0.25)
            pair.outcome, pair.to_direct = "hole-punched", trio.current_time() - started
            return
        if pair.dialer.relay.connection_kind(str(target.sim_node.peer_id)) is None:
            pair.outcome = "none"  # the relayed connection did not last

    # --- reporting -----------------------------------------------------------------------------

    def report(self) -> dict:
        return {
            "scenario": "nat",
            "config": asdict(self.config),
            "summary": self._summary(),
            "tables": [self._pair_table(), self._reachability_table(), self._error_table()],
        }

    def _summary(self) -> dict:
        natted = [pair for pair in self.pairs if pair.natted]
        possible = [pair for pair in natted if pair.direct_possible]
        firsts = [pair.first_connection for pair in self.pairs if pair.first_connection is not None]
        return {
            "seed": self.sim.seed,
            "nodes": self.config.nodes,
            "relays": len(self.relays),
            "pairs tried": len(self.pairs),
            "outcomes": dict(Counter(pair.outcome for pair in self.pairs)),
            "NATed pairs connected (share)": _share(sum(pair.outcome != "none" for pair in natted), len(natted)),
            "direct where the NATs allow it (share)": _share(
                sum(pair.outcome in ("direct", "hole-punched") for pair in possible), len(possible)
            ),
            "time to first connection p50 (s)": _rounded(percentile(firsts, 50)),
            "time to first connection p90 (s)": _rounded(percentile(firsts, 90)),
            "time to first connection max (s)": _rounded(max(firsts, default=None)),
            "virtual seconds": round(trio.current_time(), 3),
        }

    def _pair_table(self) -> dict:
        rows = []
        for dialer, target in itertools.product(TYPES, TYPES):
            pairs = [pair for pair in self.pairs if pair.types == (dialer, target)]
            if not pairs:
                continue
            outcomes = Counter(pair.outcome for pair in pairs)
            upgrades = [pair.to_direct for pair in pairs if pair.outcome == "hole-punched"]
            model = _model_path(dialer, target)
            rows.append(
                [dialer.value, target.value, len(pairs), *(outcomes[outcome] for outcome in OUTCOMES), model,
                 _rounded(percentile(upgrades, 50))]
            )
        return table(
            "Pair connectivity by NAT type (dialer -> target)",
            ["dialer", "target", "pairs", *OUTCOMES, "model says", "to direct p50 (s)"],
            rows,
            note="direct: the dial to the target's listen address worked; hole-punched: relayed first, then DCUtR "
            "made a direct connection; relayed: through a relay only. 'model says' is the NAT model's best path "
            "for a plain dial from the dialer (punch: a simultaneous open works; relay: neither).",
        )

    def _reachability_table(self) -> dict:
        rows = []
        for nat_type in TYPES:
            members = [member for member in self.members if member.nat_type is nat_type]
            verdicts = Counter(member.reach.verdict for member in members)
            reserved = sum(bool(member.relay.reserved) for member in members)
            counts = [verdicts[verdict] for verdict in (PUBLIC, "private", "unknown")]
            rows.append([nat_type.value, len(members), *counts, reserved])
        return table(
            "Reachability verdicts and relay reservations (at the end)",
            ["nat type", "nodes", "public", "private", "unknown", "with relay slots"],
            rows,
        )

    def _error_table(self) -> dict:
        errors: Counter[str] = Counter()
        for node in self.sim.nodes.values():
            errors.update(node.errors)
        return table("Errors counted by nodes", ["code", "count"], sorted(errors.items()))


def _model_path(dialer: NatType, target: NatType) -> str:
    """The NAT model's best path for the pair: a plain dial, a hole punch, or only a relay."""
    if reachable(dialer, target):
        return "direct"
    return "punch" if hole_punch_succeeds(dialer, target) else "relay"


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run(*, nodes: int = 30, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.relays < 3 or config.nodes < config.relays + 2:
        raise ValueError(f"need at least 3 relays and 2 more nodes (got {config.relays} relays, {config.nodes} nodes)")

    async def main(sim: Simulation) -> dict:
        state = _Run(sim, config, progress)
        state.build()
        await state.run()
        return state.report()

    with _seeded_service_task_ids(derive_seed(seed, "anyio-service-task-ids")):
        return run_simulation(seed, main)


@contextmanager
def _seeded_service_task_ids(seed: int) -> Iterator[None]:
    """Make py-libp2p's service task IDs come from a seeded generator for the duration of a run.

    The relay and DCUtR protocols run under py-libp2p's `anyio_service`, whose
    tasks hash by a ``uuid4()`` ID and sit in sets: their order, and with it
    the schedule of a run, changed from run to run. (This belongs beside the
    other pins in `netsim.simulation._deterministic`; it lives here until the
    netsim core takes it, as only this scenario runs those services.)
    """
    from libp2p.tools.anyio_service import tasks, trio_tasks

    rng = random.Random(seed)

    class _SeededUuid:
        @staticmethod
        def uuid4() -> uuid.UUID:
            return uuid.UUID(int=rng.getrandbits(128), version=4)

    modules = (tasks, trio_tasks)
    saved = [module.uuid for module in modules]
    for module in modules:
        module.uuid = _SeededUuid  # type: ignore[assignment]
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            module.uuid = original  # type: ignore[assignment]
