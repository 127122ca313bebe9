"""Scenario `nat`: the daemon's real NAT traversal between every pair of NAT kinds, and a relay that dies.

Story, in virtual time:

1. `relays` public nodes start, each with the one before it as its
   bootstrap peer, a ring (so each has peers that are *not* connected to a
   given neighbour: the dial-back check needs such a third party). They run
   the daemon's reachability check and relay service with relay mode ``on``,
   as a bootstrap node would be configured.
2. The other nodes start, one of each kind of the `topology` in turn
   (`nat_topology`: ``homes``, each node behind its own box of a classic NAT
   type; ``cgnat``, carrier-grade NATs shared by several nodes, home boxes
   behind them, boxes that do not preserve ports, identical home LANs). Each
   has `bootstraps_per_node` relays as its bootstrap peers (its `Node` keeps
   them connected, as the daemon's does) and runs the same services as the
   daemon (`locomesh.node.nat.services`'s reachability check and relay
   service; no port mapping, as the simulated NAT boxes have no gateway
   protocol). Peer records go to `_Directory`, which stands for the DHT.
   Within `settle` seconds the check finds each node public or private, and
   private ones reserve relay slots.
3. For each chosen pair (every pair for small runs, else up to
   `pairs_per_type_pair` per pair of kinds and what they share, seeded), the
   first node connects to the second with `RelayService.connect`, at the
   addresses the second would put in its peer record: its listen address,
   addresses a dial-back proved, and its relay addresses. A relayed
   connection is then given `upgrade_wait` seconds to be upgraded to a
   direct one by hole punching. From then on both keep the link
   (`RelayService.keep_linked`), as members of one run do.
4. Unless `relay_outage` is 0: the relay that carries the most relayed-only
   links (the `relays_killed` busiest ones) is killed (connections reset, no
   goodbye), and after `relay_outage` seconds it comes back with the same
   identity and address, a fresh process (new services). For
   `recovery_wait` seconds from the kill the scenario watches which relayed
   links went down and which came back; it re-dials nothing itself: the
   nodes' bootstrap dialers and link keeping do. (A pair's connect leaves
   both of the target's relays connected, so one relay's death cuts a link
   only where the other path is gone too.)

Outcomes per pair: ``direct`` (a dial to a plain address of the record
worked), ``hole-punched`` (first relayed, then direct), ``relayed`` (only
through a relay, and still connected at the end of `upgrade_wait`), ``none``
(no connection, or a relayed one that did not last). The NAT model
(`netsim.nat_model.pair_verdict`, replayed on the pair's own chains of boxes)
says which pairs can go direct; the report (`nat_report`) gives the share
that did and the time from the first connection to the direct one, against
the targets of issue #25, per pair of kinds and pooled over `seeds` seeds
(the run's seed and the next ones). Peer records live in a dictionary
rather than the DHT (the `dht` scenario covers that path).

Repeatability: the same seed gives the same summary and tables, except the
count of errors by code (which code a torn-down stream is counted under
follows py-libp2p's iteration over sets of objects hashed by address). Two
things keep the rest repeatable: links have no jitter here (any such order
difference would otherwise shift every later random draw of the links), and
py-libp2p's service task IDs are seeded (`_seeded_service_task_ids`).
Several seeds run one after another in one process; a run repeats itself
only from a fresh process (tests/repeatable.py), so pooled reports are
compared between fresh processes too.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import trio
from libp2p.peer.id import ID

from locomesh.node.connections import facts_of
from locomesh.node.nat.reach_service import ReachabilityService
from locomesh.node.nat.reachability import PUBLIC
from locomesh.node.nat.relay_service import DIRECT, RELAYED, RelayService
from locomesh.node.runtime import DialError

from .. import clock
from ..links import LinkProfile
from ..nat_model import Attachment, pair_verdict
from ..node import SimNode
from ..simulation import Simulation, derive_seed, run_simulation
from .nat_report import PairRecord, RestartRecord, RunRecord, report
from .nat_topology import TOPOLOGIES, Kind, Placer, shared_boxes
from .options import option

Progress = Callable[[str], None]
RELAY = Kind("public", Attachment())
POLL = 0.25  # seconds between looks at a pair's connections


@dataclass(frozen=True)
class Config:
    nodes: int = 30
    relays: int = option(5, "public nodes that relay for others and bootstrap them, in a ring (counted in --nodes)")
    bootstraps_per_node: int = option(2, "relays each node keeps connected as its bootstrap peers")
    settle: float = option(60.0, "virtual seconds for the nodes to find out whether they are reachable and "
                                 "reserve relay slots, before the pairs connect")
    pairs_per_type_pair: int = option(4, "pairs tried per pair of NAT kinds (every pair in small runs)")
    upgrade_wait: float = option(60.0, "virtual seconds a relayed pair gets to go direct by hole punching "
                                       "(longer than the 30 s target, so a slow upgrade shows as slow)")
    pair_spacing: float = option(0.5, "virtual seconds between the starts of two pairs' connections")
    topology: str = option("homes", "who sits behind what: homes (each node behind its own home NAT) or cgnat "
                                    "(carrier-grade NATs shared by several homes, double NAT, identical home LANs)")
    cgnats: int = option(2, "shared carrier-grade NATs, for topology cgnat")
    seeds: int = option(1, "runs, from the given seed on, pooled in one report (--seeds)")
    relay_outage: float = option(30.0, "virtual seconds the killed relay stays down (0: no relay is killed)")
    relays_killed: int = option(1, "how many relays die together (the busiest ones)")
    recovery_wait: float = option(120.0, "virtual seconds the links are watched from the kill")


@dataclass
class _Member:
    sim_node: SimNode
    kind: Kind
    reach: ReachabilityService
    relay: RelayService
    kept: list[str] = field(default_factory=list)  # peers it keeps linked to (its pairs' other nodes)

    @property
    def peer_id(self) -> str:
        return str(self.sim_node.peer_id)


@dataclass
class _Record:
    body: dict


class _Directory:
    """Every node's last published peer record, standing for the DHT: what `RelayService` publishes and
    looks up (its `discovery`)."""

    def __init__(self) -> None:
        self.records: dict[str, _Record] = {}

    def for_node(self, peer_id: str) -> _Discovery:
        return _Discovery(self, peer_id)


class _Discovery:
    """One node's view of the `_Directory`, with the two calls `RelayService` makes of its discovery."""

    def __init__(self, directory: _Directory, peer_id: str) -> None:
        self._directory = directory
        self._peer_id = peer_id

    async def publish_peer_record(self, addrs: list[str], relay_addrs: list[str]) -> None:
        self._directory.records[self._peer_id] = _Record({"addrs": list(addrs), "relay_addrs": list(relay_addrs)})
        await trio.lowlevel.checkpoint()

    async def find_peer_record(self, peer_id: str) -> _Record | None:
        await trio.lowlevel.checkpoint()
        return self._directory.records.get(peer_id)


@dataclass
class _Pair:
    dialer: _Member
    target: _Member
    record: PairRecord


class _Run:
    def __init__(self, sim: Simulation, config: Config, progress: Progress) -> None:
        self.sim = sim
        self.config = config
        self.progress = progress
        self.rng = sim.rng_for("nat")
        self.kinds = TOPOLOGIES[config.topology]
        self.placer = Placer(sim.network, config.cgnats)
        self.relays: list[_Member] = []
        self.members: list[_Member] = []
        self.pairs: list[_Pair] = []
        self.restart = RestartRecord(outage=config.relay_outage)
        self.directory = _Directory()

    # --- building ------------------------------------------------------------------------------

    def build(self) -> None:
        for index in range(self.config.relays):
            self.relays.append(self._add(f"relay{index:02d}", RELAY, relay_mode="on"))
        for index, relay in enumerate(self.relays):
            neighbour = self.relays[index - 1].sim_node
            relay.sim_node.bootstrap = [(neighbour.peer_id, neighbour.listen_addr)]
        for index in range(self.config.nodes - self.config.relays):
            member = self._add(f"n{index:04d}", self.kinds[index % len(self.kinds)], relay_mode="auto")
            rng = random.Random(self.rng.getrandbits(64))
            chosen = rng.sample(self.relays, min(self.config.bootstraps_per_node, len(self.relays)))
            member.sim_node.bootstrap = [(relay.sim_node.peer_id, relay.sim_node.listen_addr) for relay in chosen]
            self.members.append(member)

    def _add(self, name: str, kind: Kind, *, relay_mode: str) -> _Member:
        box, ip = self.placer.place(kind)
        latency = round(self.rng.uniform(0.005, 0.04), 4)
        node = self.sim.add_node(name, nat=box, ip=ip, profile=LinkProfile(latency=latency))
        member = _Member(node, kind, *self._services(node, relay_mode, generation=0))
        node.services = [member.reach, member.relay]
        member.relay.keep_linked(lambda: member.kept)
        return member

    def _services(self, node: SimNode, relay_mode: str, *, generation: int) -> tuple[ReachabilityService, RelayService]:
        """The services of one daemon process, as `locomesh.node.nat.services` wires them, less the gateway port
        mapper: addresses a dial-back proved go into the peer record. A restart is a new process: new services."""
        rng = self.sim.rng_for(f"reach/{node.name}" + (f"/{generation}" if generation else ""))
        reach = ReachabilityService(clock=clock.wall, libp2p_clock=clock.wall, rng=rng, nonces=rng.randbytes)
        discovery = self.directory.for_node(str(node.peer_id))
        relay = RelayService(lambda: reach.verdict, mode=relay_mode, extra_addrs=reach.tracker.confirmed_addrs,
                             discovery=lambda: discovery)
        return reach, relay

    # --- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        for member in self.relays + self.members:  # each dials its bootstrap peers once started
            await self.sim.start(member.sim_node)
        self.progress(f"t={trio.current_time():.1f}s: {len(self.members)} nodes joined; settling")
        await trio.sleep(self.config.settle)
        self.pairs = self._choose_pairs()
        self.progress(f"t={trio.current_time():.1f}s: connecting {len(self.pairs)} pairs")
        async with trio.open_nursery() as nursery:
            for pair in self.pairs:
                nursery.start_soon(self._connect, pair)
                await trio.sleep(self.config.pair_spacing)
        if self.config.relay_outage > 0:
            await self._relay_dies_and_returns()
        self.progress(f"t={trio.current_time():.1f}s: done")

    def _choose_pairs(self) -> list[_Pair]:
        """Every unordered pair of members, or up to `pairs_per_type_pair` per (kinds, shared) group (seeded)."""
        groups: dict[tuple[str, str, str], list[_Pair]] = defaultdict(list)
        for first, second in itertools.combinations(self.members, 2):
            dialer, target = (first, second) if self.rng.random() < 0.5 else (second, first)
            pair = self._pair(dialer, target)
            groups[(pair.record.dialer, pair.record.target, pair.record.shared)].append(pair)
        rank = {kind.label: index for index, kind in enumerate(self.kinds)}
        chosen: list[_Pair] = []
        for key in sorted(groups, key=lambda key: (rank[key[0]], rank[key[1]], key[2])):
            candidates = groups[key]
            chosen += self.rng.sample(candidates, min(self.config.pairs_per_type_pair, len(candidates)))
        return chosen

    def _pair(self, dialer: _Member, target: _Member) -> _Pair:
        """The pair, with what its nodes share and the NAT model's verdict on it."""
        network = self.sim.network
        shared = shared_boxes(network, dialer.sim_node.interface, target.sim_node.interface)
        whole = shared and shared == len(dialer.kind.attachment.boxes) == len(target.kind.attachment.boxes)
        tag = "lan" if whole else ("cgnat" if shared else "")
        model = pair_verdict(dialer.kind.attachment, target.kind.attachment, shared=shared)
        return _Pair(dialer, target, PairRecord(dialer.kind.label, target.kind.label, tag, model))

    async def _connect(self, pair: _Pair) -> None:
        """Connect as the daemon does (`RelayService.connect`), then watch for the upgrade to direct."""
        record, target = pair.record, pair.target
        if target.sim_node.node is None or pair.dialer.sim_node.node is None:
            return
        addrs, relay_addrs = target.relay.record_addrs()  # what its DHT peer record says
        started = trio.current_time()
        try:
            kind = await pair.dialer.relay.connect(target.peer_id, addrs + relay_addrs)
        except DialError:
            pair.dialer.sim_node.count_error("pair-connect-failed")
            return
        record.first_connection = trio.current_time() - started
        pair.dialer.kept.append(target.peer_id)  # a link both ends now keep, as a run's members do
        target.kept.append(pair.dialer.peer_id)
        if kind == DIRECT:
            record.outcome, record.direct_at = "direct", record.first_connection
            return
        record.outcome = "relayed"
        with trio.move_on_after(self.config.upgrade_wait):
            while pair.dialer.relay.connection_kind(target.peer_id) != DIRECT:
                await trio.sleep(POLL)
            record.outcome, record.direct_at = "hole-punched", trio.current_time() - started
            return
        if pair.dialer.relay.connection_kind(target.peer_id) is None:
            record.outcome = "none"  # the relayed connection did not last

    # --- a relay dies and returns --------------------------------------------------------------

    async def _relay_dies_and_returns(self) -> None:
        """Kill the `relays_killed` relays carrying the most relayed-only links; restart them `relay_outage` s later."""
        links = [(pair, self._relays_of(pair)) for pair in self.pairs
                 if pair.dialer.relay.connection_kind(pair.target.peer_id) == RELAYED]
        victims = self._victims([relay for _, relays in links for relay in relays])
        killed = {victim.peer_id for victim in victims}
        restart = self.restart
        restart.relay = ", ".join(victim.sim_node.name for victim in victims)
        restart.killed_at = trio.current_time()
        restart.relayed_links = len(links)
        restart.through_it = sum(bool(killed.intersection(relays)) for _, relays in links)
        restart.with_two_slots_before = self._with_two_slots()
        restart.members = len(self.members)
        self.progress(f"t={restart.killed_at:.1f}s: killing {restart.relay} "
                      f"({restart.through_it} of {len(links)} relayed links go through it)")
        for victim in victims:
            self.sim.crash(victim.sim_node)
        async with trio.open_nursery() as nursery:
            for victim in victims:
                nursery.start_soon(self._restart_later, victim)
            await self._watch_links([pair for pair, _ in links])
        restart.with_two_slots_after = self._with_two_slots()

    def _victims(self, relays_in_use: list[str]) -> list[_Member]:
        """The relays most relayed connections go through; without any, those most reservations are on."""
        load = Counter(relays_in_use)
        if not load:
            load = Counter(relay for member in self.members for relay in member.relay.reserved)
        ranked = sorted(enumerate(self.relays), key=lambda item: (-load[item[1].peer_id], item[0]))
        return [member for _, member in ranked[: max(1, self.config.relays_killed)]]

    def _relays_of(self, pair: _Pair) -> list[str]:
        """The relays the dialer's relayed connections to the target go through (read from their addresses)."""
        host = pair.dialer.sim_node.host
        if host is None:
            return []
        found = []
        for conn in host.get_network().get_connections(ID.from_base58(pair.target.peer_id)):
            for address in facts_of(conn).addrs:
                if "/p2p-circuit" in address:
                    found.append(address.split("/p2p-circuit")[0].rsplit("/p2p/", 1)[-1])
        return found

    async def _restart_later(self, victim: _Member) -> None:
        await trio.sleep(self.config.relay_outage)
        victim.reach, victim.relay = self._services(victim.sim_node, "on", generation=1)
        victim.sim_node.services = [victim.reach, victim.relay]
        await self.sim.restart(victim.sim_node)
        self.progress(f"t={trio.current_time():.1f}s: {victim.sim_node.name} is back")

    async def _watch_links(self, pairs: list[_Pair]) -> None:
        """Until `recovery_wait` s after the kill: which links went down, and when each came back."""
        killed_at = self.restart.killed_at
        assert killed_at is not None
        down: set[int] = set()
        back: dict[int, float] = {}
        while trio.current_time() < killed_at + self.config.recovery_wait:
            for index, pair in enumerate(pairs):
                connected = pair.dialer.relay.connection_kind(pair.target.peer_id) is not None
                if not connected:
                    down.add(index)
                elif index in down and index not in back:
                    back[index] = trio.current_time() - killed_at
            await trio.sleep(POLL)
        self.restart.cut = len(down)
        self.restart.back_after = sorted(back.values())

    def _with_two_slots(self) -> int:
        return sum(len(member.relay.reserved) >= 2 for member in self.members)

    # --- what one run hands over ---------------------------------------------------------------

    def record(self) -> RunRecord:
        errors: Counter[str] = Counter()
        for node in self.sim.nodes.values():
            errors.update(node.errors)
        return RunRecord(
            seed=self.sim.seed, relays=len(self.relays), pairs=[pair.record for pair in self.pairs],
            verdicts=self._verdict_rows(), errors=errors, restart=self.restart,
            virtual_seconds=round(trio.current_time(), 3),
        )

    def _verdict_rows(self) -> list[list]:
        rows = []
        for kind in self.kinds:
            members = [member for member in self.members if member.kind == kind]
            verdicts = Counter(member.reach.verdict for member in members)
            counts = [verdicts[verdict] for verdict in (PUBLIC, "private", "unknown")]
            slots = [sum(len(member.relay.reserved) >= least for member in members) for least in (1, 2)]
            rows.append([kind.label, len(members), *counts, *slots])
        return rows


def run(*, nodes: int = 30, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario for seeds `seed` .. `seed + seeds - 1` and return the report pooling them."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.relays < 3 or config.nodes < config.relays + 2:
        raise ValueError(f"need at least 3 relays and 2 more nodes (got {config.relays} relays, {config.nodes} nodes)")
    if config.topology not in TOPOLOGIES:
        raise ValueError(f"no topology {config.topology!r}; known: {', '.join(TOPOLOGIES)}")
    if config.seeds < 1:
        raise ValueError("seeds must be at least 1")
    records = []
    for run_seed in range(seed, seed + config.seeds):
        if config.seeds > 1:
            progress(f"seed {run_seed} ({run_seed - seed + 1} of {config.seeds})")
        records.append(run_one(config, run_seed, progress))
    return report(asdict(config), records, [kind.label for kind in TOPOLOGIES[config.topology]])


def run_one(config: Config, seed: int, progress: Progress = lambda line: None) -> RunRecord:
    """One run of the scenario, as a record for `nat_report`."""

    async def main(sim: Simulation) -> RunRecord:
        state = _Run(sim, config, progress)
        state.build()
        await state.run()
        return state.record()

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
