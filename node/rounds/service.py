"""Training together: join a run by ID, take part in its rounds, leave it.

A node service (see `locomesh.node.service`) beside the run registry, the CRDT and the checkpoint
service, whose parts it uses. RPC methods:

    run.join(run_id) -> {"run_id", "joins_at", "sitting_out", "outside_schedule"}: the first round it trains,
        unless it sits rounds out now (why; the schedule's windows when now is outside them)
    run.leave(run_id) -> {"run_id", "last_round"}
    run.pause(run_id) -> {"run_id", "paused", "after_round"}: sit rounds out, keep the state current (pauses.py)
    run.resume(run_id) -> {"run_id", "paused", "round"}: contribute again from the next round
    run.status(run_id) -> phase, what the round waits for, members (by peer ID: member_peers), and the
        finished rounds, kept in the data dir (history.py): for a run left, phase "left" and those rounds;
        for a run joined before a restart and not taken up again yet, phase "rejoining" and those rounds;
        for a run it never trained in, NOT_JOINED saying how to join it, or RUN_NOT_FOUND if the node
        knows no such run (the same for leave, pause, resume, export)
    run.export(run_id, directory) -> {"round", "files"}: the certified model, as files other tools load
    run.admit(run_id, peer_ids) -> {"run_id", "admitted"}: vouch for keys (crdt/membership.py: admission)

Joining finds the run (locally or in the DHT), announces this node as a participant in the DHT,
connects to the run's other participants and pulls their CRDT state (`meeting.py`; with our own ops: the run's op
log on disk already gave them back after a restart, node/replication/op_log.py), and writes a `join` op naming
the first round this node trains in: the next one, or the one after it when a round is already
under way (a late joiner enters at a round boundary and never enlarges the electorate of a round
it cannot finish). The participation itself (`participation.py`) first syncs the certified
state, then trains. Runs joined before a restart are taken up again when the node starts.

A key the run has banned (it equivocated: crdt/view.py) takes no further part: `run.join` fails
with `BANNED`, and a participation whose key is banned stops (phase "banned" in `run.status`,
which says why); a run taken up again at start shows the same.

A run whose footprint here (`locomesh.training.footprint`) exceeds the node's ``memory_limit`` or
the memory available is refused before anything is built: `run.join` fails with NOT_ENOUGH_MEMORY
(node/doctor/memory.py), saying how much it needs and how much there is.
"""

from __future__ import annotations

import functools
import importlib
import logging
from datetime import datetime
from pathlib import Path
from collections.abc import Callable
from typing import Any

import trio

from locomesh.crdt import Replica
from locomesh.crdt.quorum import is_quorum
from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import load_manifest, short_run_id
from locomesh.training.contract import ParticipantFactory, RoundParticipant
from locomesh.training.run_settings import ParticipantError, RoundSettings

from locomesh.node.datasets.service import DataUnavailable, DatasetFetcher, RunData
from locomesh.node.transfer.download import Offload
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.replication.service import CrdtService
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.rounds.machine import Timing, first_round_to_join
from locomesh.node.rounds.meeting import meet_participants
from locomesh.node.rounds.history import RoundHistory, clear_left, left_after, mark_left
from locomesh.node.rounds.participation import HISTORY, Compute, RunParticipation
from locomesh.node.exchange.shard_transfer import ShardHoldings, ShardService
from locomesh.node.rounds.pauses import PausedRuns
from locomesh.node.rounds.answers import RunAnswers
from locomesh.node.runs.registry import BAD_RUN, RunRegistryService
from locomesh.node.runtime import Node
from locomesh.node.schedule import TrainingSchedule

logger = logging.getLogger(__name__)

LEAVE_PATIENCE = 60.0  # seconds a leaving node keeps voting, at most, for its leave to take effect
LEAVE_POLL = 0.5
DATA_UNAVAILABLE = -32008  # the run's dataset or initial weights could not be fetched
BANNED = -32007
NO_DEVICE = -32009  # this machine lacks the devices the node's config names, or they failed to start


class RoundService(RunAnswers):
    """Serves ``run.join``, ``run.leave`` and ``run.status``; runs one participation per joined run."""

    name = "rounds"

    def __init__(
        self,
        registry: RunRegistryService,
        crdt: CrdtService,
        checkpoints: CheckpointService,
        *,
        archive: bool = False,
        device: str = "cpu",
        local_workers: int = 1,
        memory_limit: int = 0,
        train_threads: int = 0,
        schedule: TrainingSchedule | None = None,
        participant_factory: ParticipantFactory | None = None,
        adversary: Callable[[RoundParticipant], RoundParticipant] | None = None,
        compute: Compute = trio.to_thread.run_sync,
        offload: Offload = trio.to_thread.run_sync,
        shard_service: type[ShardService] = ShardService,
    ) -> None:
        """`participant_factory(manifest body, our public key)` and `compute` exist for the
        simulator, which models training time instead of spending it, as does `offload` (how blocking
        store work runs); the daemon uses the defaults (`training.participant.Participant.for_run`,
        worker threads). `archive`: keep every payload of every round in the store (`payloads`).
        `device`, `local_workers`: where the default factory's participants train (node/config.py),
        `train_threads` with how many CPU threads (0: torch's default). `schedule`: when this node
        trains (`locomesh.node.schedule`; None: at any time). `adversary` wraps every participant made
        (a test adversary's, `training.adversary`: node/assembly.py)."""
        self.registry = registry
        self.archive = archive
        self.device = device
        self.local_workers = local_workers
        self.memory_limit = memory_limit  # bytes training may use (0: what is available): `_refuse_if_too_big`
        self.train_threads = train_threads
        self.schedule = schedule
        self.participant_factory = participant_factory
        self.adversary = adversary
        self.compute = compute
        self.offload = offload
        self.crdt = crdt
        self.checkpoints = checkpoints
        self.participations: dict[bytes, tuple[RunParticipation, trio.CancelScope]] = {}
        self.shards = ShardHoldings()  # what sharded exchange serves, for every run (node/exchange/)
        self.shard_service = shard_service
        self.paused: PausedRuns | None = None  # the data dir's, once running
        self._left: dict[bytes, tuple[int, RoundHistory]] = {}  # runs left since start: last round, rounds done
        # Runs joined before this start whose participation is not running yet: taking one up again
        # builds its model and meets its participants (seconds), and `run status` says so meanwhile.
        self._rejoining: set[bytes] = set()
        self._node: Node | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.paused = PausedRuns(self.registry.store.root.parent)
        for name, method in (("run.join", self._rpc_join), ("run.leave", self._rpc_leave), ("run.status", self._rpc_status),
                             ("run.export", self._rpc_export), ("run.pause", self._rpc_pause),
                             ("run.resume", self._rpc_resume), ("run.admit", self._rpc_admit)):
            node.rpc.register(name, method)
        node.add_status_field("training", self._summary)
        shard_service = self.shard_service(node, self.shards, slots=self.checkpoints.uploads, scores=self.checkpoints.scores)
        shard_service.register()
        node.add_status_field("shards", lambda: {"bytes_served": shard_service.bytes_served,
                                                 "bytes_held": self.shards.bytes_held})
        if self.schedule is not None:
            node.add_status_field("schedule", self.schedule.describe)
        relay = next((service for service in node.services if service.name == "relay"), None)
        if relay is not None:
            relay.keep_linked(self._member_peers)  # a dropped link to a fellow member comes back by itself
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for run in self.registry.store.runs():
                # The owner left it (`run leave`): only `run join` takes it up again.
                if run.origin == "joined" and await self.offload(left_after, self._data_dir, run.run_id) is None:
                    self._rejoining.add(run.run_id)
                    nursery.start_soon(self._resume, run.manifest)
            task_status.started()
            await trio.sleep_forever()

    # --- joining and leaving ------------------------------------------------------------------

    async def join(self, manifest: bytes, *, resuming: bool = False) -> int:
        """Take part in the run of this signed manifest (idempotent); the round this node trains first.
        `RpcError` `BANNED` if the run banned our key, unless `resuming` (at start: the participation
        is set up to show why, and stops at once)."""
        factory = self.participant_factory or await self._default_factory()
        assert self._node is not None and self._nursery is not None
        body = load_manifest(manifest)[1].body
        timing = _timing(body["hparams"])  # before anything is stored or announced
        replica = await self.crdt.open_run(manifest)
        if not resuming:
            self._refuse_if_banned(replica.run_id)
        if replica.run_id in self.participations:
            return self.participations[replica.run_id][0].machine.state_round + 1
        await self._refuse_if_too_big(body, replica)
        participant = await self._make_participant(factory, body)
        try:
            return await self._start(manifest, body, replica, participant, timing, resuming=resuming)
        except BaseException:
            await self._close(participant)  # it never trains: its processes must not linger
            raise

    async def _start(self, manifest: bytes, body: dict[str, Any], replica: Replica, participant: RoundParticipant,
                     timing: Timing, *, resuming: bool) -> int:
        """`join`'s second half, once the participant is made: the round this node trains first."""
        assert self._node is not None and self._nursery is not None
        if replica.run_id in self.participations:  # joined meanwhile, by a call beside this one
            await self._close(participant)
            return self.participations[replica.run_id][0].machine.state_round + 1
        data = await self._prepare_data(participant, body)
        self.registry.store.add(manifest, "joined")
        assert self.registry.discovery is not None
        await meet_participants(self._node, self.registry.discovery, self.crdt, replica.run_id, self._nursery)
        if not resuming:
            self._refuse_if_banned(replica.run_id)  # what the participants told us counts too
        history = await self._open_history(replica.run_id)
        if replica.run_id in self.participations:  # joined while we awaited (a `run join` asked again): one machine
            await self._close(participant)  # per run, or two would take part under one key
            return self.participations[replica.run_id][0].machine.state_round + 1
        first = self._write_join(replica, timing)
        participation = RunParticipation(
            self._node, self.crdt, replica, participant, self.checkpoints.directory, self.checkpoints.scores,
            timing=timing, compute=self.compute, offload=self.offload, held=self.checkpoints.held,
            archive=self.archive, data=data, shards=self.shards,
        )
        participation.paused = replica.run_id in self.paused
        participation.resuming = resuming
        schedule = self.schedule
        if schedule is not None and not schedule.always:
            participation.schedule = lambda: schedule.reason_to_sit_out(datetime.now())  # local time, as configured
        participation.history = history
        scope = trio.CancelScope()
        self.participations[replica.run_id] = (participation, scope)
        self._nursery.start_soon(self._participate, participation, scope)
        logger.info("joined run %s; training from round %d", short_run_id(replica.run_id), first)
        return first

    async def _default_factory(self) -> ParticipantFactory:
        """The daemon's participants: `Participant.for_run` on this node's devices. Its module loads
        torch (on the first join only), which takes seconds: in a thread, or the node would answer
        no peer meanwhile."""
        module = await trio.to_thread.run_sync(importlib.import_module, "locomesh.training.participant")
        Participant = module.Participant

        return functools.partial(Participant.for_run, device=self.device, local_workers=self.local_workers,
                                 train_threads=self.train_threads)

    async def _make_participant(self, factory: ParticipantFactory, body: dict[str, Any]) -> RoundParticipant:
        """The participant for the run of manifest body `body`; `RpcError` if the run's settings or
        this machine's devices do not let it train here."""
        from locomesh.training.devices import DataParallelError, DeviceError  # no torch

        assert self._node is not None
        try:
            return await self.offload(  # a thread in the daemon; inline (deterministic) in netsim
                self._made, factory, body, self._node.identity.public_key
            )
        except ParticipantError as error:
            raise RpcError(BAD_RUN, f"cannot train this run here: {error}") from None
        except DeviceError as error:
            raise RpcError(NO_DEVICE, f"cannot train here on device {self.device!r}: {error}") from None
        except DataParallelError as error:
            raise RpcError(NO_DEVICE, f"cannot train here: the data-parallel group did not start: {error}") from None

    def _made(self, factory: ParticipantFactory, body: dict[str, Any], key: bytes) -> RoundParticipant:
        participant = factory(body, key)
        return participant if self.adversary is None else self.adversary(participant)

    async def _refuse_if_too_big(self, body: dict[str, Any], replica: Replica) -> None:
        """`RpcError` NOT_ENOUGH_MEMORY, saying how much is needed and how much there is, if the run's
        footprint here exceeds `memory_limit` or the memory available. Only for the daemon's own
        participants: an injected one (the simulator's) models its training and allocates nothing."""
        if self.participant_factory is not None:
            return
        from locomesh.node.doctor.memory import NOT_ENOUGH_MEMORY, check_memory  # torch: on first join only

        contributors = len(set(replica.state.members) | {self._node.identity.public_key})
        try:
            verdict = await self.offload(check_memory, body, contributors, self.memory_limit)
        except ParticipantError as error:
            raise RpcError(BAD_RUN, f"cannot train this run here: {error}") from None
        if not verdict.fits:
            raise RpcError(NOT_ENOUGH_MEMORY, f"cannot train this run here: {verdict.message()}", verdict.as_dict())

    async def _close(self, participant: RoundParticipant) -> None:
        """Release what `participant` holds (a data-parallel group's processes), even while cancelled."""
        with trio.CancelScope(shield=True):
            await self.offload(participant.close)

    async def _prepare_data(self, participant: RoundParticipant, body: dict[str, Any]) -> RunData | None:
        """Fetch and attach the run's dataset and initial weights (node/datasets/), before anything
        trains; the participation's share of the dataset, or None for a run without one."""
        assert self._node is not None
        fetcher = DatasetFetcher(self._node, self.checkpoints, offload=self.offload)
        try:
            index = await fetcher.prepare(participant, self.compute)
        except DataUnavailable as error:
            raise RpcError(DATA_UNAVAILABLE, f"cannot train this run here: {error}") from None
        except ParticipantError as error:
            raise RpcError(BAD_RUN, f"cannot train this run here: {error}") from None
        if index is None:
            return None
        return RunData(fetcher, participant.data_needs().dataset, index, seed=body["seed"], me=self._node.identity.public_key,
                       tokens_per_round=participant.data_needs().tokens_per_round)

    def _write_join(self, replica: Replica, timing: Timing) -> int:
        """Write our join op unless we are on the run's roster already, a join of ours waits, or
        we are banned; the first round we may train. A round's value admits the join
        (crdt/membership.py): an admitted key's payload may count in that round already, if it
        commits before the proposers cut (a round whose commits are out is too late for that)."""
        state = replica.state
        me = self._node.identity.public_key
        next_round = state.round + 1
        joined = me in state.members and any(row[1] == me for row in replica.facts.rows["join"])  # the creator's too
        if joined or me in replica.joining() or self.crdt.ban_reason(replica.run_id) is not None:
            return next_round
        first = first_round_to_join(state.round, under_way=bool(replica.commits(next_round)))
        if self.crdt.write(replica.run_id, "join", round=next_round) is None:  # the run's limits: logged
            raise RpcError(-32000, "the run refused our join op now (see the node's log); try again later")
        return first

    def _refuse_if_banned(self, run_id: bytes) -> None:
        reason = self.crdt.ban_reason(run_id)
        if reason is not None:
            raise RpcError(BANNED, f"this node's key is banned from run {short_run_id(run_id)} ({reason}): it can "
                                   "take no further part; a node with a new data dir has a new key")

    async def leave(self, run_id: bytes) -> int:
        """Stop training in `run_id`; the last round this node counts in. The leave op goes out at
        once; the participation trains no more but keeps voting until a round's value puts the
        leave into effect (at most LEAVE_PATIENCE seconds, and not at all outside the electorate):
        leaving costs the run no deadline."""
        self._joined(run_id)  # refuses a run this node does not train in, saying why
        participation, scope = self.participations.pop(run_id)
        machine = participation.machine
        committed = machine.phase.value == "committed"
        # Never below the certified round: a node still syncing has a state far behind it, and
        # the run refuses ops naming rounds far below our own newest (crdt/limits.py).
        last = max(machine.state_round + (1 if committed else 0), participation.replica.state.round)
        participation.leaving = True
        self.crdt.write(run_id, "leave", round=last)
        assert self._nursery is not None
        self._nursery.start_soon(self._vote_out, participation, scope)
        self._left[run_id] = (last, participation.history)
        try:
            await self.offload(self.paused.resume, run_id)  # a pause ends with the participation
            await self.offload(mark_left, self._data_dir, run_id, last)
        except OSError as error:  # the leave op is written: only a restart would take the run up again
            logger.warning("could not mark run %s as left: %s", short_run_id(run_id), error)
        return last

    async def drain(self) -> None:
        """A graceful stop (node/service.py, 4): in each run whose quorums need our vote (an
        electorate of three or fewer), sign a leave and keep voting until a round's value puts it
        into effect, so the stop costs the run no recovery wait; the node's drain time bounds it.
        A larger run goes on without us, and the rounds drop us after a few (crdt/membership.py)."""
        me = self._node.identity.public_key
        async with trio.open_nursery() as nursery:
            for run_id, (participation, scope) in list(self.participations.items()):
                electorate = participation.replica.chain.tip.electorate
                needed = me in electorate and not is_quorum(len(electorate) - 1, len(electorate))
                others = any(participation._connected(key) for key in electorate - {me})
                if needed and others and not participation.leaving:
                    participation.leaving = True
                    self.crdt.write(run_id, "leave", round=participation.replica.state.round)
                    logger.info("run %s: stopping; voting until our leave takes effect", short_run_id(run_id))
                    nursery.start_soon(self._vote_out, participation, scope)

    async def _vote_out(self, participation: RunParticipation, scope: trio.CancelScope) -> None:
        """Keep a leaving participation voting until its key is out of the electorate, or nobody
        else is left to certify a round (every other member is leaving too, or none is connected),
        or LEAVE_PATIENCE passed; then stop it."""
        me = self._node.identity.public_key
        with trio.move_on_after(LEAVE_PATIENCE):
            while not _voted_out(participation, me):
                await trio.sleep(LEAVE_POLL)
        scope.cancel()

    @property
    def _data_dir(self) -> Path:
        return self.registry.store.root.parent

    async def _open_history(self, run_id: bytes) -> RoundHistory:
        """The rounds this node finished in `run_id` before (`history.py`: they outlive a leave and a
        restart), now that it takes part again; it is no longer marked as left."""
        self._left.pop(run_id, None)
        await self.offload(clear_left, self._data_dir, run_id)
        return await self.offload(functools.partial(RoundHistory.load, self._data_dir, run_id, maxlen=HISTORY))

    async def _participate(self, participation: RunParticipation, scope: trio.CancelScope) -> None:
        """Run one participation; a failure in it stops that run here, never the node."""
        try:
            with scope:
                try:
                    await participation.run()
                except Exception as error:  # one run's bug must not take the daemon down
                    logger.exception("run %s: training stopped", short_run_id(participation.run_id))
                    participation.failure = _describe(error)
        finally:  # left, failed, or the node stops: its compute threads are done by now (trio waits for them)
            await self._close(participation.participant)

    async def _resume(self, manifest: bytes) -> None:
        """Take up again a run joined before this start (`_rejoining` until its participation runs)."""
        try:
            await self.join(manifest, resuming=True)
        except (RpcError, ProtocolError) as error:
            logger.warning("could not take up a joined run again: %s", error)
        finally:
            self._rejoining.discard(load_manifest(manifest)[0])

    def _member_peers(self) -> list[str]:
        """The peer IDs of the other members of every run we take part in."""
        return [peer for participation, _ in self.participations.values() for peer in participation.other_members()]

    def _summary(self) -> dict[str, Any]:
        return {
            short_run_id(run_id): {"phase": p.status_phase(), "sitting_out": p.sitting_out(),
                                   "round": p.machine.state_round, "device": p.participant.device}
            for run_id, (p, _scope) in self.participations.items()
        }


def _voted_out(participation: RunParticipation, me: bytes) -> bool:
    """Is a leaving member done: out of the electorate, or with nobody else to certify a round?"""
    replica = participation.replica
    tip = replica.chain.tip
    others = tip.electorate - {me}
    if me not in tip.electorate or not others:
        return True
    leaving = {author for round_ in range(max(0, tip.round - 2), tip.round + 1)
               for author in replica.facts.in_round("leave", round_)}
    return others <= leaving or not any(participation._connected(key) for key in others)


def _timing(hparams: dict[str, Any]) -> Timing:
    """The round machine's deadlines and quorum floor from the run's hyperparameters, checked as
    every setting is (`RoundSettings.from_hparams`); `RpcError` BAD_RUN naming a bad one."""
    try:
        settings = RoundSettings.from_hparams(hparams)
    except ParticipantError as error:
        raise RpcError(BAD_RUN, f"cannot train this run here: {error}") from None
    return Timing(round_deadline=settings.round_deadline_s, min_peers=settings.min_peers)


def _describe(error: BaseException) -> str:
    """The "Type: message" of each exception raised, looking through the nursery groups around them."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}"
