"""A participation's part in the agreement: what the seat (node/agreement/seat.py) asks, answered.

The seat runs the Tendermint machine of the round under way over the replica; this module carries
out what it writes (its proposal, prevote, precommit and recover ops) and answers its questions,
each in a task of its own so the participation's loop never waits:

- **getValue()** (`NeedValue`): once the round's cutoff passed (the machine's: its first commit
  seen plus a window) and the payloads of the commits seen by then are in hand or given up, the
  value of what we hold (node/agreement/proposing.py: in sharded exchange, only payloads whose
  every shard a member other than its author holds); until the propose timeout, a value that the
  rules refuse (too few payloads) waits for more;
- **valid(v)** (`Check`): every payload v names in hand (allgather), or each of their shards held
  by a member other than its author (sharded), fetching what is missing, within a bound;
- **the state of v** (`Hash`): the outer step of v's payloads from the round's starting state,
  kept by value (the round may decide another: `work.results`), hashed. A member still training
  stops its inner steps for a value without its payload: voting never waits for training.

The timeouts follow the run's pace (`timeouts`): the propose timeout covers the cutoff and the
fetches of a round, the precommit timeout an outer step; a round that goes `recover_after` attempt
deadlines uncertified signs a recover (node/agreement/recovery.py).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from locomesh.crdt import Value
from locomesh.node.agreement import tendermint as tm
from locomesh.node.agreement.proposing import own_value
from locomesh.node.agreement.seat import Answer, Asked, Out, Write
from locomesh.node.exchange.sharded import ProposalWithheld
from locomesh.node.exchange.work import RoundWork
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.outcome import refusal

logger = logging.getLogger(__name__)

MIN_PROPOSE = 5.0  # seconds: the propose timeout never goes below this
MIN_VOTE = 3.0  # nor the prevote and precommit timeouts below this
FIRST_PROPOSE = 60.0  # the propose timeout before any round was seen here
CHECK_TRIES = 3  # failed fetches of one payload before a value naming it is invalid here
MIN_DEADLINE = 30.0  # an attempt deadline (what recover_after counts) never goes below this
DEADLINE_FACTOR = 3.0  # an attempt deadline is this many times the longest recent round...
RETRY_SECONDS = 1.0
LOOK_SECONDS = 0.2  # how often a waiting question looks again


class Deciding:
    """The agreement's side of `participation.RunParticipation` (which sets `seat`, `machine`,
    `replica`, `crdt`, `exchange`, `participant`, `me`, `run_id`, `work`, `compute`, `_compute`)."""

    def _agree(self) -> None:
        """Show the seat the replica, and carry out what it says."""
        self._carry_out_seat(self.seat.observe(self.replica.chain, self.replica.facts, trio.current_time()))

    def _carry_out_seat(self, outs: list[Out]) -> None:
        for out in outs:
            if isinstance(out, Write):
                self._write_vote(out)
            elif isinstance(out.question, tm.NeedValue):
                self._start([], self._propose_value, out)
            elif isinstance(out.question, tm.Check):
                self._start([], self._check_value, out)
            else:
                self._start([], self._hash_value, out)

    def _write_vote(self, write: Write) -> None:
        fields = write.fields
        if write.op_type == "recover":
            logger.warning("round %d: no certificate after %.0f s; signing a recover from round %d (epoch %d)",
                           fields["round"] + 1, self.recover_after(), fields["round"], fields["epoch"])
        elif write.op_type == "proposal":
            logger.info("round %d: proposing %d payloads (attempt %d)", fields["round"], len(fields["set"]),
                        fields["attempt"])
        else:
            logger.debug("round %d: %s %s (attempt %d)", fields["round"], write.op_type,
                         fields["value"].hex()[:12] or "nil", fields["attempt"])
        self.crdt.write(self.run_id, write.op_type, **fields)

    def _answer(self, asked: Asked, answer: Any) -> None:
        self._carry_out_seat(self.seat.answer(Answer(asked.round, asked.epoch, answer)))

    def _current(self, asked: Asked) -> bool:
        """Is `asked` about the round and epoch the seat's machine is in now?"""
        return self.seat.at == (asked.round, asked.epoch)

    # --- getValue() -------------------------------------------------------------------------------

    async def _propose_value(self, asked: Asked) -> None:
        attempt = asked.question.attempt
        waiting_since = trio.current_time()
        while self._current(asked):
            now = trio.current_time()
            if attempt == 0 and not self._cut_reached(asked.round, now):
                await self._look()
                continue
            held = self._held(asked.round)
            value = own_value(self.replica.chain, self.replica.facts, held)
            if value is not None or now - waiting_since >= self.timeouts().of("propose", attempt):
                if value is None:
                    logger.info("round %d: nothing to propose in attempt %d: payloads of %d members in hand, too few",
                                asked.round, attempt, len(held))
                self._answer(asked, tm.ValueReady(attempt, value))
                return
            await self._look()

    def _cut_reached(self, round_number: int, now: float) -> bool:
        """The cutoff passed and every commit seen by then is fetched or given up."""
        current = self.machine.current
        if current is None or current.number != round_number or now < self.machine.cutoff():
            return False
        counted = {author for author, at in current.arrivals.items() if at <= self.machine.cutoff()}
        return counted <= current.fetched | current.failed

    def _held(self, round_number: int) -> set[bytes]:
        """The authors whose payloads we hold for `round_number` (ours once committed), less, in
        sharded exchange, those not yet seen held by another member."""
        current, work = self.machine.current, self.work
        if current is None or current.number != round_number:
            return set()
        held = set(current.fetched) | ({self.me} if current.committed_at is not None else set())
        if work is not None and work.round == round_number:
            held -= self.exchange.unconfirmed(work, held)
        return held

    # --- valid(v) ---------------------------------------------------------------------------------

    async def _check_value(self, asked: Asked) -> None:
        value = asked.question.value
        ok = False
        with trio.move_on_after(self.machine.timing.round_deadline / 4):
            ok = await self._holds(asked.round, value)
        if self._current(asked):
            self._answer(asked, tm.Checked(value.id, ok))

    async def _holds(self, round_number: int, value: Value) -> bool:
        """Do we hold what `value` names (fetching what we lack)? A proposer that does not serve its
        own payload is given up on at its first failed fetch: an honest one holds it."""
        work = self._work_for(round_number)
        authors = self._authors(value)
        if authors is None:
            return False
        machine = self.seat.machine
        proposer = None if machine is None else self.replica.chain.proposer(machine.attempt)
        results: dict[bytes, bool] = {}

        async def one(author: bytes) -> None:
            results[author] = await self._payload(work, author, tries=1 if author == proposer else CHECK_TRIES)

        async with trio.open_nursery() as nursery:
            for author in authors:
                nursery.start_soon(one, author)
        if not all(results.values()):
            return False
        return not self.exchange.unconfirmed(work, [a for a in authors if a != self.me]) or await self._confirmed(work, authors)

    async def _confirmed(self, work: RoundWork, authors: list[bytes]) -> bool:
        """Sharded: is each shard of each author's payload held by a member other than its author?"""
        results = []

        async def one(author: bytes) -> None:
            results.append(await self.exchange.confirm(work, author) is not False)

        async with trio.open_nursery() as nursery:
            for author in authors:
                if author != self.me:
                    nursery.start_soon(one, author)
        return all(results) and not self.exchange.unconfirmed(work, [a for a in authors if a != self.me])

    async def _payload(self, work: RoundWork, author: bytes, *, tries: int = CHECK_TRIES) -> bool:
        """Is `author`'s payload of `work`'s round there (fetching it, again after a failure, until
        `tries` fetches of it failed)?"""
        if author == self.me:
            return work.committed
        while True:
            if author in work.fetched_ok:
                return True
            if work.fetch_failures.get(author, 0) >= tries:
                return False  # whoever could serve it does not: a proposer's own withheld payload
            done = work.fetching.get(author)
            if done is None or done.is_set():  # none yet, or the last one failed: fetch (again)
                commit = self.replica.commits(work.round).get(author)
                if commit is None:
                    return False
                self._start_fetch(work, author, *commit)
                done = work.fetching[author]
            await done.wait()
            if author in work.fetched_ok:
                return True
            await trio.sleep(RETRY_SECONDS)

    # --- the state of v ---------------------------------------------------------------------------

    async def _hash_value(self, asked: Asked) -> None:
        value = asked.question.value
        authors = self._authors(value)
        state = None if authors is None else await self._compute_value(asked.round, value.id, tuple(authors))
        if self._current(asked):
            self._answer(asked, tm.Hashed(value.id, state))

    async def _compute_value(self, round_number: int, value_id: bytes, authors: tuple[bytes, ...]) -> bytes | None:
        """The state hash the outer step of `authors`' payloads gives from the round's starting
        state (kept in `work.results`); None if it cannot be computed, or the round's certified
        state is already ours. Tells the round machine."""
        work = self._work_for(round_number)
        if self.me not in authors and self.machine.phase is rm.Phase.TRAIN:
            work.stop_training.set()  # decided without our payload: no vote waits for our inner steps
        async with work.aggregating:
            if value_id in work.results:
                return work.results[value_id][0]
            state_hash = None
            try:
                if await self._back_to_round_start(work):
                    gathered = await self.exchange.gather(work, authors, electorate=self.replica.electorate(round_number))
                    state_hash = await self._outer_step(work, value_id, authors, gathered)
            except ProposalWithheld as withheld:
                logger.warning("round %d: the value cannot be aggregated: %s", round_number, withheld)
            except ValueError as error:  # EmptyRoundError, AggregatorError: nothing valid to apply
                logger.warning("round %d: no aggregate: %s", round_number, error)
            if state_hash is None:
                work.results.setdefault(value_id, (None, None))
        self._emit(rm.Computed(round_number, value_id, state_hash, trio.current_time()))
        return state_hash

    async def _back_to_round_start(self, work: RoundWork) -> bool:
        """Put θ back to the round's starting state (a shard's aggregate and the outer step read
        it); False once the round's certified state is ours, which nothing may move."""
        async with self._compute:
            if work.adopted is not None:
                return False
            if work.before is None:
                work.before = self.participant.snapshot()
            elif work.holds is not None:  # the state of another value of the round
                self.participant.adopt(work.before.tensors, work.before.round)
            work.holds = None
            return True

    async def _outer_step(self, work: RoundWork, value_id: bytes, authors: tuple[bytes, ...], gathered: Any) -> bytes | None:
        async with self._compute:
            if work.adopted is not None:
                return None
            if self.scoring.enabled and not work.sharded:  # θ before this step: what contributions are scored on
                work.scoring_base, work.aggregated = self.participant.scoring_base(), authors
            started = trio.current_time()
            work.refused = refusal(await self.exchange.apply(work, gathered, self.compute), self.me)
            work.aggregate_seconds = trio.current_time() - started
            arrivals = [work.arrived[a] for a in authors if a in work.arrived]
            first = min(arrivals, default=started)
            work.fetch_seconds = max(arrivals, default=first) - first
            work.exchange_seconds = trio.current_time() - first
            if work.adopted is not None:  # certified with another value meanwhile: back to its state
                self.participant.adopt(work.results[work.adopted][1].tensors, work.results[work.adopted][1].round)
                work.holds = work.adopted
                return None
            state_hash = await self.compute(self.participant.state_hash)
            work.results[value_id] = (state_hash, self.participant.snapshot())
            work.holds = value_id
        return state_hash

    def _adopt(self, round_number: int, value_id: bytes) -> None:
        """The round was certified with `value_id`, whose state we computed: hold that state, and
        store it (stewards) and attest it, off the critical path."""
        work = self.work
        assert work is not None and work.round == round_number and value_id in work.results
        state_hash, snapshot = work.results[value_id]
        if work.holds != value_id:
            self.participant.adopt(snapshot.tensors, snapshot.round)
            work.holds = value_id
        work.adopted = value_id
        assert self._nursery is not None
        self.states.store_later(self._nursery, round_number, snapshot, state_hash)

    def _authors(self, value: Value) -> list[bytes] | None:
        """The payload authors of `value`, read from its commits (None if one is not held)."""
        authors = []
        for op in value.set:
            found = self.replica.facts.refs.get(op)
            if found is None or found[0] != "commit":
                return None
            authors.append(found[1][1])
        return sorted(authors)

    # --- time ---------------------------------------------------------------------------------------

    def timeouts(self) -> tm.Timeouts:
        """Tendermint's timeouts at the run's pace: attempt 0's propose timeout covers the cutoff
        window and the fetches (twice the longest recent agreement, from first commit to
        certificate), a later attempt's the fetches only (its proposer proposes what it holds at
        once); the precommit timeout covers an outer step (twice the longest recent one); all
        within the run's round deadline."""
        deadline = self.machine.timing.round_deadline
        agreement = max(self.agreements, default=None)
        first = min(FIRST_PROPOSE, deadline / 4) if agreement is None else 2.0 * agreement
        first = min(max(MIN_PROPOSE, first, 2.0 * self.machine.window()), deadline / 2)
        fetch = max((record.fetch_seconds or 0.0 for record in self.history), default=0.0)
        later = min(max(MIN_PROPOSE, 2.0 * fetch), deadline / 2) if agreement is not None else first
        step = max((record.aggregate_seconds or 0.0 for record in self.history), default=0.0)
        vote = max(MIN_VOTE, self.machine.window())
        return tm.Timeouts(propose=later, prevote=vote, precommit=max(vote, 2.0 * step), growth=max(1.0, later / 2),
                           first_propose=first)

    def attempt_deadline(self) -> float:
        """An attempt's deadline: DEADLINE_FACTOR times the longest recent round certified with us,
        within [MIN_DEADLINE, the run's round deadline] (the run's deadline until a few rounds were seen)."""
        deadline = self.machine.timing.round_deadline
        if len(self.machine.durations) < 3:
            return deadline
        return min(deadline, max(MIN_DEADLINE, DEADLINE_FACTOR * self.machine.pace()))

    def recover_after(self) -> float:
        """Seconds a round may go uncertified here before we sign a recover: the run's
        `recover_after` attempt deadlines."""
        return self.participant.settings.recover_after * self.attempt_deadline()

    async def _look(self) -> None:
        await trio.sleep(LOOK_SECONDS)
