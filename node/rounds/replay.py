"""Replaying a round certified without us (step 6 of `machine`'s theory of operation): a peer whose
round was certified while it still trained or collected, and which holds (or is fetching) every
payload of one of that round's proposals, stops training, waits for those fetches and aggregates
that set itself instead of downloading the whole certified state.

`Replaying` holds the round machine's handlers for it; `RoundMachine` inherits them, and its
transition table names them like its own.
"""

from __future__ import annotations

from locomesh.node.rounds.events import (
    Action, Author, Discard, Fetched, Observation, Phase, StartAggregate, StartSync, StopTraining,
)
from locomesh.node.rounds.orders import proposer_order
from locomesh.node.rounds.state import RoundState


class Replaying:
    """The replay handlers of `machine.RoundMachine` (which sets `me`, `phase`, `current`, `last`)."""

    def _replay_set(self, seen: Observation) -> tuple[Author, ...] | None:
        """The first proposal of the certified round, in proposer order, whose payloads we hold
        or are fetching (ours only if we committed it); None if there is none."""
        work = self.current
        ours = {self.me} if work.committed_at is not None else set()
        coming = work.fetched | (set(work.arrivals) - work.failed)
        for proposer in proposer_order(work.number, work.seed, set(seen.certified_proposals)):
            authors = seen.certified_proposals[proposer]
            if set(authors) <= coming | ours:
                return authors
        return None

    def _start_replay(self, authors: tuple[Author, ...]) -> list[Action]:
        work = self.current
        work.chosen, work.replay, self.phase = authors, True, Phase.REPLAY
        return [StopTraining(work.number), *self._replay_if_ready()]

    def _replay_fetched(self, done: Fetched) -> list[Action]:
        """A payload arrived (or failed) while we wait to replay: replay once the set is in; a
        failure means the set cannot be rebuilt here, so sync."""
        work, seen = self.current, self.last
        if not done.ok and done.author in work.chosen:
            self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
            return [Discard(work.number), StartSync(seen.certified, seen.certified_hash)]
        if done.ok:
            work.fetched.add(done.author)
        return self._replay_if_ready()

    def _replay_if_ready(self) -> list[Action]:
        work = self.current
        if not set(work.chosen) - {self.me} <= work.fetched:
            return []
        self.phase = Phase.AGGREGATE
        return [StartAggregate(work.number, work.chosen, work.last_commit, replay=True)]
