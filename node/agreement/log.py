"""The messages of one round in one epoch, as the agreement counts them: read out of a replica.

The agreement's messages are CRDT ops (crdt/ops/: proposal, prevote, precommit), gossiped and
anti-entropied like every op; `Log.of` reads those of one round and epoch into the tallies the
Tendermint machine's "upon" rules ask about (tendermint.py). Only members of the round's
electorate count; a member that sent two different messages of one kind for one attempt (an
equivocation, a ban once named) counts for each, as Tendermint's analysis allows: fewer than a
third of the electorate are Byzantine, whatever they send.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from locomesh.crdt import Chain, Facts, Value
from locomesh.crdt.quorum import is_more_than_a_third, is_quorum

NIL = b""


@dataclass(frozen=True)
class Proposal:
    attempt: int
    value: Value
    valid_round: int  # Tendermint's vr: -1 for none
    op: bytes  # the proposal op's ID


@dataclass
class Log:
    """What members of the electorate said in round `round` of epoch `epoch` so far."""

    round: int
    epoch: int
    electorate: frozenset[bytes]
    me: bytes
    # The first round of a recovery epoch: a majority stands for 2f + 1 (crdt/chain.py).
    majority: Callable[[set[bytes]], bool] | None = None
    proposals: dict[int, list[Proposal]] = field(default_factory=dict)  # attempt -> its proposer's proposals
    prevotes: dict[int, dict[bytes, set[bytes]]] = field(default_factory=dict)  # attempt -> value ID -> authors
    precommits: dict[int, dict[bytes, set[bytes]]] = field(default_factory=dict)  # attempt -> value ID -> authors
    senders: dict[int, set[bytes]] = field(default_factory=dict)  # attempt -> who sent anything in it
    own_prevotes: dict[int, bytes] = field(default_factory=dict)  # attempt -> the value ID we prevoted
    own_precommits: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # attempt -> (value ID, state)
    own_proposals: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, chain: Chain, facts: Facts, me: bytes) -> Log:
        """The log of the chain's tip round, in the tip's epoch."""
        tip = chain.tip
        majority = None if tip.recovering is None else (lambda who: chain.recovery_quorum(who, tip.electorate))
        log = cls(tip.round, tip.epoch.number, tip.electorate, me, majority)
        for author, rows in facts.in_round("proposal", tip.round).items():
            for op, _author, _round, epoch, attempt, valid, *_value in rows:
                if epoch != log.epoch:
                    continue
                if author == me:
                    log.own_proposals.add(attempt)
                if author in log.electorate and author == chain.proposer(attempt):
                    row = (op, author, tip.round, epoch, attempt, valid, *_value)
                    log.proposals.setdefault(attempt, []).append(Proposal(attempt, Value.of_proposal(row), valid - 1, op))
                    log.senders.setdefault(attempt, set()).add(author)
        for author, rows in facts.in_round("prevote", tip.round).items():
            for _author, _round, epoch, attempt, value in rows:
                if epoch == log.epoch:
                    log._count(log.prevotes, author, attempt, value)
                    if author == me:
                        log.own_prevotes[attempt] = value
        for author, rows in facts.in_round("precommit", tip.round).items():
            for _op, _author, _round, epoch, attempt, value, state in rows:
                if epoch == log.epoch:
                    log._count(log.precommits, author, attempt, value)
                    if author == me:
                        log.own_precommits[attempt] = (value, state)
        return log

    def _count(self, tally: dict[int, dict[bytes, set[bytes]]], author: bytes, attempt: int, value: bytes) -> None:
        if author in self.electorate:
            tally.setdefault(attempt, defaultdict(set))[value].add(author)
            self.senders.setdefault(attempt, set()).add(author)

    # --- the counts the "upon" rules ask for ------------------------------------------------------

    def quorum_of(self, authors: set[bytes]) -> bool:
        """2f + 1: more than two thirds of the electorate (a majority, in a recovery epoch's first round)."""
        if self.majority is not None:
            return self.majority(authors & self.electorate)
        return is_quorum(len(authors & self.electorate), len(self.electorate))

    def prevoted(self, attempt: int, value: bytes) -> bool:
        """2f + 1 ⟨PREVOTE, h, attempt, value⟩ (value NIL: nil)."""
        return self.quorum_of(self.prevotes.get(attempt, {}).get(value, set()))

    def prevoted_any(self, attempt: int) -> bool:
        """2f + 1 ⟨PREVOTE, h, attempt, ∗⟩."""
        return self.quorum_of(set().union(*self.prevotes.get(attempt, {}).values()))

    def precommitted_any(self, attempt: int) -> bool:
        """2f + 1 ⟨PRECOMMIT, h, attempt, ∗⟩."""
        return self.quorum_of(set().union(*self.precommits.get(attempt, {}).values()))

    def later_attempt(self, attempt: int) -> int | None:
        """The highest attempt past `attempt` from which f + 1 members sent a message (line 55)."""
        later = [a for a, who in self.senders.items()
                 if a > attempt and is_more_than_a_third(len(who & self.electorate), len(self.electorate))]
        return max(later, default=None)

    def proposals_in(self, attempt: int) -> list[Proposal]:
        return self.proposals.get(attempt, [])

    def locked_by_us(self) -> tuple[int, bytes] | None:
        """(attempt, value ID) of our highest precommit of a value in this round and epoch (our lock
        after a restart); None if we precommitted none."""
        ours = [(attempt, value) for attempt, (value, _state) in self.own_precommits.items() if value]
        return max(ours, default=None)

    def newest_own_attempt(self) -> int:
        return max([*self.own_prevotes, *self.own_precommits, *self.own_proposals], default=0)
