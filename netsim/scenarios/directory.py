"""Scenario `directory`: do nodes that know no run ID find every public run in the DHT's directory?

Every node runs `locomesh.dht.discovery.Discovery` on a real host over the simulated network (all
public, no churn: this measures the directory, `dht` measures lookups under churn). Story, in
virtual time:

1. A few **seed** nodes start and connect; the others join over `join_window` seconds, each
   bootstrapping off a random seed.
2. After `settle` seconds, `runs` public runs start: a creator signs the manifest and publishes it
   (`Discovery.publish_run`), and `members` nodes (the creator among them) join it and provide its
   run key, as a daemon does when it takes a run up (browsers verify keepers by it). Their CRDT
   replicas hold the same join ops (handed over in memory: replication is not what is measured),
   and each member runs the real `node.runs.cards.CardPublisher`, which decides from its replica
   whether it is one of the run's card keepers, and if so publishes its cards and provides the
   directory key.
3. After `publish_wait` seconds, `browsers` nodes that are members of no run and were given no
   run ID call the real `node.runs.directory.browse`; each browse succeeds if it lists every run,
   with its member count right.

Reported: runs found per browse, the keepers per run, browse latency (virtual seconds) and the
DHT requests a browse sent.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

import trio

from locomesh.crdt import Genesis, Replica
from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.node.runs.cards import CardPublisher, card_keepers
from locomesh.node.runs.directory import browse
from locomesh.protocol.runs import run_id, short_run_id, sign_manifest
from locomesh.training.run_settings import default_hparams

from .. import clock
from ..offload import run_inline
from ..links import LinkProfile
from ..node import SimNode
from ..report import criterion, glossary, percentile, table, verdict
from ..simulation import Simulation, run_simulation
from .dht import _CountingPool
from .options import option

Progress = Callable[[str], None]
TASK, TASK_CONFIG = "synthetic-lm", {"alphabet": 32}


GLOSSARY = {
    "DHT": "distributed hash table: a directory spread over all nodes, with no server; each entry is kept by "
           "the few nodes whose IDs are closest to its key (Kademlia)",
    "public run": "a training run whose description (its signed manifest) is published in the DHT, so anyone may join",
    "run card": "a short signed summary of a public run (task, model size, memory and bandwidth it needs, members, "
                "rounds) that a few of its members publish in the DHT",
    "card keepers": "the few members of a run that publish its card; every member works out the same ones",
    "browse": "`locomesh run browse`: list the public runs from their cards, knowing no run ID beforehand",
    "member counts right": "runs a browse listed with the number of members the run really has",
    "DHT requests": "requests to other nodes that one browse sent",
}


@dataclass(frozen=True)
class Config:
    nodes: int = 200
    seeds: int = option(0, "seed nodes, the first contacts of every node (0: one per 100 nodes, at least 3)")
    runs: int = option(4, "public runs started")
    members: int = option(6, "members of each run, its creator included")
    browsers: int = option(3, "nodes, members of no run and told no run ID, that browse the directory")
    join_window: float = option(30.0, "virtual seconds over which the nodes start, at random times")
    settle: float = option(30.0, "virtual seconds after the joins before the runs start")
    publish_wait: float = option(30.0, "virtual seconds between the runs' start and the browses")
    poll_interval: float = option(5.0, "virtual seconds between a member's looks at its runs (card publishing)")

    @property
    def seed_count(self) -> int:
        return self.seeds or max(3, self.nodes // 100)


@dataclass
class _Browse:
    browser: str
    found: int
    members_right: int
    seconds: float
    requests: int
    keepers_found: int


class _Run:
    """The state of one `directory` run."""

    def __init__(self, sim: Simulation, config: Config, progress: Progress) -> None:
        self.sim, self.config, self.progress = sim, config, progress
        self.rng = sim.rng_for("directory")
        self.seeds: list[SimNode] = []
        self.others: list[SimNode] = []
        self.discovery: dict[str, Discovery] = {}
        self.replicas: dict[str, list[Replica]] = {}  # node -> the replicas of the runs it is a member of
        self.publishers: dict[str, CardPublisher] = {}
        self.run_ids: list[bytes] = []
        self.keepers: dict[bytes, int] = {}
        self.publish_failures = 0
        self.browses: list[_Browse] = []

    def build(self) -> None:
        for index in range(self.config.seed_count):
            self.seeds.append(self.sim.add_node(f"seed{index:02d}", profile=LinkProfile(latency=0.01)))
        for index in range(self.config.nodes - self.config.seed_count):
            profile = LinkProfile(latency=round(self.rng.uniform(0.005, 0.05), 4), jitter=0.002)
            self.others.append(self.sim.add_node(f"n{index:04d}", profile=profile))

    async def _bring_up(self, node: SimNode, at: float = 0.0) -> None:
        await trio.sleep_until(at)
        await self.sim.start(node)
        discovery = Discovery(node.host, node.identity, clock=clock.wall, rng=random.Random(self.rng.getrandbits(64)))
        discovery.dht.pool = _CountingPool(node.host)
        self.discovery[node.name] = discovery
        await node.nursery.start(discovery.run)
        for seed in self.rng.sample(self.seeds, len(self.seeds)):
            if seed is not node and await node.connect(seed.peer_id, seed.listen_addr):
                break

    async def run(self) -> None:
        for node in self.seeds:
            await self._bring_up(node)
        async with trio.open_nursery() as nursery:
            for node in self.others:
                nursery.start_soon(self._bring_up, node, self.rng.uniform(0, self.config.join_window))
        await trio.sleep(self.config.settle)
        self.progress(f"t={trio.current_time():.1f}s: {len(self.discovery)} nodes up; starting {self.config.runs} runs")
        await self._start_runs()
        await trio.sleep(self.config.publish_wait)
        self.progress(f"t={trio.current_time():.1f}s: browsing from {self.config.browsers} nodes that know no run")
        await self._browse_all()
        self.progress(f"t={trio.current_time():.1f}s: done")

    async def _start_runs(self) -> None:
        chosen = self.rng.sample(self.others, self.config.runs * self.config.members + self.config.browsers)
        self.browser_nodes = chosen[self.config.runs * self.config.members :]
        for index in range(self.config.runs):
            members = chosen[index * self.config.members : (index + 1) * self.config.members]
            await self._start_run(index, members)
        for name in sorted(self.replicas):
            node = self.sim.nodes[name]
            publisher = CardPublisher(self.discovery[name], lambda name=name: self.replicas[name], offload=run_inline,
                                      poll_interval=self.config.poll_interval)
            self.publishers[name] = publisher
            node.nursery.start_soon(self._publish_later, publisher, self.rng.uniform(0, self.config.poll_interval))

    async def _start_run(self, index: int, members: list[SimNode]) -> None:
        creator = members[0]
        manifest = sign_manifest(creator.identity, task=TASK, name=f"run{index}", task_config=TASK_CONFIG,
                                 hparams=default_hparams(), seed=index, public=True, created=int(clock.wall()) - index)
        self.run_ids.append(run_id(manifest))
        try:
            await self.discovery[creator.name].publish_run(manifest)
        except DiscoveryError:
            self.publish_failures += 1
        writer = Replica(Genesis.from_manifest(manifest))
        ops = [writer.create(member.identity, "join", round=1) for member in members]
        for member in members[1:]:  # a member provides the run key when it takes the run up (node/rounds/meeting.py)
            with contextlib.suppress(DiscoveryError):
                await self.discovery[member.name].provide(records.run_key(run_id(manifest)))
        for member in members:
            replica = Replica(Genesis.from_manifest(manifest))
            for op in ops:
                replica.add(op)
            self.replicas.setdefault(member.name, []).append(replica)
        keys = [member.identity.public_key for member in members]
        self.keepers[run_id(manifest)] = len(card_keepers(run_id(manifest), keys, creator.identity.public_key))

    async def _publish_later(self, publisher: CardPublisher, delay: float) -> None:
        await trio.sleep(delay)
        await publisher.run()

    async def _browse_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for node in self.browser_nodes:
                nursery.start_soon(self._browse, node)
        self.browses.sort(key=lambda entry: entry.browser)

    async def _browse(self, node: SimNode) -> None:
        discovery = self.discovery[node.name]
        pool = discovery.dht.pool
        assert isinstance(pool, _CountingPool)
        before, started = pool.requests, trio.current_time()
        result = await browse(discovery)
        listed = {listing.run_id: listing for listing in result.listings}
        found = [run for run in self.run_ids if run in listed]
        right = [run for run in found if listed[run].members == self.config.members]
        self.browses.append(_Browse(node.name, len(found), len(right), trio.current_time() - started,
                                    pool.requests - before, result.keepers_found))

    # --- reporting ------------------------------------------------------------------------------

    def report(self) -> dict:
        browses = self.browses
        complete = [entry for entry in browses if entry.found == len(self.run_ids)]
        summary = {
            "seed": self.sim.seed,
            "nodes": self.config.nodes,
            "public runs": len(self.run_ids),
            "members per run": self.config.members,
            "card keepers per run": sorted(self.keepers.values()),
            "manifest publish failures": self.publish_failures,
            "browses": len(browses),
            "browses that found every run": len(complete),
            "runs found (all browses)": sum(entry.found for entry in browses),
            "member counts right": sum(entry.members_right for entry in browses),
            "browse latency p50 s": _rounded(percentile([entry.seconds for entry in browses], 50)),
            "browse latency max s": _rounded(max((entry.seconds for entry in browses), default=None)),
            "DHT requests per browse (median)": percentile([entry.requests for entry in browses], 50),
            "virtual seconds": round(trio.current_time(), 3),
        }
        criteria = [
            criterion("every browse listed every public run", f"{len(complete)} of {len(browses)} browses",
                      bool(browses) and len(complete) == len(browses)),
            criterion("every listed run showed its true member count",
                      f"{summary['member counts right']} of {summary['runs found (all browses)']}",
                      summary["member counts right"] == summary["runs found (all browses)"]),
        ]
        overview = (f"{self.config.nodes} simulated nodes joined a Kademlia DHT (the daemon's own code); "
                    f"{len(self.run_ids)} public runs of {self.config.members} members each published their cards "
                    f"through their card keepers, and {len(browses)} nodes that knew no run ID browsed the "
                    f"directory: {len(complete)} of them found every run.")
        rows = [[entry.browser, f"{entry.found}/{len(self.run_ids)}", entry.members_right, entry.keepers_found,
                 _rounded(entry.seconds), entry.requests] for entry in browses]
        runs = [[short_run_id(run), self.keepers[run]] for run in self.run_ids]
        return {
            "scenario": "directory",
            "overview": overview,
            "verdict": verdict(criteria),
            "config": asdict(self.config),
            "summary": summary,
            "tables": [
                table("Browses from nodes that know no run ID",
                      ["browser", "runs found", "member counts right", "keepers found", "seconds", "DHT requests"],
                      rows, note="Seconds: virtual. DHT requests: every Kademlia request the browsing node sent."),
                table("Public runs", ["run", "card keepers"], runs,
                      note="Card keepers: the members whose cards list the run (node/runs/cards.py)."),
            ],
            "glossary": glossary(GLOSSARY, common=("seed", "virtual seconds", "p50, p90, p99")),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run(*, nodes: int = 200, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    needed = config.seed_count + config.runs * config.members + config.browsers
    if config.nodes < needed:
        raise ValueError(f"need at least {needed} nodes ({config.seed_count} seeds, {config.runs} runs of "
                         f"{config.members} members, {config.browsers} browsers)")

    async def main(sim: Simulation) -> dict:
        state = _Run(sim, config, progress)
        state.build()
        await state.run()
        return state.report()

    return run_simulation(seed, main)
