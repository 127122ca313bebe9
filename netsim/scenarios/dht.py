"""Scenario `dht`: do lookups in the real Kademlia DHT succeed while nodes come and go?

Every node runs `locomesh.dht.discovery.Discovery` (py-libp2p's KadDHT with
locomesh's lookups and maintenance) on a real host, over the simulated network.
All nodes are public: this scenario measures the DHT, not NAT traversal (that
is `connectivity`'s). Story, in virtual time:

1. A few **seed** nodes start and connect to each other.
2. The other nodes join at random times over `join_window` seconds: each
   dials one random seed; `Discovery` puts it in the routing table and runs
   its first refresh lookup, which fills the table with the node's
   neighbourhood. A share `churn` of them are **churners**: half of those are
   online from the start, the other half are *new* and first join during the
   lookup phase.
3. `records` stable nodes each publish a signed public run manifest
   (`Discovery.publish_run`: the value under ``/locomesh/run/<id>`` at the K
   closest peers, and a provider record for the same key).
4. The lookup phase (`lookup_window` seconds): `lookups` lookups at random
   times, each by a random online node whose table is seeded, for a random
   published run; they alternate between a value get (`find_run`, success:
   the manifest, validated) and a provider lookup (`find_providers` with
   `provider_limit`, success: the publisher is named). Meanwhile churners
   crash as a Poisson process (about one crash per churner per `session`
   seconds) and come back after an exponential `downtime` with a fresh host
   and an empty table (they bootstrap again off a seed); new churners join.

Reported: success rate per kind, latency percentiles (virtual seconds, from
the call to its answer, a 20 s timeout counting as a failure), and DHT
requests per lookup (every Kademlia request the looking node sent: a
looking node runs one lookup at a time, so its request count over the lookup
is the lookup's). Kademlia's hop count is not visible from outside its walk,
so requests stand in for it. The verdict: at least `min_success` of the
lookups succeeded.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import trio

from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.dht.kad_client import KadStreamPool
from locomesh.protocol.runs import run_id, sign_manifest

from .. import clock
from ..links import LinkProfile
from ..node import SimNode
from ..report import counted, criterion, glossary, percentile, table, verdict
from ..simulation import Simulation, run_simulation
from . import glossaries
from .options import option

Progress = Callable[[str], None]
KINDS = ("value", "providers")
STOP_TIMEOUT = 30.0  # virtual seconds a crashed node's host gets to finish stopping before a restart


@dataclass(frozen=True)
class Config:
    nodes: int = 100
    seeds: int = option(0, "seed nodes, the first contacts of every node (0: one per 100 nodes, at least 3)")
    churn: float = option(0.2, "share of the other nodes that come and go (crash, come back, or join late)")
    records: int = option(0, "runs published in the DHT (0: one per 10 nodes, at least 5)")
    lookups: int = option(0, "lookups made while nodes come and go (0: as many as nodes)")
    join_window: float = option(30.0, "virtual seconds over which the nodes start, at random times")
    settle: float = option(30.0, "virtual seconds after the joins before the runs are published")
    lookup_window: float = option(120.0, "virtual seconds over which the lookups happen")
    session: float = option(120.0, "a churning node's mean virtual seconds online between crashes")
    downtime: float = option(30.0, "a crashed node's mean virtual seconds offline")
    provider_limit: int = option(1, "providers a provider lookup asks for before it stops")
    min_success: float = option(0.99, "verdict: the share of lookups that must find what they looked for")

    @property
    def seed_count(self) -> int:
        return self.seeds or max(3, self.nodes // 100)

    @property
    def record_count(self) -> int:
        return self.records or max(5, self.nodes // 10)

    @property
    def lookup_count(self) -> int:
        return self.lookups or self.nodes


class _CountingPool(KadStreamPool):
    """The DHT's request pool, counting the requests its node sends."""

    def __init__(self, host) -> None:  # py-libp2p's IHost
        super().__init__(host)
        self.requests = 0

    async def request(self, peer, message):  # as in KadStreamPool
        self.requests += 1
        return await super().request(peer, message)


@dataclass
class _Lookup:
    kind: str
    ok: bool
    seconds: float
    requests: int
    looker_churns: bool
    error: str = ""


@dataclass
class _Published:
    key: str
    run: bytes
    manifest: bytes
    publisher: str


@dataclass
class _Counts:
    crashes: int = 0
    restarts: int = 0
    new_joins: int = 0
    bootstrap_failures: int = 0
    publish_failures: int = 0
    lookups_skipped: int = 0  # no online, seeded, idle node at that moment
    stuck_shutdowns: int = 0  # crashed nodes whose host never finished stopping (not restarted)
    table_sizes: list[int] = field(default_factory=list)


class _Run:
    """The state of one `dht` run."""

    def __init__(self, sim: Simulation, config: Config, progress: Progress) -> None:
        self.sim, self.config, self.progress = sim, config, progress
        self.rng = sim.rng_for("dht")
        self.seeds: list[SimNode] = []
        self.stable: list[SimNode] = []
        self.churners: list[SimNode] = []
        self.discovery: dict[str, Discovery] = {}  # the running node's (a restart makes a new one)
        self.ready: set[str] = set()  # running, table seeded
        self.busy: set[str] = set()  # running a lookup
        self.published: list[_Published] = []
        self.lookups: list[_Lookup] = []
        self.counts = _Counts()

    # --- population -----------------------------------------------------------------------------

    def build(self) -> None:
        for index in range(self.config.seed_count):
            self.seeds.append(self.sim.add_node(f"seed{index:02d}", profile=LinkProfile(latency=0.01)))
        others = self.config.nodes - self.config.seed_count
        churning = round(others * self.config.churn)
        for index in range(others):
            profile = LinkProfile(latency=round(self.rng.uniform(0.005, 0.05), 4), jitter=0.002)
            node = self.sim.add_node(f"n{index:04d}", profile=profile)
            (self.churners if index < churning else self.stable).append(node)

    async def _bring_up(self, node: SimNode) -> None:
        """Start (or restart) `node` with a fresh `Discovery`, bootstrapped off a random seed."""
        if not node.running:
            await self.sim.start(node)
        if node.nursery is None:
            return  # crashed at once; the churn brings it back
        discovery = Discovery(node.host, node.identity, clock=clock.wall, rng=random.Random(self.rng.getrandbits(64)))
        discovery.dht.pool = _CountingPool(node.host)
        self.discovery[node.name] = discovery
        try:
            await node.nursery.start(discovery.run)
        except RuntimeError:  # the node crashed while its DHT was starting
            return
        node.nursery.start_soon(self._bootstrap, node, discovery)

    async def _bootstrap(self, node: SimNode, discovery: Discovery) -> None:
        for seed in self.rng.sample(self.seeds, len(self.seeds)):
            if seed is not node and await node.connect(seed.peer_id, seed.listen_addr):
                break
        else:
            if node not in self.seeds:
                self.counts.bootstrap_failures += 1
        await discovery.wait_seeded()
        self.ready.add(node.name)

    def _on_churn(self, kind: str, node: SimNode) -> None:
        if kind == "crash":
            self.counts.crashes += 1
            self.ready.discard(node.name)
        else:
            self.counts.restarts += 1
            self.sim.nursery.start_soon(self._bring_up, node)

    # --- the story ------------------------------------------------------------------------------

    async def run(self) -> None:
        for node in self.seeds:
            await self._bring_up(node)
        half = len(self.churners) // 2
        early, late = self.stable + self.churners[:half], self.churners[half:]
        self.progress(f"{len(self.seeds)} seeds up; {len(early)} nodes joining, {len(late)} join later")
        async with trio.open_nursery() as nursery:
            for node in early:
                nursery.start_soon(self._join_at, node, self.rng.uniform(0, self.config.join_window))
        await trio.sleep(self.config.settle)
        self.progress(f"t={trio.current_time():.1f}s: {len(self.ready)} nodes seeded; publishing")
        await self._publish()
        self.progress(f"t={trio.current_time():.1f}s: {len(self.published)} runs published; lookups under churn")
        await self._lookup_phase(late)
        self.counts.table_sizes = [self.discovery[name].routing_table_size() for name in sorted(self.ready)]
        self.progress(f"t={trio.current_time():.1f}s: done")

    async def _join_at(self, node: SimNode, at: float) -> None:
        await trio.sleep_until(at)
        await self._bring_up(node)

    async def _publish(self) -> None:
        publishers = self.rng.sample(self.stable, min(self.config.record_count, len(self.stable)))

        async def one(node: SimNode, delay: float) -> None:
            await trio.sleep(delay)
            manifest = sign_manifest(node.identity, task="toy", name=node.name, created=int(clock.wall()), public=True)
            try:
                await self.discovery[node.name].publish_run(manifest)
            except DiscoveryError:
                self.counts.publish_failures += 1
                return
            self.published.append(
                _Published(records.run_key(run_id(manifest)), run_id(manifest), manifest, node.identity.peer_id)
            )

        async with trio.open_nursery() as nursery:
            for node in publishers:
                nursery.start_soon(one, node, self.rng.uniform(0, 5.0))
        self.published.sort(key=lambda entry: entry.key)  # finishing order is not part of the story

    async def _lookup_phase(self, late: list[SimNode]) -> None:
        window, start = self.config.lookup_window, trio.current_time()
        async with trio.open_nursery() as nursery:
            if self.churners:
                nursery.start_soon(self._churn, start + window)
            for node in late:
                nursery.start_soon(self._join_late, node, start + self.rng.uniform(0, window))
            times = sorted(start + self.rng.uniform(0, window) for _ in range(self.config.lookup_count))
            for index, at in enumerate(times):
                await trio.sleep_until(at)
                self._start_lookup(nursery, KINDS[index % 2], random.Random(self.rng.getrandbits(64)))

    async def _churn(self, until: float) -> None:
        """Crash running churners as a Poisson process until `until`; each comes back after its downtime.

        Not `faults.churn`: a restart there waits without bound for the crashed host to finish
        shutting down, and one such shutdown (py-libp2p's, under a crash mid-exchange) never
        ended, which stalled the whole run. Here a node that has not stopped within
        `STOP_TIMEOUT` stays down and is counted."""
        rng = random.Random(self.rng.getrandbits(64))
        rate = len(self.churners) / self.config.session
        async with trio.open_nursery() as nursery:
            while (at := trio.current_time() + rng.expovariate(rate)) < until:
                await trio.sleep_until(at)
                running = [node for node in self.churners if node.running]
                if running:
                    victim = rng.choice(running)
                    self.sim.crash(victim)
                    self._on_churn("crash", victim)
                    nursery.start_soon(self._restart_later, victim, rng.expovariate(1 / self.config.downtime))

    async def _restart_later(self, node: SimNode, delay: float) -> None:
        await trio.sleep(delay)
        with trio.move_on_after(STOP_TIMEOUT):
            await node.wait_stopped()
        if node.running or node.node is not None:
            self.counts.stuck_shutdowns += 1
            return
        self.sim.network.recover(node.interface)
        await self.sim.start(node)
        self._on_churn("restart", node)

    async def _join_late(self, node: SimNode, at: float) -> None:
        await trio.sleep_until(at)
        if not node.running:  # not restarted by the churn already
            self.counts.new_joins += 1
            await self._bring_up(node)

    def _start_lookup(self, nursery: trio.Nursery, kind: str, rng: random.Random) -> None:
        idle = sorted(name for name in self.ready - self.busy if self.sim.nodes[name].running)
        if not idle or not self.published:
            self.counts.lookups_skipped += 1
            return
        looker = self.sim.nodes[rng.choice(idle)]
        nursery.start_soon(self._look_up, looker, kind, rng.choice(self.published))

    async def _look_up(self, node: SimNode, kind: str, target: _Published) -> None:
        discovery = self.discovery[node.name]
        pool = discovery.dht.pool
        assert isinstance(pool, _CountingPool)
        self.busy.add(node.name)
        before, started = pool.requests, trio.current_time()
        ok, error = False, ""
        try:
            if kind == "value":
                found = await discovery.find_run(target.run)
                ok = found is not None and found[0] == target.manifest
            else:
                providers = await discovery.find_providers(target.key, limit=self.config.provider_limit)
                ok = any(str(info.peer_id) == target.publisher for info in providers)
            error = "" if ok else "not found"
        except DiscoveryError:
            error = "timeout"
        finally:
            self.busy.discard(node.name)
        if not node.running:
            return  # it crashed mid-lookup: the lookup says nothing about the DHT
        self.lookups.append(_Lookup(kind, ok, trio.current_time() - started, pool.requests - before,
                                    node in self.churners, error))

    # --- reporting ------------------------------------------------------------------------------

    def report(self) -> dict:
        return {
            "scenario": "dht",
            "overview": self._overview(),
            "verdict": verdict(self._criteria()),
            "config": asdict(self.config),
            "summary": self._summary(),
            "tables": [self._lookup_table(), self._failure_table()],
            "glossary": glossary(glossaries.DHT),
        }

    def _success_rate(self) -> float | None:
        return round(sum(lookup.ok for lookup in self.lookups) / len(self.lookups), 4) if self.lookups else None

    def _overview(self) -> str:
        rate = self._success_rate()
        found = "none ran" if rate is None else f"{rate:.1%} found what they looked for"
        churn = (f"{counted(self.counts.crashes, 'crash', 'crashes')}, {counted(self.counts.restarts, 'restart')}, "
                 f"{counted(self.counts.new_joins, 'late join')}")
        return (
            f"{self.config.nodes} simulated nodes joined a Kademlia DHT (the daemon's own code) through "
            f"{len(self.seeds)} seed nodes, and {counted(len(self.published), 'node')} published a training run each. "
            f"Then, while {counted(len(self.churners), 'node')} came and went ({churn}), random nodes made "
            f"{counted(len(self.lookups), 'lookup')} for those runs, by value and by provider: {found}."
        )

    def _criteria(self) -> list[dict]:
        rate = self._success_rate()
        return [criterion(f"at least {self.config.min_success:.0%} of the lookups found the run or its publisher",
                          "no lookups" if rate is None else rate,
                          rate is not None and rate >= self.config.min_success)]

    def _summary(self) -> dict:
        done = self.lookups
        ok = [lookup for lookup in done if lookup.ok]
        tables = self.counts.table_sizes
        return {
            "seed": self.sim.seed,
            "nodes": self.config.nodes,
            "seed nodes": len(self.seeds),
            "churning nodes": len(self.churners),
            "crashes": self.counts.crashes,
            "restarts": self.counts.restarts,
            "new nodes joined during lookups": self.counts.new_joins,
            "bootstrap failures": self.counts.bootstrap_failures,
            "crashed nodes that never stopped (not restarted)": self.counts.stuck_shutdowns,
            "runs published": len(self.published),
            "publish failures": self.counts.publish_failures,
            "lookups": len(done),
            "lookups skipped (no idle seeded node)": self.counts.lookups_skipped,
            "lookup success rate": self._success_rate(),
            "latency p50 s": _rounded(percentile([lookup.seconds for lookup in ok], 50)),
            "latency p99 s": _rounded(percentile([lookup.seconds for lookup in ok], 99)),
            "routing table size at end (median)": percentile(tables, 50),
            "connection attempts (all)": len(self.sim.network.dials),
            "virtual seconds": round(trio.current_time(), 3),
        }

    def _lookup_table(self) -> dict:
        rows = []
        groups = [(kind, who) for kind in KINDS for who in ("stable", "churner")] + [("all", "all")]
        for kind, who in groups:
            chosen = [
                lookup for lookup in self.lookups
                if kind in ("all", lookup.kind) and who in ("all", "churner" if lookup.looker_churns else "stable")
            ]
            if not chosen:
                continue
            seconds = [lookup.seconds for lookup in chosen if lookup.ok]
            requests = [lookup.requests for lookup in chosen]
            rows.append([
                kind, who, len(chosen), len(seconds), round(len(seconds) / len(chosen), 4),
                *(_rounded(percentile(seconds, q)) for q in (50, 90, 99)), _rounded(max(seconds, default=None)),
                round(sum(requests) / len(requests), 2), percentile(requests, 99),
            ])
        return table(
            "Lookups under churn, by kind and by who looked",
            ["kind", "looker", "lookups", "succeeded", "success rate", "p50 s", "p90 s", "p99 s", "max s",
             "requests mean", "requests p99"],
            rows,
            note="Latency: virtual seconds of successful lookups. Requests: Kademlia requests the looking node "
            "sent during the lookup. A lookup whose node crashed mid-way is not counted.",
        )

    def _failure_table(self) -> dict:
        reasons = Counter((lookup.kind, lookup.error) for lookup in self.lookups if not lookup.ok)
        rows = [[kind, reason, count] for (kind, reason), count in sorted(reasons.items())]
        return table("Failed lookups", ["kind", "reason", "count"], rows,
                     note="not found: the walk ended without the record; timeout: no answer within 20 s.")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def run(*, nodes: int = 100, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.nodes < config.seed_count + 3:
        raise ValueError(f"need at least {config.seed_count + 3} nodes ({config.seed_count} seeds and 3 others)")

    async def main(sim: Simulation) -> dict:
        state = _Run(sim, config, progress)
        state.build()
        await state.run()
        return state.report()

    return run_simulation(seed, main)
