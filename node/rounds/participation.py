"""Taking part in one run: the trio layer that carries out the round machine's actions.

`RoundMachine` (machine.py) decides; this module does the I/O it asks for, and nothing
else:

- training and the outer step run in a worker thread (torch and numpy release the GIL), one at a
  time under `_compute`, so a discarded round's thread finishes before a sync touches the state;
- with one-round-delayed outer updates (the run's `delayed_updates`), training runs under a lock
  of its own instead (`_training`): once round r's payload is made, round r+1's inner steps start
  at once, from `Participant.delayed_start` (a `TrainingAhead`), while round r is exchanged, aggregated
  and certified; when the machine then starts round r+1, its payload is (nearly) ready;
- each round's exchange (allgather or sharded, node/exchange/) stores our payload, checks the
  others' and gathers what the outer step needs (`exchange`); commits, proposals, votes,
  timeouts and checkpoint attestations are CRDT ops (`CrdtService.write`);
- the round's state stewards store each new state, every voter attests it, and a sync loads the
  certified one (`states`);
- with contribution scoring on, a member on a certified round's scoring committee measures and
  signs the round's contributions beside the next round's work (`scoring`).

The loop wakes on every completion and at least every `POLL_SECONDS`, hands the machine an
`Observation` of the replica, and carries out what comes back.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from locomesh.crdt import Replica
from locomesh.crdt.electorate import split_votes
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import short_run_id
from locomesh.training.contract import RoundParticipant
from locomesh.training.run_settings import ParticipantError, TrainingDiverged

from locomesh.node.datasets.service import RunData
from locomesh.node.files import atomic_write
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.meeting import catch_up
from locomesh.node.rounds.outcome import Outcome, outcome_of, refusal
from locomesh.node.exchange.allgather import PayloadExchange
from locomesh.node.exchange.seam import RoundExchange
from locomesh.node.exchange.shard_transfer import ShardHoldings
from locomesh.node.exchange.sharded import ProposalWithheld, ShardedExchange
from locomesh.node.rounds.scoring import RoundScorer
from locomesh.node.rounds.states import StateKeeper
from locomesh.node.rounds.status import participation_status, round_clock, waiting_on
from locomesh.node.transfer.download import Offload
from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.rounds.work import RoundRecord, RoundWork, TrainingAhead
from locomesh.node.peer_scores import PeerScores
from locomesh.node.replication.service import CrdtService
from locomesh.node.runtime import Node

logger = logging.getLogger(__name__)

Compute = Callable[..., Awaitable[Any]]

POLL_SECONDS = 0.2  # the machine sees the time at least this often (and at once after news)
SCHEDULE_SECONDS = 10.0
SYNC_TIMEOUT = 300.0
HISTORY = 100


class RunParticipation:
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
        self.history: deque[RoundRecord] = deque(maxlen=HISTORY)
        self.work: RoundWork | None = None
        self.syncs: list[trio.CancelScope] = []
        self.payloads_sent = 0
        self.initial_eval: dict[str, Any] = {}
        self.failure: str | None = None  # set when the participation stopped on an error
        self.resuming = False  # taken up again at a start: catch the run up before acting (`run`)
        self.banned: str | None = None  # why, once the run banned our key (the participation stopped)
        self.paused = False  # `run pause`: sit rounds out until `run resume` (the service sets it)
        self.schedule: Callable[[], str | None] = lambda: None  # why the node's schedule sits rounds out now, or None
        self._schedule_said: tuple[float, str | None] = (-math.inf, None)  # (when asked, its answer)
        self._compute = trio.Lock()
        self.delayed = participant.settings.delayed_updates
        self._training = trio.Lock() if self.delayed else self._compute  # see the module docstring
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
                event = await self._next_event()
                if event is not None:
                    self._carry_out(self.machine.handle(event))

    async def _next_event(self) -> rm.Event | None:
        """The next completion, or None once POLL_SECONDS passed or the replica applied an op (a
        commit, a proposal or a vote arrived: the machine should look now, not at the next poll)."""
        with trio.move_on_after(POLL_SECONDS) as waiting:
            self._news = waiting
            return await self._events.receive()
        return None

    def _stop_if_banned(self, nursery: trio.Nursery) -> bool:
        """Once the run bans our key nothing we write counts: stop all work (phase "banned")."""
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
        state = self.replica.state
        next_round = state.round + 1
        commits = self.replica.commits(next_round)
        history = self.replica.history(next_round)
        return rm.Observation(
            now=trio.current_time(),
            certified=state.round,
            certified_hash=state.rounds[-1][1] if state.rounds else None,
            electorate=history[-1].electorate,
            commits=commits,
            proposals=self.replica.proposals(next_round),
            certified_proposals=self.replica.proposals(state.round) if state.round else {},
            unreachable=frozenset(author for author in commits if author != self.me and not self._connected(author)),
            unconfirmed=self.exchange.unconfirmed(self.work if self.work and self.work.round == next_round else None,
                                                  commits),
            lapsed=self.replica.lapsed(self.me, next_round),
            contributors=frozenset(self.replica.contributors(next_round)),
            attempt=len(history) - 1,
            seed=self.states.seed(next_round),
            member=self.me in state.members,
            sit_out=self.sitting_out() is not None,
            standing=frozenset(history[-1].standing),
            split_votes=split_votes(history),
        )

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
        if self.machine.phase is rm.Phase.IDLE and self.sitting_out() is not None:
            return "paused" if self.paused else "sitting out"
        return self.machine.phase.value

    def _waiting(self) -> dict[str, Any]:
        """What the round waits for, and on whom (peer IDs)."""
        reason = self.sitting_out()
        if reason is not None and self.machine.phase is rm.Phase.IDLE:
            return {"for": f"nothing: this node sits rounds out, {reason}", "on": []}
        state = self.replica.state
        what, on = waiting_on(self.machine, frozenset(self.replica.votes(state.round + 1)))
        # Not us: what we wait on ourselves (our inner steps, our outer step) the words say.
        peers = sorted(self._peer_id(author) for author in on if author != self.me)
        return {"for": what, "on": peers, "unreachable": [peer for peer in peers if peer not in self.node.peers],
                **round_clock(self.machine, trio.current_time())}

    def _waiting_text(self) -> str:
        waiting = self._waiting()
        return waiting["for"] + (f" from {', '.join(waiting['on'])}" if waiting["on"] else "")

    def _peer_id(self, author: bytes) -> str:
        peer_id = self._peer_ids.get(author)
        if peer_id is None:
            peer_id = self._peer_ids[author] = peer_id_from_public_key(author)
        return peer_id

    # --- actions ------------------------------------------------------------------------------

    def _carry_out(self, actions: list[rm.Action]) -> None:
        for action in actions:
            match action:
                case rm.StartTraining(round=r):
                    self.work = RoundWork(r, trio.current_time(), exchange=self.exchange.choose(r))
                    self._start(self.work.tasks, self._train, self.work)
                case rm.PublishCommit(round=r, payload_id=payload_id, size=size):
                    self.crdt.write(self.run_id, "commit", round=r, hash=payload_id, size=size)
                    self.work.committed = True
                case rm.Fetch(author=author, payload_id=payload_id, size=size):
                    self._start(self.work.fetches, self._fetch, self.work, author, payload_id, size)
                case rm.PublishProposal(round=r, authors=authors):
                    logger.info("round %d: proposing the set of %d payloads", r, len(authors))
                    self.crdt.write(self.run_id, "propose", round=r, authors=list(authors))
                case rm.StartAggregate(round=r, authors=authors, last_commit=last_commit, replay=True):
                    logger.info("round %d: certified without us; replaying its %d payloads", r, len(authors))
                    self._start(self.work.tasks, self._aggregate, self.work, authors, last_commit)
                case rm.StartAggregate(round=r, authors=authors, last_commit=last_commit):
                    logger.info("round %d: aggregating %d payloads, %.2f s after the last commit", r, len(authors),
                                trio.current_time() - last_commit)
                    self.work.cancel(fetches_only=True)
                    self._start(self.work.tasks, self._aggregate, self.work, authors, last_commit)
                case rm.PublishVote(round=r, state_hash=state_hash, proposer=proposer, attempt=attempt):
                    fields = {} if proposer is None else {"proposer": proposer}
                    if attempt:
                        logger.info("round %d: voting again in attempt %d (the attempt before split)", r, attempt)
                    self.crdt.write(self.run_id, "vote", round=r, hash=state_hash, attempt=attempt, **fields)
                case rm.PublishTimeout(round=r, attempt=attempt):
                    logger.warning("round %d: attempt %d passed its deadline (%.0f s) uncertified; waiting for %s",
                                   r, attempt, self.machine.deadline(), self._waiting_text())
                    self.crdt.write(self.run_id, "timeout", round=r, attempt=attempt)
                case rm.StartSync(round=r, state_hash=state_hash):
                    for scope in self.syncs:
                        scope.cancel()
                    self._start(self.syncs, self._sync, r, state_hash)
                case rm.StopTraining(round=r):
                    self.work.cancel(training_only=True)
                    self._cancel_ahead(r)
                case rm.Discard():
                    if self.work is not None:
                        self.work.cancel()
                    self._cancel_ahead()
                case rm.PublishJoin(round=r):
                    logger.info("run %s: joining the contributors again from round %d", short_run_id(self.run_id), r)
                    self.crdt.write(self.run_id, "join", round=r)
                case rm.PublishLeave(round=r):
                    logger.info("run %s: sitting rounds out after round %d: %s", short_run_id(self.run_id), r,
                                self.sitting_out())
                    self._cancel_ahead()
                    self.crdt.write(self.run_id, "leave", round=r)
                case rm.RoundDone(round=r, synced=synced):
                    self._start([], self._record, action, self.work, outcome_of(self, r))  # now, while the work is r's
                    work = self.work
                    if not synced and work is not None and work.round == r and work.scoring_base is not None:
                        self._start([], self.scoring.score, r, work.scoring_base, work.aggregated, work.payloads)

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

    # --- the work -----------------------------------------------------------------------------

    async def _train(self, work: RoundWork) -> None:
        contribution = await self.exchange.committed_before(work)
        if contribution is not None:
            self._cancel_ahead()
        elif self.delayed:
            contribution = await self._train_delayed(work)
        else:
            data = await self._round_data(work.round)
            async with self._training:
                contribution = await self.compute(self.participant.train, *self._train_args(work, None, data))
        work.payload_id, work.payload_size = await self.exchange.store(work, contribution.payload)
        work.train_loss, work.train_seconds = contribution.train_loss, contribution.seconds
        work.payloads[self.me] = contribution.payload
        self.payloads_sent += 1
        self._emit(rm.Trained(work.round, work.payload_id, work.payload_size, contribution.seconds, trio.current_time()))

    async def _train_delayed(self, work: RoundWork) -> Any:
        """This round's contribution, trained ahead if it was (else now, from θ); then the next
        round's inner steps start, from θ moved by this contribution (`Participant.delayed_start`)."""
        ahead = self._ahead
        if ahead is not None and ahead.round == work.round and (ahead.exchange == "sharded") == work.sharded:
            await ahead.done.wait()
            contribution = ahead.contribution
            work.trained_ahead = contribution is not None
        else:
            self._cancel_ahead()
            contribution = None
        if contribution is None:
            data = await self._round_data(work.round)
            async with self._training:
                contribution = await self.compute(self.participant.train, *self._train_args(work, None, data))
        async with self._compute:  # θ is the state this round's aggregate will land on until that runs
            start = await self.compute(self.participant.delayed_start, contribution)
        self._ahead = TrainingAhead(work.round + 1, exchange=self.exchange.predict(work.round + 1))
        self._start(self._ahead.scopes, self._train_ahead, self._ahead, start)
        return contribution

    async def _train_ahead(self, ahead: TrainingAhead, start: Any) -> None:
        try:
            data = await self._round_data(ahead.round)
            async with self._training:
                ahead.contribution = await self.compute(self.participant.train, ahead.stop.is_set, start, data,
                                                        *((True,) if ahead.exchange == "sharded" else ()))
        finally:
            ahead.done.set()

    @staticmethod
    def _train_args(work: RoundWork, start: Any, data: Any) -> tuple[Any, ...]:
        """`Participant.train`'s arguments for `work`'s round: a sharded round's payload is cut
        at shard boundaries (`sharded=True`)."""
        return (work.stop_training.is_set, start, data, *((True,) if work.sharded else ()))

    async def _round_data(self, round_number: int) -> Any:
        """The tokens of the shards round `round_number` assigns us (None for a run without a
        dataset); the next round's start coming in meanwhile (`RunData.prefetch`)."""
        if self.data is None:
            return None
        roster = self.replica.contributors(round_number)
        shards = await self.data.shards(round_number, roster)
        self._start([], self.data.prefetch, round_number + 1, roster)
        return shards

    def _cancel_ahead(self, round_number: int | None = None) -> None:
        """Stop training ahead (only if it is for `round_number`, when given): its base is gone."""
        ahead = self._ahead
        if ahead is not None and round_number in (None, ahead.round):
            ahead.cancel()
            self._ahead = None

    async def _fetch(self, work: RoundWork, author: bytes, payload_id: bytes, size: int) -> None:
        """Check that one committed payload is there (`RoundExchange.fetch`) and tell the machine;
        then wait until it would outlive its author (`RoundExchange.confirm`: our own set may name
        it from then on, which the machine sees at its next look)."""
        started = trio.current_time()
        there = await self.exchange.fetch(work, author, payload_id, size)
        if there:
            work.arrived[author] = trio.current_time()
        logger.debug("round %d: payload of %s %s after %.2f s", work.round, self._peer_id(author),
                     "fetched" if there else "not fetched", trio.current_time() - started)
        self._emit(rm.Fetched(work.round, author, there, trio.current_time()))
        if there:
            await self.exchange.confirm(work, author)
            self._on_news()

    async def _aggregate(self, work: RoundWork, authors: tuple[bytes, ...], last_commit: float) -> None:
        """The outer step and the vote; then, off the critical path, the state checkpoint. The
        vote names the new state's hash, computed in memory; compressing and storing the state
        runs while the next round trains (a snapshot of the state: the outer step never writes
        into arrays it handed out)."""
        async with self._compute:  # the state this set's step starts from (sharded seats aggregate on it)
            if work.before is None:
                work.before = self.participant.snapshot()
            else:  # voting again after a split: this set's step starts from the round's state too
                self.participant.adopt(work.before.tensors, work.before.round)
        try:
            gathered = await self.exchange.gather(work, authors, electorate=self.replica.electorate(work.round))
        except ProposalWithheld as withheld:
            logger.warning("round %d: the set cannot be aggregated: %s", work.round, withheld)
            self._emit(rm.Withheld(work.round, withheld.author, trio.current_time()))
            return
        except ValueError as error:  # a shard with no valid contribution: nothing to apply
            logger.warning("round %d: no aggregate: %s", work.round, error)
            self._emit(rm.Aggregated(work.round, None, trio.current_time()))
            return
        arrivals = [work.arrived[author] for author in authors if author in work.arrived]
        work.fetch_seconds = max(0.0, max(arrivals, default=last_commit) - last_commit)
        state_hash = snapshot = None
        async with self._compute:
            try:
                if self.scoring.enabled and not work.sharded:  # θ before this step: what the round's contributions are scored on
                    work.scoring_base, work.aggregated = self.participant.scoring_base(), authors
                started = trio.current_time()
                work.refused = refusal(await self.exchange.apply(work, gathered, self.compute), self.me)
                work.aggregate_seconds = trio.current_time() - started
                work.exchange_seconds = trio.current_time() - last_commit
                state_hash = await self.compute(self.participant.state_hash)
                snapshot = self.participant.snapshot()
            except ValueError as error:  # EmptyRoundError, AggregatorError: nothing valid to apply
                logger.warning("round %d: no aggregate: %s", work.round, error)
        self._emit(rm.Aggregated(work.round, state_hash, trio.current_time()))
        if snapshot is not None:
            assert self._nursery is not None
            self.states.store_later(self._nursery, work.round, snapshot, state_hash)

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
        the certified one (a state we voted for may not be certified; once it is, export again)."""
        async with self._compute:  # the state stays the one checked while its files are made
            certified = self.replica.state.round
            round_number, state_hash = self.machine.state_round, self.machine.state_hash
            certificate = self.replica.state.certificates.get(round_number)
            if round_number != certified or (certificate is not None and certificate.hash != state_hash):
                raise ParticipantError(f"this node holds the state of round {round_number}, not the certified "
                                       f"round {certified}'s yet; export again once it synced")
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
