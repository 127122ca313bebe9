"""Taking part in one run: the trio layer that drives the round machine and the agreement seat.

Two sans-IO machines decide; this module does the I/O they ask for, and nothing else:

- the round machine (machine.py) trains, commits, fetches and adopts each certified round;
  its actions are carried out here (`_carry_out`): training in a worker thread (training.py), the
  exchange's fetches and stores (node/exchange/), syncs (`states`), the round's record;
- the agreement seat (node/agreement/seat.py) runs Tendermint over the replica for the round under
  way; its ops and questions are carried out in deciding.py;
- the round's state stewards store each new state, every member that computed it attests it
  (`states`); with contribution scoring on, a member on a certified round's scoring committee
  measures and signs the round's contributions beside the next round's work (`scoring`).

The loop wakes on every completion, on every op the replica applies, when the seat's next timer
is due, and at least every `POLL_SECONDS`; it shows both machines the replica and carries out
what comes back.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from locomesh.crdt import Replica
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import short_run_id
from locomesh.training.contract import RoundParticipant
from locomesh.training.run_settings import ParticipantError, TrainingDiverged

from locomesh.node.agreement.seat import Seat
from locomesh.node.datasets.service import RunData
from locomesh.node.exchange.allgather import PayloadExchange
from locomesh.node.exchange.seam import RoundExchange
from locomesh.node.exchange.shard_transfer import ShardHoldings
from locomesh.node.exchange.sharded import ShardedExchange
from locomesh.node.exchange.work import RoundWork
from locomesh.node.files import atomic_write
from locomesh.node.peer_scores import PeerScores
from locomesh.node.replication.service import CrdtService
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.deciding import Deciding
from locomesh.node.rounds.meeting import catch_up
from locomesh.node.rounds.outcome import Outcome, outcome_of
from locomesh.node.rounds.scoring import RoundScorer
from locomesh.node.rounds.states import StateKeeper
from locomesh.node.rounds.status import participation_status, waiting_on
from locomesh.node.rounds.training import Training
from locomesh.node.rounds.work import RoundRecord, TrainingAhead
from locomesh.node.runtime import Node
from locomesh.node.transfer.download import Offload
from locomesh.node.transfer.held import HeldCheckpoints

logger = logging.getLogger(__name__)

Compute = Callable[..., Awaitable[Any]]

POLL_SECONDS = 0.2  # the machines see the time at least this often (and at once after news)
SCHEDULE_SECONDS = 10.0
SYNC_TIMEOUT = 300.0
HISTORY = 100
AGREEMENT_HISTORY = 8  # rounds whose agreement time (first commit to certificate) sets the timeouts


class RunParticipation(Training, Deciding):
    """This node's part in one run, from `run()` until it is cancelled (a leave, or shutdown)."""

    def __init__(self, node: Node, crdt: CrdtService, replica: Replica, participant: RoundParticipant,
                 checkpoint_dir: Path, scores: PeerScores, *, timing: rm.Timing, compute: Compute = trio.to_thread.run_sync,
                 offload: Offload = trio.to_thread.run_sync, held: HeldCheckpoints | None = None,
                 archive: bool = False, data: RunData | None = None, shards: ShardHoldings | None = None) -> None:
        """`held`: where fetched payloads are kept, the checkpoint service's (`CheckpointService.held`)
        so that it serves them on; without it they are kept apart and served by nobody. `archive`:
        keep every payload of every round in the store too (`payloads`). `data`: the run's dataset
        shards, for a run that trains on one (node/datasets/). `shards`: what the node's shard
        service serves (sharded exchange); without it, kept apart and served by nobody."""
        self.node = node
        self.crdt = crdt
        self.replica = replica
        self.run_id = replica.run_id
        self.participant = participant
        self.data = data
        self.compute = compute  # runs a participant method; a simulation models its time instead
        self.offload = offload  # runs blocking store work (a thread; inline in the simulator)
        self.directory = checkpoint_dir
        self.scores = scores
        self.me = node.identity.public_key
        self.machine = rm.RoundMachine(self.me, timing=timing)
        self.seat = Seat(self.me, timeouts=self.timeouts, recover_after=self.recover_after)
        self.history: deque[RoundRecord] = deque(maxlen=HISTORY)
        self.agreements: deque[float] = deque(maxlen=AGREEMENT_HISTORY)  # first commit -> certificate, seconds
        self._first_commit: tuple[int, float] | None = None  # (round under way, when its first commit was seen)
        self.work: RoundWork | None = None
        self.syncs: list[trio.CancelScope] = []
        self.payloads_sent = 0
        self.initial_eval: dict[str, Any] = {}
        self.failure: str | None = None  # set when the participation stopped on an error
        self.resuming = False  # taken up again at a start: catch the run up before acting (`run`)
        self.banned: str | None = None  # why, once the run banned our key (the participation stopped)
        self.paused = False  # `run pause`: sit rounds out until `run resume` (the service sets it)
        self.leaving = False  # `run leave` or a graceful stop: train no more, vote until the leave is in
        self.schedule: Callable[[], str | None] = lambda: None  # why the node's schedule sits rounds out now, or None
        self._schedule_said: tuple[float, str | None] = (-math.inf, None)  # (when asked, its answer)
        self._compute = trio.Lock()
        self.delayed = participant.settings.delayed_updates
        self._training = trio.Lock() if self.delayed else self._compute  # see training.py
        self._ahead: TrainingAhead | None = None
        self._peer_ids: dict[bytes, str] = {}  # author key -> peer ID (derived once)
        self._events_in, self._events = trio.open_memory_channel[rm.Event](math.inf)
        self._news: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        held = held if held is not None else HeldCheckpoints()
        allgather = PayloadExchange(node, replica, participant, checkpoint_dir, held, scores, machine=self.machine,
                                    offload=offload, connected=self._connected, other_members=self._other_members,
                                    archive=archive)
        sharded = ShardedExchange(node, crdt, replica, participant, checkpoint_dir, shards or ShardHoldings(), scores,
                                  compute=compute, compute_lock=self._compute, offload=offload,
                                  machine=self.machine,
                                  seed=lambda round_number: self.states.seed(round_number))
        self.exchange = RoundExchange(replica, participant, allgather, sharded)
        self.states = StateKeeper(node, crdt, replica, participant, checkpoint_dir, scores, compute=compute,
                                  compute_lock=self._compute, offload=offload, other_members=self._other_members,
                                  archive=archive)
        self.scoring = RoundScorer(replica, participant, self.me, compute, crdt)

    async def run(self) -> None:
        if self.resuming:  # our op log may be far behind the run: see `catch_up`
            await catch_up(self.node, self.crdt, self.run_id)
        if self.participant.evaluation_due():
            async with self._compute:
                self.initial_eval = await self.compute(self.participant.evaluate)
        self.replica.listeners.append(self._on_news)
        try:
            await self._loop()
        except* TrainingDiverged as diverged:  # a run gone non-finite: this peer has nothing to send, ever
            self.failure = str(diverged.exceptions[0])
            logger.error("run %s: training stopped: %s", short_run_id(self.run_id), self.failure)
        finally:
            self.replica.listeners.remove(self._on_news)
            self.exchange.release_before(None)

    async def _loop(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                if self._stop_if_banned(nursery):
                    return
                self._carry_out(self.machine.handle(self._observe()))
                self._agree()
                event = await self._next_event()
                if event is not None:
                    self._carry_out(self.machine.handle(event))

    async def _next_event(self) -> rm.Event | None:
        """The next completion, or None once POLL_SECONDS passed (sooner if the seat's timer is due)
        or the replica applied an op (a commit, a proposal or a vote arrived: look now)."""
        due = self.seat.next_wakeup()
        wait = POLL_SECONDS if due is None else min(POLL_SECONDS, max(0.0, due - trio.current_time()))
        with trio.move_on_after(wait) as waiting:
            self._news = waiting
            return await self._events.receive()
        return None

    def _stop_if_banned(self, nursery: trio.Nursery) -> bool:
        """Once the run bans our key (or the op log proves we equivocated) nothing we write counts:
        stop all work (phase "banned")."""
        self.banned = self.banned or self.replica.ban_reason(self.me)
        if self.banned is not None:
            logger.warning("run %s: training stopped: this node's key is banned (%s)", short_run_id(self.run_id),
                           self.banned)
            nursery.cancel_scope.cancel()
        return self.banned is not None

    def _on_news(self) -> None:
        """A replica listener: end the current wait (`_next_event`) early."""
        if self._news is not None:
            self._news.deadline = -math.inf

    def _observe(self) -> rm.Observation:
        chain = self.replica.chain
        tip = chain.tip
        self._time_agreements(tip.round)
        contributors = self.replica.contributors(tip.round)
        self.machine.fetching = self.me in tip.electorate
        decided = {}
        certificate = chain.certificates.get(self.machine.state_round + 1)
        if certificate is not None:
            decided[certificate.round] = rm.Decided(certificate.round, certificate.value_id,
                                                    tuple(sorted(certificate.accepted)), certificate.state)
        return rm.Observation(
            now=trio.current_time(),
            certified=chain.round,
            certified_hash=chain.state_of(chain.round),
            commits=self.replica.commits(tip.round),
            may_contribute=self.me in contributors and not self.leaving,
            rejoin=self._must_rejoin() and not self.leaving,
            sit_out=self.sitting_out() is not None or self.leaving,
            eligible=len(contributors | self.replica.joining()),  # a join waiting counts for min_peers
            decided=decided,
        )

    def _time_agreements(self, tip_round: int) -> None:
        """Note how long each round's agreement took as seen here, from its first commit seen to its
        certificate, for every round this node sees go by (syncing or not): a node that just joined
        learns the run's pace from the rounds it watches (deciding.py: `timeouts`)."""
        seen = self._first_commit
        if seen is not None and seen[0] < tip_round:
            self.agreements.append(trio.current_time() - seen[1])
            seen = None
        if seen is None and self.replica.facts.in_round("commit", tip_round):
            seen = (tip_round, trio.current_time())
        self._first_commit = seen

    def _must_rejoin(self) -> bool:
        """On no roster, and no join of ours waits: the roster let us go (or we left)."""
        return self.me not in self.replica.chain.tip.membership.roster and self.me not in self.replica.joining()

    def sitting_out(self) -> str | None:
        """Why this node contributes to no round now (paused, or its schedule says so), or None. The
        schedule is asked at most every SCHEDULE_SECONDS: its probes (power, load) are not free."""
        if self.paused:
            return "paused (locomesh run resume starts it again)"
        asked_at, reason = self._schedule_said
        now = trio.current_time()
        if now - asked_at >= SCHEDULE_SECONDS:
            reason = self.schedule()
            self._schedule_said = (now, reason)
        return reason

    def _connected(self, author: bytes) -> bool:
        return self._peer_id(author) in self.node.peers

    def status(self) -> dict[str, Any]:
        """What `run status` shows of this participation (`status.participation_status`)."""
        return participation_status(self)

    def status_phase(self) -> str:
        """The machine's phase, or what stopped the participation, or that it sits rounds out."""
        if self.failure or self.banned:
            return "failed" if self.failure else "banned"
        if self.leaving:
            return "leaving"
        if self.machine.phase is rm.Phase.IDLE and self.sitting_out() is not None:
            return "paused" if self.paused else "sitting out"
        return self.machine.phase.value

    def _waiting(self) -> dict[str, Any]:
        """What the round waits for, and on whom (peer IDs)."""
        return waiting_on(self)

    def _peer_id(self, author: bytes) -> str:
        peer_id = self._peer_ids.get(author)
        if peer_id is None:
            peer_id = self._peer_ids[author] = peer_id_from_public_key(author)
        return peer_id

    # --- the round machine's actions ----------------------------------------------------------------

    def _carry_out(self, actions: list[rm.Action]) -> None:
        for action in actions:
            match action:
                case rm.StartTraining(round=r):
                    self._work_for(r).training = True
                    self._start(self.work.tasks, self._train, self.work)
                case rm.PublishCommit(round=r, payload_id=payload_id, size=size):
                    self.crdt.write(self.run_id, "commit", round=r, hash=payload_id, size=size)
                    self.work.committed = True
                case rm.Fetch(round=r, author=author, payload_id=payload_id, size=size):
                    self._start_fetch(self._work_for(r), author, payload_id, size)
                case rm.Replay(round=r, value_id=value_id, authors=authors):
                    logger.info("round %d: certified with a value we did not compute; computing its %d payloads", r,
                                len(authors))
                    self._start(self._work_for(r).tasks, self._compute_value, r, value_id, authors)
                case rm.Adopt(round=r, value_id=value_id):
                    self._adopt(r, value_id)
                case rm.StartSync(round=r, state_hash=state_hash):
                    for scope in self.syncs:
                        scope.cancel()
                    self._start(self.syncs, self._sync, r, state_hash)
                case rm.StopTraining(round=r):
                    if self.work is not None and self.work.round == r:
                        self.work.cancel(training_only=True)
                    self._cancel_ahead(r)
                case rm.Discard():
                    if self.work is not None:
                        self.work.cancel()
                    self._cancel_ahead()
                case rm.PublishJoin(round=r):
                    logger.info("run %s: joining again from round %d", short_run_id(self.run_id), r)
                    self.crdt.write(self.run_id, "join", round=r)
                case rm.RoundDone(round=r, synced=synced):
                    self._round_done(action, synced)
                    self._start([], self._record, action, self.work, outcome_of(self, r))  # now, while the work is r's

    def _round_done(self, done: rm.RoundDone, synced: bool) -> None:
        work = self.work
        if work is not None and work.round == done.round and not synced:
            if work.scoring_base is not None:
                self._start([], self.scoring.score, done.round, work.scoring_base, work.aggregated, work.payloads)

    def _work_for(self, round_number: int) -> RoundWork:
        """The work of round `round_number` (a new one if the participation is on another round)."""
        if self.work is None or self.work.round != round_number:
            if self.work is not None:
                self.work.cancel(fetches_only=True)
            self.work = RoundWork(round_number, trio.current_time(), exchange=self.exchange.choose(round_number))
        return self.work

    def _start(self, scopes: list[trio.CancelScope], function: Any, *args: Any) -> None:
        """Run `function(*args)` in the background under a new cancel scope added to `scopes`."""
        scope = trio.CancelScope()
        scopes.append(scope)

        async def scoped() -> None:
            with scope:
                await function(*args)
            scopes.remove(scope)

        assert self._nursery is not None
        self._nursery.start_soon(scoped)

    def _emit(self, event: rm.Event) -> None:
        self._events_in.send_nowait(event)

    # --- fetching, syncing, recording ---------------------------------------------------------------

    def _start_fetch(self, work: RoundWork, author: bytes, payload_id: bytes, size: int) -> None:
        """Fetch `author`'s committed payload unless a fetch of it is under way."""
        if author in work.fetched_ok or (author in work.fetching and not work.fetching[author].is_set()):
            return
        work.fetching[author] = trio.Event()
        self._start(work.fetches, self._fetch, work, author, payload_id, size)

    async def _fetch(self, work: RoundWork, author: bytes, payload_id: bytes, size: int) -> None:
        """Check that one committed payload is there (`RoundExchange.fetch`) and tell the machine;
        then wait until it would outlive its author (`RoundExchange.confirm`: our own value may name
        it from then on, which the seat sees at its next look)."""
        started, there = trio.current_time(), False
        try:
            there = await self.exchange.fetch(work, author, payload_id, size)
        finally:
            if there:
                work.fetched_ok.add(author)
                work.arrived[author] = trio.current_time()
            else:
                work.fetch_failures[author] = work.fetch_failures.get(author, 0) + 1
            if author in work.fetching:  # `_start_fetch`'s: whoever waits for this fetch
                work.fetching[author].set()
        logger.debug("round %d: payload of %s %s after %.2f s", work.round, self._peer_id(author),
                     "fetched" if there else "not fetched", trio.current_time() - started)
        self._emit(rm.Fetched(work.round, author, there, trio.current_time()))
        if there:
            await self.exchange.confirm(work, author)
            self._on_news()

    async def _sync(self, round_number: int, state_hash: bytes) -> None:
        adopted = None
        with trio.move_on_after(SYNC_TIMEOUT):
            adopted = await self.states.download(round_number, state_hash)
        self._emit(rm.Synced(round_number, adopted, trio.current_time()))

    async def _record(self, done: rm.RoundDone, work: RoundWork | None, outcome: Outcome) -> None:
        now = trio.current_time()
        evaluation: dict[str, Any] = {"loss": None, "floor": None}
        if self.participant.evaluation_due():
            async with self._compute:
                evaluation = await self.compute(self.participant.evaluate)
        self.history.append(RoundRecord.of(done, work, evaluation, now, outcome))
        self.exchange.release_before(done.round)  # the round just done's stay a round, for peers replaying it
        await self.offload(self.states.forget_old_rounds, done.round)

    async def export(self, directory: Path) -> dict[str, Any]:
        """Write the model of the state we hold into `directory` (`RoundParticipant.export_files`),
        with the dataset's tokenizer; {"round", "files"}. `ParticipantError` unless that state is
        the certified one (a state we computed may not be certified; once it is, export again)."""
        async with self._compute:  # the state stays the one checked while its files are made
            chain = self.replica.chain
            round_number, state_hash = self.machine.state_round, self.machine.state_hash
            if round_number != chain.round or (round_number and chain.state_of(round_number) != state_hash):
                raise ParticipantError(f"this node holds the state of round {round_number}, not the certified "
                                       f"round {chain.round}'s yet; export again once it synced")
            tokenizer = None if self.data is None else await self.offload(self.data.tokenizer)
            files = await self.compute(self.participant.export_files, tokenizer)
        for name, contents in files.items():
            await self.offload(atomic_write, directory / name, contents)
        return {"round": round_number, "files": sorted(files)}

    def other_members(self) -> list[str]:
        """The peer IDs of the run's members but us."""
        return self._other_members()

    def _other_members(self, exclude: bytes | None = None) -> list[str]:
        """The peer IDs of the run's members but us (and `exclude`)."""
        return [self._peer_id(member) for member in self.replica.state.members if member not in (self.me, exclude)]
