"""Scenario `train`: N nodes train one run together with the daemon's real round protocol.

Every node runs the services a daemon runs for training, built by the daemon's own assembly
(`locomesh.node.assembly.node_services`), on a real host over the simulated network:
`RunRegistryService` (its DHT), `CrdtService` (the run's replicated state, GossipSub),
`CheckpointService` (payloads and states travel as content-addressed checkpoints, on libp2p
streams: no data plane) and `RoundService`, whose participant is a `SimParticipant`
(`netsim/sim_participant.py`): training costs `inner_steps x step_seconds` of *virtual* time
instead of CPU, and a payload is `payload_bytes` of seeded bytes. Store work runs inline
(`netsim/offload.py`); ping and the NAT-traversal services are left out (the `nat` scenario
covers them). Everything else (commits,
the cutoff and proposals, fetching every payload, aggregation of the same set, votes,
certificates, syncs) is the code the daemon runs.

The run:

1. node 0 creates a public run (a signed manifest with min_peers = N, so round 1 starts once
   everyone has joined) and joins it; the others start at random times over `join_window`,
   bootstrap their DHT off node 0, and join with `RoundService.join(manifest)`, which finds the
   run's participants in the DHT, connects to them and pulls the run's CRDT state;
2. they train `rounds` rounds. Options: `slow` nodes whose steps take `slow_factor` times
   longer; `byzantine` nodes whose payloads are junk (the check in `SimParticipant.aggregate`,
   standing for the real decoder, leaves them out); `churn` nodes crash during round
   `churn_round` and as many fresh ones join then (they enter at a round boundary and sync),
   and again every `churn_every` rounds (crashed nodes drop out of the electorate after
   `crdt.view.ACTIVITY_WINDOW` rounds, so waves may add up to more than a third of the nodes);
   `delayed_updates`: the run trains with one-round-delayed outer updates, so a node's training
   of round r+1 overlaps the exchange of round r.

Measured (virtual time): per round, when it was first seen certified, how many payloads it
aggregated and how many peers had to sync; per node, the compute share: modelled training
seconds over the virtual seconds from its first training to its last finished round. The
verdict: every round certified, every live node reached the last one, the live honest nodes hold
one state, and each round's certified state is one an honest node computed itself.

What the defaults stand for: a payload of `payload_bytes` is the int8 pseudo-gradient of a
model with that many parameters; a round's compute is `inner_steps` steps of `step_seconds`.
Payload bytes travel through Python Noise and Yamux, so the defaults keep N x N x
payload_bytes per round at tens of MB (a few minutes of wall time for 32 nodes on 2 cores).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from locomesh.node.assembly import NodeServices, Pieces, node_services
from locomesh.node.config import NodeConfig
from locomesh.node.rounds.participation import RunParticipation
from locomesh.node.rounds.service import RoundService
from locomesh.node.runs.registry import DEFAULT_HPARAMS
from locomesh.node.exchange.shard_transfer import ShardService
from locomesh.node.transfer.service import CheckpointService
from locomesh.protocol.runs import load_manifest, sign_manifest

from .. import clock
from ..links import Capacity, LinkProfile
from ..node import SimNode
from ..offload import run_inline
from .. import adversaries
from ..adversaries import LyingSimParticipant, WithholdingCheckpointService, WithholdingShardService
from ..sim_participant import SimCompute, SimCost, SimParticipant
from ..simulation import Simulation, run_simulation
from .options import option
from .train_report import HOSTILE, MEGABIT, TrainReporting  # noqa: F401 - HOSTILE: re-exported

Progress = Callable[[str], None]
WATCH_SECONDS = 0.05  # virtual seconds between looks at the nodes' finished rounds (timing resolution)
RESTART_ROUND = 2  # a restarter is killed right after its commit in this round
RESTART_DELAY = 2.0  # virtual seconds it stays down


@dataclass(frozen=True)
class Config:
    nodes: int = 32
    rounds: int = option(3, "training rounds to run")
    uplink: float = option(100 * MEGABIT, "every node's upload capacity, bytes per second (100 Mbit/s)")
    downlink: float = option(100 * MEGABIT, "every node's download capacity, bytes per second (100 Mbit/s)")
    latency: float = option(0.05, "one-way delay of every node's link, seconds")
    buffer: int = option(4 * 1024 * 1024, "bytes in flight per connection (a grown TCP window)")
    inner_steps: int = option(500, "training steps each node takes per round (H)")
    step_seconds: float = option(0.2, "virtual seconds one step costs (500 x 0.2: 100 s of compute per round)")
    aggregate_seconds: float = option(0.0, "virtual seconds combining the round's payloads costs")
    payload_bytes: int = option(32 * 1024, "bytes of a node's per-round update (an int8 update of a model with "
                                           "this many parameters)")
    state_bytes: int = option(4096, "bytes of the shared model state a node downloads to catch up")
    round_deadline_s: int = option(600, "the run's round deadline, seconds")
    join_window: float = option(5.0, "virtual seconds over which the nodes join, at random times")
    slow: int = option(0, "nodes whose steps take `slow_factor` times longer")
    slow_factor: float = option(1.5, "how much slower the slow nodes train")
    byzantine: int = option(0, "hostile members whose updates are junk")
    withholding: int = option(0, "hostile members that commit to an update and never serve it")
    liars: int = option(0, "hostile members whose shard results are wrong (sharded exchange)")
    restarters: int = option(0, "honest members killed right after a commit and restarted on their data")
    crashers: int = option(0, "honest members killed 0.2-1.2 s after their commit in round 2 (some shards served), "
                              "for good")
    sybils: int = option(0, "extra hostile keys that join and vouch for a bogus checkpoint every round")
    bombers: int = option(0, "extra hostile keys that join and commit an oversized update every round")
    spammers: int = option(0, "extra hostile keys that join and flood the run's state past every limit")
    churn: int = option(0, "nodes that crash during round `churn_round`, replaced by as many new ones")
    churn_round: int = option(2, "the round of the first churn wave")
    churn_every: int = option(0, "rounds between churn waves after the first (0: one wave)")
    delayed_updates: bool = option(False, "one-round-delayed outer updates: round r+1 trains while round r is "
                                          "exchanged")
    exchange: str = option("allgather", "how payloads are exchanged: allgather, sharded, or auto "
                                        "(node/exchange/mode.py)")
    byzantine_fraction: float = option(0.2, "the Byzantine share the run's shard committees are sized for")
    shards: int = option(8, "shards of a payload in sharded exchange")
    run_timeout: float = option(3600.0, "virtual seconds after the last join before the run is stopped")


# A simulated node's pieces in the daemon's service assembly: store work inline (a worker thread's
# real duration would let virtual time run ahead), no data plane (the simulated network carries
# libp2p connections only), no ping or NAT traversal. A member adds its participant and compute.
SIMULATED = Pieces(offload=run_inline, dataplane=False, network=False, wall_clock=clock.wall)


@dataclass
class _Member:
    index: int
    node: SimNode
    kind: str  # honest, slow, joiner, restarter, or one of HOSTILE
    services: NodeServices
    compute: SimCompute
    crashed: bool = False
    done_at: dict[int, float] = field(default_factory=dict)  # round -> when we saw it finished here

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def rounds(self) -> RoundService:
        assert self.services.rounds is not None
        return self.services.rounds

    def participation(self, run_id: bytes) -> RunParticipation | None:
        entry = self.rounds.participations.get(run_id)
        return None if entry is None else entry[0]


@dataclass
class _Intruder:
    """A key that joins the run and writes hostile ops, with no honest part in the rounds
    (netsim/adversaries.py); it runs the registry, the CRDT and a checkpoint service."""

    node: SimNode
    kind: str  # sybil, bomber or spammer
    services: NodeServices  # no round service


class _Run(TrainReporting):
    """The state of one `train` run."""

    def __init__(self, sim: Simulation, config: Config, directory: Path, progress: Progress) -> None:
        self.sim, self.config, self.directory, self.progress = sim, config, directory, progress
        self.rng = sim.rng_for("train")
        self.members: list[_Member] = []
        self.intruders: list[_Intruder] = []
        self.manifest = b""
        self.run_id = b""
        self.started = 0.0  # virtual time the run was created

    # --- population -----------------------------------------------------------------------------

    def _add(self, kind: str) -> _Member:
        config, index = self.config, len(self.members)
        node = self.sim.add_node(f"n{index:04d}", profile=LinkProfile(latency=config.latency, buffer=config.buffer),
                                 capacity=Capacity(upload=config.uplink, download=config.downlink))
        member = _Member(index, node, kind, *self._services(node, kind))
        self.members.append(member)
        return member

    def _services(self, node: SimNode, kind: str) -> tuple[NodeServices, SimCompute]:
        """A member's services over its data dir, as a daemon starting on it builds them, with its
        modelled participant and compute (and, for a withholder, its hostile checkpoint service)."""
        config = self.config
        factor = config.slow_factor if kind == "slow" else 1.0
        cost = SimCost(step_seconds=config.step_seconds * factor, aggregate_seconds=config.aggregate_seconds,
                       payload_bytes=config.payload_bytes, state_bytes=config.state_bytes, shards=config.shards)

        def participant(body: Mapping[str, Any], key: bytes) -> SimParticipant:
            if kind == "liar":
                return LyingSimParticipant(body, key, cost)
            return SimParticipant(body, key, cost, byzantine=kind == "byzantine")

        compute = SimCompute()
        serving = WithholdingCheckpointService if kind == "withholding" else CheckpointService
        shards = WithholdingShardService if kind == "withholding" else ShardService
        pieces = replace(SIMULATED, participant_factory=participant, compute=compute, checkpoint_service=serving,
                         shard_service=shards)
        return node_services(NodeConfig(self.directory / node.name), pieces), compute

    def _add_intruder(self, kind: str) -> _Intruder:
        config = self.config
        node = self.sim.add_node(f"x{len(self.intruders):04d}", profile=LinkProfile(latency=config.latency, buffer=config.buffer),
                                 capacity=Capacity(upload=config.uplink, download=config.downlink))
        services = node_services(NodeConfig(self.directory / node.name), replace(SIMULATED, rounds=False))
        intruder = _Intruder(node, kind, services)
        self.intruders.append(intruder)
        return intruder

    async def _intrude(self, intruder: _Intruder, creator: _Member) -> None:
        """Start an intruder once the run is under way, pull the run's state and attack."""
        node, crdt = intruder.node, intruder.services.crdt
        await self.sim.start(node)
        await self._start_services(node, intruder.services)
        await node.connect(creator.node.peer_id, creator.node.listen_addr)
        await crdt.open_run(self.manifest)
        await crdt.pull(str(creator.node.peer_id), self.run_id)
        if intruder.kind == "sybil":
            await adversaries.attest_bogus_checkpoints(crdt, self.run_id, until_round=self.config.rounds)
        elif intruder.kind == "spammer":
            await adversaries.spam_ops(crdt, self.run_id, node.identity, until_round=self.config.rounds)
        else:
            await adversaries.commit_bombs(crdt, self.run_id, node.identity.public_key,
                                           intruder.services.checkpoints.directory,
                                           payload_bytes=self.config.payload_bytes, until_round=self.config.rounds)

    async def _start(self, member: _Member) -> None:
        await self.sim.start(member.node)
        await self._start_services(member.node, member.services)

    @staticmethod
    async def _start_services(node: SimNode, services: NodeServices) -> None:
        """Start `node`'s services on its running `Node`, in the daemon's order."""
        assert node.nursery is not None
        for service in services.in_start_order():
            await node.nursery.start(service.run, node.node)

    def _kinds(self) -> list[str]:
        config = self.config
        kinds = ["honest"] + ["byzantine"] * config.byzantine + ["withholding"] * config.withholding
        kinds += ["liar"] * config.liars
        kinds += ["restarter"] * config.restarters + ["crasher"] * config.crashers + ["slow"] * config.slow
        if len(kinds) > config.nodes:
            raise ValueError("byzantine + withholding + slow must leave at least one honest node (node 0, the creator)")
        return kinds + ["honest"] * (config.nodes - len(kinds))

    # --- the run --------------------------------------------------------------------------------

    async def train(self) -> None:
        kinds = self._kinds()
        rest = [kinds[0], *self.rng.sample(kinds[1:], len(kinds) - 1)]  # where the odd ones sit: seeded
        team = [self._add(kind) for kind in rest]
        creator = team[0]
        await self._start(creator)
        self._create_run(creator, team)
        await creator.rounds.join(self.manifest)
        self.progress(f"t={trio.current_time():.1f}s: run created; {self.config.nodes - 1} nodes joining")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, nursery.cancel_scope)
            async with trio.open_nursery() as joins:
                for member in team[1:]:
                    joins.start_soon(self._join, member, creator, self.rng.uniform(0, self.config.join_window))
            self.progress(f"t={trio.current_time():.1f}s: all {len(self.members)} nodes joined")
            config = self.config
            for kind in ["sybil"] * config.sybils + ["bomber"] * config.bombers + ["spammer"] * config.spammers:
                nursery.start_soon(self._intrude, self._add_intruder(kind), creator)
            for member in self.members:
                if member.kind in ("restarter", "crasher"):
                    nursery.start_soon(self._crash_after_commit, member, creator)
            if self.config.churn:
                nursery.start_soon(self._churn, creator)
            await trio.sleep(self.config.run_timeout)
            nursery.cancel_scope.cancel()

    def _create_run(self, creator: _Member, team: list[_Member]) -> None:
        """The run: public, its `team` admitted at genesis (a say from their join: the members a
        creator starts a run with); keys that come later are admitted by the creator (`_admit`)."""
        config = self.config
        # A liar is banned once caught (node/exchange/sharded.py): the run goes on without it.
        hparams = {**DEFAULT_HPARAMS, "min_peers": config.nodes - config.liars - config.crashers,
                   "round_deadline_s": config.round_deadline_s,
                   "inner_steps": config.inner_steps, "delayed_updates": config.delayed_updates,
                   "exchange": config.exchange, "byzantine_fraction": config.byzantine_fraction}
        self.manifest = sign_manifest(creator.node.identity, task="netsim", name="netsim train", seed=self.sim.seed,
                                      hparams=hparams, public=True, created=int(clock.wall()),
                                      admitted=[member.node.identity.public_key for member in team])
        self.run_id = load_manifest(self.manifest)[0]
        creator.services.registry.store.add(self.manifest, "created")
        self.started = trio.current_time()

    async def _join(self, member: _Member, creator: _Member, at: float) -> None:
        await trio.sleep_until(at)
        await self._start(member)
        assert member.services.registry.discovery is not None
        await member.node.connect(creator.node.peer_id, creator.node.listen_addr)
        await member.services.registry.discovery.wait_seeded()
        await member.rounds.join(self.manifest)

    async def _crash_after_commit(self, member: _Member, creator: _Member) -> None:
        """Kill a restarter (kill -9) right after its commit in round RESTART_ROUND, and start it
        again RESTART_DELAY later on its data dir: fresh services, its ops and payloads on disk.
        A crasher is killed a little later (the others fetched part of its payload) for good."""
        while True:
            participation = member.participation(self.run_id)
            work = None if participation is None else participation.work
            if work is not None and work.round >= RESTART_ROUND and work.committed:
                break
            await trio.sleep(WATCH_SECONDS)
        if member.kind == "crasher":
            await trio.sleep(self.rng.uniform(0.2, 1.2))
            member.crashed = True
            member.node.crash()
            self.progress(f"t={trio.current_time():.1f}s: {member.name} crashed after its commit in round {work.round}")
            return
        member.node.crash()
        self.progress(f"t={trio.current_time():.1f}s: {member.name} killed after its commit in round {work.round}")
        await trio.sleep(RESTART_DELAY)
        member.services, member.compute = self._services(member.node, member.kind)
        await self.sim.restart(member.node)
        await self._start_services(member.node, member.services)
        await member.node.connect(creator.node.peer_id, creator.node.listen_addr)
        self.progress(f"t={trio.current_time():.1f}s: {member.name} restarted on its data dir")

    async def _churn(self, creator: _Member) -> None:
        """While round `churn_round` trains (and every `churn_every` rounds after), crash `churn`
        nodes (never the creator) and start as many."""
        config = self.config
        wave_round = config.churn_round
        while wave_round <= config.rounds:
            await self._churn_wave(creator, wave_round)
            if not config.churn_every:
                return
            wave_round += config.churn_every

    async def _churn_wave(self, creator: _Member, wave_round: int) -> None:
        config = self.config
        while not any(wave_round - 1 in m.done_at for m in self.members) and wave_round > 1:
            await trio.sleep(WATCH_SECONDS)
        await trio.sleep(config.inner_steps * config.step_seconds / 2)
        victims = self.rng.sample([m for m in self.members[1:] if not m.crashed and m.kind != "crasher"], config.churn)
        for victim in victims:
            victim.crashed = True
            victim.node.crash()
        self.progress(f"t={trio.current_time():.1f}s: crashed {', '.join(v.name for v in victims)}")
        async with trio.open_nursery() as joins:
            for _ in range(config.churn):
                joiner = self._add("joiner")
                creator.services.crdt.write(self.run_id, "admit", key=joiner.node.identity.public_key)
                joins.start_soon(self._join, joiner, creator, trio.current_time())

    async def _watch(self, done: trio.CancelScope) -> None:
        """Note when each node comes to hold each round's certified state (by aggregating or by a
        sync); end the run once every live node has recorded the last round in its history (a
        banned one never will)."""
        while True:
            await trio.sleep(WATCH_SECONDS)
            for member in self.members:
                participation = None if member.crashed else member.participation(self.run_id)
                if participation is not None and participation.failure is not None:
                    raise RuntimeError(f"{member.name} stopped training: {participation.failure}")
                held = 0 if participation is None else participation.machine.state_round
                if held > 0 and held not in member.done_at:
                    member.done_at[held] = trio.current_time()
            live = [m for m in self.members if not m.crashed]
            going = [m for m in live if (p := m.participation(self.run_id)) is None or p.banned is None]
            everyone = len(live) >= self.config.nodes - self.config.crashers
            if everyone and all(self._recorded(m, self.config.rounds) for m in going):
                done.cancel()
                return

    def _recorded(self, member: _Member, round_number: int) -> bool:
        """Whether `member`'s history has `round_number` (written once its next evaluation ran)."""
        participation = member.participation(self.run_id)
        return participation is not None and any(r.round == round_number for r in participation.history)


def run(*, nodes: int = 32, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report (with the final state hash of every live node
    under ``"hashes"``)."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.nodes < 2:
        raise ValueError("need at least 2 nodes")
    if config.churn >= config.nodes / 3:
        raise ValueError("churn must stay under a third of the nodes (a wave's crashed peers count in the electorate "
                         "for a few rounds)")

    async def main(sim: Simulation) -> dict:
        with tempfile.TemporaryDirectory(prefix="locomesh-netsim-") as directory:
            state = _Run(sim, config, Path(directory), progress)
            await state.train()
            return {**state.report(), "hashes": state.final_hashes()}

    return run_simulation(seed, main)
