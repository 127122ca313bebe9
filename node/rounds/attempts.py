"""The attempts of a round, for the round machine (steps 7 to 9 of `machine`'s theory of
operation): the attempt deadline that follows the run's recent rounds, a vote cast again after an
attempt split, the set the members converge on then, and the sync back to the run's history when
it no longer holds our state (a partition healed).

`Attempts` holds those handlers; `RoundMachine` inherits them, and its transition table names them
like its own (as it does `replay.Replaying`'s).
"""

from __future__ import annotations

from locomesh.node.rounds.events import Action, Author, Discard, Observation, Phase, PublishTimeout, StartSync
from locomesh.node.rounds.state import RoundState

DURATION_HISTORY = 8  # rounds whose length (start to certificate, here) sets the attempt deadline
DEADLINE_FACTOR = 3.0  # an attempt may last this many times the longest recent round...
MIN_DEADLINE = 30.0  # ...but never less than this, and never more than the run's round deadline
REWRITE_GRACE = 10.0  # seconds the run's history must leave out our state before we go back to it
WORKING = frozenset({Phase.TRAIN, Phase.COLLECT, Phase.PROPOSE, Phase.REPLAY, Phase.AGGREGATE, Phase.VOTED})


class Attempts:
    """The attempt handlers of `machine.RoundMachine` (which sets `me`, `phase`, `current`, `last`,
    `timing`, `durations`, `state_round`, `state_hash`, `rewritten_since`)."""

    def _rewritten(self, seen: Observation) -> list[Action] | None:
        """Two sides of a partition can each certify rounds on their own (each side more than a
        third of an electorate that timed out the other); once they meet, the merged op set holds
        one history, the same on every replica, and it may not be ours. Sync to its newest
        certified state and go on from there: a rewritten history costs rounds, never the run."""
        ours = (self.state_round, self.state_hash)
        if seen.certified == 0 or ours == (seen.certified, seen.certified_hash) or self.phase is Phase.SYNC:
            self.rewritten_since = None
            return None
        # An op of an old round that arrives late can take a certificate back for a moment (crdt/view.py).
        if self.rewritten_since is None:
            self.rewritten_since = seen.now
        if seen.now - self.rewritten_since < REWRITE_GRACE:
            return None
        self.rewritten_since = None
        actions: list[Action] = [] if self.current is None else [Discard(self.current.number)]
        self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
        self.awaiting_retry = False
        return [*actions, StartSync(seen.certified, seen.certified_hash)]

    def _watch_deadline(self, seen: Observation) -> list[Action]:
        """Follow the round's attempts, and say when the current one passed the run's round
        deadline on our clock: more than a third of the electorate saying so starts the next
        attempt, whose electorate leaves out whoever did not show up (crdt/electorate.py)."""
        work = self.current
        if work is None or self.phase not in WORKING or work.number != seen.certified + 1:
            return []
        if seen.attempt > work.attempt:
            self._new_attempt(seen)
        if seen.now < work.attempt_started + self.deadline() or work.attempt in work.timed_out:
            return []
        work.timed_out.add(work.attempt)
        return [PublishTimeout(work.number, work.attempt)]

    def _new_attempt(self, seen: Observation) -> None:
        """The electorate changed: proposers take their turns again, in the new attempt's order,
        from now; a proposal we gave up on gets another chance (its payloads may be served now)."""
        work = self.current
        work.attempt, work.attempt_started = seen.attempt, seen.now
        work.abandoned.clear()
        if self.phase is Phase.PROPOSE:
            work.closed_at = seen.now

    def _voted_observe(self, seen: Observation) -> list[Action]:
        """Our vote died if the attempt it stood in split (no hash could reach a quorum there): vote
        again in the attempt under way, for the set its members converge on (`_propose_or_follow`).
        An attempt that only timed out keeps our vote standing: we are locked to it."""
        work = self.current
        if work.voted_attempt is None or seen.attempt <= work.voted_attempt or self.me in seen.standing:
            return []
        self.phase, self.voted_hash = Phase.PROPOSE, None
        work.chosen = work.following = work.voted_attempt = None
        work.closed_at = seen.now
        work.failed |= set(work.arrivals) - work.fetched  # fetches still out were dropped when we aggregated
        return self._propose_or_follow(seen.now)

    def _converged(self) -> Author | None:
        """After a split attempt: the proposer whose set most of its votes named (ties: the larger
        set, then the smaller key), if we can still follow that set. Every honest member reads the
        same votes once the attempt split, so they all vote for one set in the next attempt."""
        work, seen = self.current, self.last
        candidates = [p for p in seen.split_votes
                      if p in seen.proposals and p not in work.abandoned and set(seen.proposals[p]) <= {*seen.commits, self.me}]
        if not candidates:
            return None
        return min(candidates, key=lambda p: (-seen.split_votes[p], -len(seen.proposals[p]), p))

    def deadline(self) -> float:
        """How long an attempt may last here before we say it timed out: DEADLINE_FACTOR times the
        longest of the recent rounds certified with us, within [MIN_DEADLINE, the run's round
        deadline] (the run's deadline until a few rounds were seen). A run of fast members does
        not wait the run's whole deadline on one that is gone; a run of slow ones is not cut short."""
        if len(self.durations) < 3:
            return self.timing.round_deadline
        return min(self.timing.round_deadline, max(MIN_DEADLINE, DEADLINE_FACTOR * max(self.durations)))
