"""Taking part in one run: the trio layer that carries out the round machine's actions.

`RoundMachine` (machine.py) decides; this module does the I/O it asks for, and nothing
else:

- training and the outer step run in a worker thread (torch and numpy release the GIL), one at a
  time under `_compute`, so a discarded round's thread finishes before a sync touches the state;
- with one-round-delayed outer updates (the run's `delayed_updates`), training runs under a lock
  of its own instead (`_training`): once round r's payload is made, round r+1's inner steps start
  at once, from `Participant.delayed_start` (a `TrainingAhead`), while round r is exchanged, aggregated
  and certified; when the machine then starts round r+1, its payload is (nearly) ready;
- payloads are published as content-addressed checkpoints in the node's checkpoint store, so the
  checkpoint service serves them (over its authenticated data plane) and any peer that fetched a
  payload can serve it on: the allgather is a multi-source download, verified chunk by chunk
  against the ID the author committed to in the CRDT;
- commits, votes and checkpoint attestations are CRDT ops (`CrdtService.write`);
- the round's state stewards (`state_stewards`) store each new state as a checkpoint, off the
  critical path; every peer attests its ID;
- a sync downloads the run's canonical checkpoint of the certified round (the stewards asked
  first) and adopts it only if its state hash is the certified one.

The loop wakes on every completion and at least every `POLL_SECONDS`, hands the machine an
`Observation` of the replica, and carries out what comes back.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import numpy as np
import trio

from locomesh.crdt import Replica
from locomesh.crdt.evidence import ban_reason
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import short_run_id
from locomesh.training.checkpoint_manifest import Manifest, manifest_path, read_manifest
from locomesh.training.contract import RoundParticipant
from locomesh.training.run_settings import TrainingDiverged

from locomesh.node.rounds import machine as rm
from locomesh.node.transfer.download import REFUSED, DownloadError, DownloadProgress, Offload, checkpoint_store, download_checkpoint
from locomesh.node.rounds.work import RoundRecord, RoundWork, TrainingAhead
from locomesh.node.peer_scores import PeerScores
from locomesh.node.replication.service import CrdtService
from locomesh.node.runtime import Node

logger = logging.getLogger(__name__)

Compute = Callable[..., Awaitable[Any]]

POLL_SECONDS = 0.2  # the machine sees the time at least this often (and at once after news)
FETCH_TIMEOUT = 60.0
FETCH_RETRY_SECONDS = 0.5
STALL_SECONDS = 5.0  # after the cutoff, a payload of which no byte arrived this long is given up
STALL_POLL_SECONDS = 0.5
SYNC_TIMEOUT = 300.0
KEPT_ROUNDS = 3  # payloads and states of older rounds are deleted
HISTORY = 100


class RunParticipation:
    """This node's part in one run, from `run()` until it is cancelled (a leave, or shutdown)."""

    def __init__(self, node: Node, crdt: CrdtService, replica: Replica, participant: RoundParticipant,
                 checkpoint_dir: Path, scores: PeerScores, *, timing: rm.Timing, compute: Compute = trio.to_thread.run_sync,
                 offload: Offload = trio.to_thread.run_sync) -> None:
        self.node = node
        self.crdt = crdt
        self.replica = replica
        self.run_id = replica.run_id
        self.participant = participant
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
        self.banned: str | None = None  # why, once the run banned our key (the participation stopped)
        self._compute = trio.Lock()
        self.delayed = participant.settings.delayed_updates
        self._training = trio.Lock() if self.delayed else self._compute  # see the module docstring
        self._ahead: TrainingAhead | None = None
        self._peer_ids: dict[bytes, str] = {}  # author key -> peer ID (derived once)
        self._events_in, self._events = trio.open_memory_channel[rm.Event](math.inf)
        self._news: trio.CancelScope | None = None
        self._unstored: tuple[int, Any, bytes] | None = None  # the newest state not yet stored
        self._storing = False
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
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
        self.banned = self.banned or ban_reason(self.replica.facts, self.me)
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
        attempts = self.replica.attempts(next_round)
        return rm.Observation(
            now=trio.current_time(),
            certified=state.round,
            certified_hash=state.rounds[-1][1] if state.rounds else None,
            electorate=attempts[-1],
            commits=commits,
            proposals=self.replica.proposals(next_round),
            certified_proposals=self.replica.proposals(state.round) if state.round else {},
            unreachable=frozenset(author for author in commits if author != self.me and not self._connected(author)),
            lapsed=self.replica.lapsed(self.me, next_round),
            contributors=frozenset(self.replica.contributors(next_round)),
            attempt=len(attempts) - 1,
            seed=self._seed(next_round),
        )

    def _seed(self, round_number: int) -> bytes:
        """What round `round_number`'s proposer and steward orders are drawn from: the hash of the
        state certified before it (no key could know it when it was made), or the run ID."""
        certificate = self.replica.state.certificates.get(round_number - 1)
        return self.run_id if certificate is None else certificate.hash

    def _connected(self, author: bytes) -> bool:
        return self._peer_id(author) in self.node.peers

    def status(self) -> dict[str, Any]:
        state = self.replica.state
        next_round = state.round + 1
        return {
            "next_round": {
                "round": next_round,
                "electorate": len(self.replica.electorate(next_round)),
                "commits": len(self.replica.commits(next_round)),
                "proposals": len(self.replica.proposals(next_round)),
                "votes": sorted(h.hex()[:12] for h in self.replica.votes(next_round).values()),
                "contributors": None if self.work is None else len(self.work.payloads),
            },
            "run_id": short_run_id(self.run_id),
            "phase": "failed" if self.failure else "banned" if self.banned else self.machine.phase.value,
            "attempt": len(self.replica.attempts(next_round)) - 1,
            "waiting": self._waiting(),
            "error": self.failure,
            "banned": self.banned is not None,
            "ban_reason": self.banned,
            "round": self.machine.state_round,
            "certified": state.round,
            "members": len(state.members),
            "peers": len(self.node.host.get_connected_peers()),
            "state_hash": (self.machine.state_hash or b"").hex(),
            "params": self.participant.outer.numel,
            "inner_steps": self.participant.settings.inner_steps,
            "payloads_sent": self.payloads_sent,
            "initial_eval_loss": self.initial_eval.get("loss"),
            "history": [record.to_json() for record in self.history],
        }

    def _waiting(self) -> dict[str, Any]:
        """What the round waits for, and on whom (peer IDs)."""
        state = self.replica.state
        what, on = self.machine.waiting_on(frozenset(self.replica.votes(state.round + 1)))
        return {"for": what, "on": sorted(self._peer_id(author) for author in on)}

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
                    self.work = RoundWork(r, trio.current_time())
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
                case rm.PublishVote(round=r, state_hash=state_hash, proposer=proposer):
                    fields = {} if proposer is None else {"proposer": proposer}
                    self.crdt.write(self.run_id, "vote", round=r, hash=state_hash, **fields)
                case rm.PublishTimeout(round=r, attempt=attempt):
                    logger.warning("round %d: attempt %d passed the round deadline (%.0f s) uncertified; waiting for %s",
                                   r, attempt, self.machine.timing.round_deadline, self._waiting_text())
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
                    logger.info("our membership lapsed (no commit or vote for a while); joining again from round %d", r)
                    self.crdt.write(self.run_id, "join", round=r)
                case rm.RoundDone():
                    self._start([], self._record, action, self.work)

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
        contribution = await self._committed_before(work.round)
        if contribution is not None:
            self._cancel_ahead()
        elif self.delayed:
            contribution = await self._train_delayed(work)
        else:
            async with self._training:
                contribution = await self.compute(self.participant.train, work.stop_training.is_set)
        manifest = await self.offload(self._store_payload, work.round, contribution.payload)
        work.payload_id, work.payload_size = manifest.id, len(contribution.payload)
        work.train_loss, work.train_seconds = contribution.train_loss, contribution.seconds
        work.payloads[self.me] = contribution.payload
        self.payloads_sent += 1
        self._emit(rm.Trained(work.round, manifest.id, len(contribution.payload), contribution.seconds, trio.current_time()))

    async def _committed_before(self, round_number: int) -> Any:
        """The payload we committed to for this round before a restart, from our store: a second,
        different commitment would be an equivocation (a ban). None if we made none (or lost it:
        then `CrdtService.write` refuses the new commitment, and the round goes on without us)."""
        said = self.replica.facts.commits_in(round_number).get(self.me)
        if not said:
            return None
        ((payload_id, size),) = said
        try:
            limits = self.participant.payload_limits(self.run_id, round_number, size)
        except ValueError:
            return None
        payload = await self._stored_payload(round_number, payload_id, limits)
        if payload is None:
            logger.warning("round %d: our payload committed before a restart is not in the store", round_number)
            return None
        logger.info("round %d: contributing the payload we committed to before a restart", round_number)
        return SimpleNamespace(payload=payload, train_loss=None, seconds=0.0)  # what `_train` reads

    async def _train_delayed(self, work: RoundWork) -> Any:
        """This round's contribution, trained ahead if it was (else now, from θ); then the next
        round's inner steps start, from θ moved by this contribution (`Participant.delayed_start`)."""
        ahead = self._ahead
        if ahead is not None and ahead.round == work.round:
            await ahead.done.wait()
            contribution = ahead.contribution
            work.trained_ahead = contribution is not None
        else:
            self._cancel_ahead()
            contribution = None
        if contribution is None:
            async with self._training:
                contribution = await self.compute(self.participant.train, work.stop_training.is_set)
        async with self._compute:  # θ is the state this round's aggregate will land on until that runs
            start = await self.compute(self.participant.delayed_start, contribution)
        self._ahead = TrainingAhead(work.round + 1)
        self._start(self._ahead.scopes, self._train_ahead, self._ahead, start)
        return contribution

    async def _train_ahead(self, ahead: TrainingAhead, start: Any) -> None:
        try:
            async with self._training:
                ahead.contribution = await self.compute(self.participant.train, ahead.stop.is_set, start)
        finally:
            ahead.done.set()

    def _cancel_ahead(self, round_number: int | None = None) -> None:
        """Stop training ahead (only if it is for `round_number`, when given): its base is gone."""
        ahead = self._ahead
        if ahead is not None and round_number in (None, ahead.round):
            ahead.cancel()
            self._ahead = None

    def _store_payload(self, round_number: int, payload: bytes) -> Any:
        store = checkpoint_store()
        tensors = {"payload": np.frombuffer(payload, dtype=np.uint8)}
        return store.write_checkpoint(self.directory, tensors, {"round": round_number, "run": self.run_id, "kind": "payload"})

    async def _fetch(self, work: RoundWork, author: bytes, payload_id: bytes, size: int) -> None:
        """Fetch one payload, trying again while FETCH_TIMEOUT lasts: a provider that is busy, or a
        payload that only its author has so far, is a reason to wait, not to leave it out (a peer
        that leaves out what the others include votes for another hash). Two things end the wait
        early. An author we hold no connection to after a failed try is gone (it crashed after its
        commit; each try waits for dials to it to time out): its payload is given up then. And once
        the round's cutoff has passed, a payload of which no byte arrived for STALL_SECONDS (or a
        window, if longer) is one nobody serves: its author withholds it, and would otherwise cost
        every round FETCH_TIMEOUT. If another peer has it, the round's proposal makes us fetch it again."""
        payload, started = None, trio.current_time()
        try:
            limits = self.participant.payload_limits(self.run_id, work.round, size)
        except ValueError as error:  # a bad commit: no payload of this run is that size, so nothing is fetched
            logger.warning("round %d: the commit of %s is bad: %s", work.round, peer_id_from_public_key(author), error)
            limits = None
        progress = DownloadProgress(payload_id)  # kept across tries: its byte count shows a stall
        with trio.move_on_after(min(FETCH_TIMEOUT, self.machine.timing.round_deadline / 4)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._give_up_when_stalled, work, progress, nursery.cancel_scope)
                while payload is None and limits is not None:
                    try:
                        payload = await self._download_payload(work.round, author, payload_id, limits, progress)
                    except REFUSED as error:  # a bad payload: trying again gives the same
                        logger.warning("round %d: the payload committed by %s is refused: %s", work.round,
                                       peer_id_from_public_key(author), error)
                        break
                    if payload is None:
                        if not self._connected(author):
                            break
                        await trio.sleep(FETCH_RETRY_SECONDS)
                nursery.cancel_scope.cancel()
        if payload is not None:
            work.payloads[author] = payload
            work.arrived[author] = trio.current_time()
        logger.debug("round %d: payload of %s %s after %.2f s", work.round, peer_id_from_public_key(author),
                     "fetched" if payload is not None else "not fetched", trio.current_time() - started)
        self._emit(rm.Fetched(work.round, author, payload is not None, trio.current_time()))

    async def _give_up_when_stalled(self, work: RoundWork, progress: DownloadProgress, fetch: trio.CancelScope) -> None:
        """Cancel `fetch` once the round's cutoff has passed and no byte arrived for a while
        (waking only when that could first be true, not on a polling tick)."""
        seen_bytes, since = progress.bytes_fetched, trio.current_time()
        while (current := self.machine.current) is not None and current.number == work.round:
            stall = max(STALL_SECONDS, self.machine.window())
            cutoff = self.machine.cutoff() if current.first_seen is not None else math.inf
            now = trio.current_time()
            if progress.bytes_fetched != seen_bytes:
                seen_bytes, since = progress.bytes_fetched, now
            elif now >= cutoff and now - since >= stall:
                logger.info("round %d: no byte of a payload for %.1f s after the cutoff: given up", work.round, now - since)
                fetch.cancel()
                return
            await trio.sleep_until(max(min(cutoff, now + stall), since + stall, now + STALL_POLL_SECONDS))

    async def _download_payload(self, round_number: int, author: bytes, payload_id: bytes, limits: Any,
                                progress: DownloadProgress) -> bytes | None:
        providers = [peer_id_from_public_key(author), *self._other_members(exclude=author)]
        try:
            await download_checkpoint(self.node, self.directory, payload_id, providers, scores=self.scores,
                                      progress=progress, offload=self.offload, limits=limits)
        except REFUSED:
            raise
        except (DownloadError, OSError, ValueError) as error:
            logger.info("round %d: payload of %s not fetched: %s", round_number, peer_id_from_public_key(author), error)
            return None
        data = await self._stored_payload(round_number, payload_id, limits)
        if data is None:
            logger.warning("round %d: the payload %s committed by %s is not a payload of this round",
                           round_number, payload_id.hex()[:12], peer_id_from_public_key(author))
        return data

    async def _stored_payload(self, round_number: int, payload_id: bytes, limits: Any) -> bytes | None:
        """The payload `payload_id` of this run's round `round_number` from our store; None if it
        is not there whole, or is no such payload (or breaks the `limits` of one)."""
        try:
            tensors, metadata = await self.offload(checkpoint_store().load_checkpoint, self.directory, payload_id, limits)
        except (OSError, ValueError):
            return None
        payload = tensors.get("payload")
        if metadata.get("round") != round_number or metadata.get("run") != self.run_id or payload is None:
            return None
        return payload.numpy().tobytes()

    async def _aggregate(self, work: RoundWork, authors: tuple[bytes, ...], last_commit: float) -> None:
        """The outer step and the vote; then, off the critical path, the state checkpoint. The
        vote names the new state's hash, computed in memory; compressing and storing the state
        runs while the next round trains (a snapshot of the state: the outer step never writes
        into arrays it handed out)."""
        payloads = {author: work.payloads[author] for author in authors if author in work.payloads}
        arrivals = [work.arrived[author] for author in authors if author in work.arrived]
        work.fetch_seconds = max(0.0, max(arrivals, default=last_commit) - last_commit)
        state_hash = snapshot = None
        async with self._compute:
            try:
                started = trio.current_time()
                await self.compute(self.participant.aggregate, payloads)
                work.aggregate_seconds = trio.current_time() - started
                work.exchange_seconds = trio.current_time() - last_commit
                state_hash = await self.compute(self.participant.state_hash)
                snapshot = self.participant.snapshot()
            except ValueError as error:  # EmptyRoundError, AggregatorError: nothing valid to apply
                logger.warning("round %d: no aggregate: %s", work.round, error)
        self._emit(rm.Aggregated(work.round, state_hash, trio.current_time()))
        if snapshot is not None:
            self._store_later(work.round, snapshot, state_hash)

    def _store_later(self, round_number: int, snapshot: Any, state_hash: bytes) -> None:
        """Queue a state for `_store_states`. Only the newest waits: when storing falls behind the
        rounds (a busy machine), an older state that was never stored is dropped rather than
        queued, so at most two states are held (being written, waiting) and the one offered to
        syncing peers is the newest."""
        self._unstored = (round_number, snapshot, state_hash)
        if not self._storing:
            self._storing = True
            assert self._nursery is not None
            self._nursery.start_soon(self._store_states)

    async def _store_states(self) -> None:
        try:
            while self._unstored is not None:
                (round_number, snapshot, state_hash), self._unstored = self._unstored, None
                await self._store_state(round_number, snapshot, state_hash)
        finally:
            self._storing = False

    async def _store_state(self, round_number: int, snapshot: Any, state_hash: bytes) -> None:
        """Write the state we voted for as a checkpoint if we are one of the round's stewards, then
        attest it (peers that sync fetch it from the stewards); a peer that is not only attests."""
        steward = self.me in self._stewards(round_number)
        try:
            if steward:
                manifest = await self.offload(snapshot.save, self.directory, self.run_id)
            else:
                manifest = await self.offload(snapshot.manifest, self.run_id)
        except (OSError, ValueError) as error:  # a full disk, say: we keep training, others offer the state
            logger.error("round %d: the state was not stored: %s", round_number, error)
            return
        if manifest.state_hash != state_hash:  # a bug, never a peer's doing: do not offer it
            logger.error("round %d: the stored state is not the state voted for", round_number)
            return
        self.crdt.write(self.run_id, "checkpoint", round=round_number, id=manifest.id, size=manifest.raw_size)

    async def _sync(self, round_number: int, state_hash: bytes) -> None:
        adopted = None
        with trio.move_on_after(SYNC_TIMEOUT):
            adopted = await self._download_state(round_number, state_hash)
        self._emit(rm.Synced(round_number, adopted, trio.current_time()))

    async def _download_state(self, round_number: int, state_hash: bytes) -> bytes | None:
        """Download and load the certified state of `round_number`: each checkpoint its voters
        attested, most attested first, until one holds the certified state (a minority of voters
        can attest a bogus ID; it costs a manifest, not the sync)."""
        for checkpoint in self.replica.checkpoint_candidates(round_number):
            if await self._try_state(round_number, state_hash, checkpoint.id):
                logger.info("run %s: synced to round %d", short_run_id(self.run_id), round_number)
                return state_hash
        return None  # nobody attested it yet, or no attested one held it: the machine asks again

    async def _try_state(self, round_number: int, state_hash: bytes, checkpoint_id: bytes) -> bool:
        try:
            await download_checkpoint(self.node, self.directory, checkpoint_id, self._state_providers(round_number),
                                      scores=self.scores, progress=DownloadProgress(checkpoint_id), offload=self.offload,
                                      limits=self.participant.state_limits(self.run_id, round_number))
            manifest = await self.offload(_read_installed_manifest, self.directory, checkpoint_id)
        except (DownloadError, OSError, ValueError) as error:
            logger.info("round %d: state download failed: %s", round_number, error)
            return False
        if manifest.state_hash != state_hash:
            logger.warning("round %d: attested checkpoint %s is not the certified state", round_number, checkpoint_id.hex()[:12])
            return False
        async with self._compute:
            try:
                await self.compute(self.participant.load, self.directory, checkpoint_id, self.run_id)
            except ValueError as error:
                logger.warning("round %d: the certified state does not fit this run: %s", round_number, error)
                return False
        return True

    async def _record(self, done: rm.RoundDone, work: RoundWork | None) -> None:
        now = trio.current_time()
        evaluation: dict[str, Any] = {"loss": None, "floor": None}
        if self.participant.evaluation_due():
            async with self._compute:
                evaluation = await self.compute(self.participant.evaluate)
        self.history.append(RoundRecord.of(done, work, evaluation, now))
        await self.offload(self._forget_old_rounds, done.round)

    def _forget_old_rounds(self, round_number: int) -> None:
        """Delete this run's payloads and states from before the last KEPT_ROUNDS rounds (a peer that
        syncs wants the newest certified state; older ones only fill the disk)."""
        oldest = round_number - KEPT_ROUNDS
        checkpoint_store().remove_checkpoints(
            self.directory, lambda meta: meta.get("run") == self.run_id and meta.get("round", oldest) < oldest
        )

    def _state_providers(self, round_number: int) -> list[str]:
        """Who to ask for round `round_number`'s state: its stewards first, then the other members."""
        first = [peer_id_from_public_key(key) for key in self._stewards(round_number) if key != self.me]
        return first + [peer for peer in self._other_members() if peer not in first]

    def _stewards(self, round_number: int) -> list[bytes]:
        return rm.state_stewards(round_number, self._seed(round_number), self.replica.electorate(round_number))

    def _other_members(self, exclude: bytes | None = None) -> list[str]:
        return [peer_id_from_public_key(member) for member in self.replica.state.members
                if member not in (self.me, exclude)]


def _read_installed_manifest(directory: Path, checkpoint_id: bytes) -> Manifest:
    return read_manifest(manifest_path(directory, checkpoint_id).read_bytes(), expected_id=checkpoint_id)
