"""A participation's inner steps: this round's payload, and with one-round-delayed outer updates
the next round's, trained while this one is exchanged (`TrainingAhead`).

`Training` holds these tasks; `RunParticipation` (participation.py) inherits them and starts them
for the round machine's `StartTraining`.

- Training and the outer step run in a worker thread (torch and numpy release the GIL), one at a
  time under the compute lock, so a discarded round's thread finishes before a sync touches the
  state. With delayed updates (the run's `delayed_updates`) training runs under a lock of its own
  instead: once round r's payload is made, round r+1's inner steps start at once, from
  `Participant.delayed_start`, while round r is agreed on and certified; when the machine then
  starts round r+1, its payload is (nearly) ready.
- A payload committed before a restart is contributed again, never a new one: two commits for
  one round are an equivocation (`RoundExchange.committed_before`).
"""

from __future__ import annotations

from typing import Any

import trio

from locomesh.node.exchange.work import RoundWork
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.work import TrainingAhead


class Training:
    """The training tasks of `participation.RunParticipation` (which sets `participant`, `exchange`,
    `compute`, `data`, `replica`, `me`, `_training`, `_compute`, `_ahead`, `delayed`, `payloads_sent`)."""

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
        roster = self.replica.contributors(round_number) or frozenset({self.me})
        shards = await self.data.shards(round_number, roster)
        self._start([], self.data.prefetch, round_number + 1, roster)
        return shards

    def _cancel_ahead(self, round_number: int | None = None) -> None:
        """Stop training ahead (only if it is for `round_number`, when given): its base is gone."""
        ahead = self._ahead
        if ahead is not None and round_number in (None, ahead.round):
            ahead.cancel()
            self._ahead = None
