"""Whose set a round aggregates, for the round machine (step 4 of `machine`'s theory of operation,
and step 7's set to converge on): the proposers' turns in the order drawn for the attempt, which
proposals are acceptable, the set we would propose ourselves, and when we publish it.

`Proposing` holds those methods; `RoundMachine` inherits them (as it does `replay.Replaying`'s
and `attempts.Attempts`').
"""

from __future__ import annotations

from typing import Iterator

from locomesh.node.rounds.events import Action, Author, Observation, PublishProposal
from locomesh.node.rounds.orders import proposer_order

PATIENCE = 5  # windows a proposer that committed this round gets before the next one takes over


class Proposing:
    """The proposal choice of `machine.RoundMachine` (which sets `me`, `current`, `last` and
    provides `window`, `_follow` and `_converged`)."""

    def _propose_or_follow(self, now: float) -> list[Action]:
        """After a split, follow the set the split's votes converge on (`_converged`); else the
        first acceptable proposal in proposer order whose turn has come (switching to it if we
        followed a later one), or publish ours when our turn comes with none before it, or once
        every turn passed with none to follow."""
        work, seen = self.current, self.last
        converged = self._converged()
        if converged is not None:
            proposal = seen.proposals[converged]
            return [] if proposal == work.chosen else self._follow(converged, proposal)
        turns = list(self.turns())
        for proposer, starts, ends in turns:
            proposal = seen.proposals.get(proposer)
            if proposal is not None and self._acceptable(proposal, seen):
                return [] if proposal == work.chosen else self._follow(proposer, proposal)
            if proposal is None and proposer == self.me and work.chosen is None and now >= starts:
                if self._confirming(seen) and now < starts + self.window():
                    if proposer == turns[-1][0]:
                        return []  # the last turn: no later set to follow, and nobody else's turn ends ours
                    continue  # a payload we hold waits to be seen at its committees (a window at most): follow a later set
                # the last proposer proposes anyway: its vote may be the quorum (round 1's creator)
                if (own := self._own_set()) and (self._acceptable(own, seen) or proposer == turns[-1][0]):
                    return self._propose(own)
                continue
            if now < ends:
                return []  # still this proposer's turn
        # Every turn passed with no set to follow: a vote for our own set still ends the attempt
        # (a split), and the next one converges on the set most votes named.
        if work.chosen is None and self.me in seen.electorate and self.me not in seen.proposals and (own := self._own_set()):
            return self._propose(own)
        return []

    def _confirming(self, seen: Observation) -> bool:
        """Is a payload we counted and fetched still unconfirmed (sharded: `Observation.unconfirmed`)?"""
        work = self.current
        return bool(work.counted & work.fetched & seen.unconfirmed)

    def _propose(self, own: tuple[Author, ...]) -> list[Action]:
        return [PublishProposal(self.current.number, own), *self._follow(self.me, own)]

    def _own_set(self) -> tuple[Author, ...]:
        """What we would propose: the commits we counted by our cut whose payloads we hold now
        (a set we can serve whole; in sharded exchange, whose every shard a committee holds:
        `Observation.unconfirmed`), and ours if it was in by then. It grows as payloads that
        failed under load are fetched again (`_refetch`)."""
        work, seen = self.current, self.last
        unconfirmed = seen.unconfirmed if seen is not None else frozenset()
        return tuple(sorted((work.counted & (work.fetched - unconfirmed)) | ({self.me} if work.counted_ours else set())))

    def turns(self) -> Iterator[tuple[Author, float, float]]:
        """(proposer, its turn's start, its end) in proposer order, from our cut on. The order is
        over the electorate, which every peer sees alike (who has committed is not: peers that
        ordered different candidates would wait for different proposers). A proposer whose set
        we gave up on (`_abandon`) has had its turn."""
        work, seen = self.current, self.last
        starts = work.closed_at
        for proposer in proposer_order(work.number, work.seed, seen.electorate, work.attempt):
            if proposer not in work.abandoned:
                ends = starts + self._turn(proposer, seen)
                yield proposer, starts, ends
                starts = ends

    def _turn(self, proposer: Author, seen: Observation) -> float:
        """How long `proposer` may take to propose before the next one's turn."""
        return self.window() * (PATIENCE if proposer in seen.commits and proposer not in seen.unreachable else 1)

    def _acceptable(self, proposal: tuple[Author, ...], seen: Observation) -> bool:
        """Every author named committed, and more than half of the electorate is named (a rule
        that does not depend on anyone's timing, so every honest peer decides alike; and a set of
        keys that merely joined cannot outweigh the members who earned their say)."""
        named = set(proposal)
        return named <= {*seen.commits, self.me} and 2 * len(named & seen.electorate) > len(seen.electorate)
