"""Who weighs in a round: its contributors, its electorate, the electorate's attempts, its certificate.

Everything here is a pure function of the facts (facts.py) and the genesis, so of the op set.

- **Contributors of round r** (may commit a payload): the unbanned authors whose newest join
  names a round ≤ r, who did not leave before r, and who are *active*: their join names one of
  the last ACTIVITY_WINDOW rounds (r included), or they committed, voted or timed out in one of
  the ACTIVITY_WINDOW rounds before r, and were not left behind by round r-1's timeouts (round
  r-1 saw a `timeout` op, and they wrote nothing for r-1). A crashed member thus stops
  counting after one stalled round, or ACTIVITY_WINDOW quiet ones; a live member that lapsed
  joins again (`has_lapsed`).
- **Influence is earned.** Joining is free, so a join alone buys no weight: the electorate of
  round r (who votes in its quorum, proposes, stores and attests its state) is its contributors
  that are *trusted* — named at genesis (the creator and the allowlist) or with a contribution
  *accepted* by a certified round before r — or all its contributors when none of them is
  trusted yet (a run whose trusted members are all gone has to start over from someone). The
  run's manifest can opt out (`influence = "joined"`: every contributor votes). A round's
  accepted contributions are the set proposed by the proposer that most of the certificate's
  voters name in their votes (ties: the smaller key): a quorum of the electorate aggregated it.
- **Attempts.** Round r's electorate starts as above (attempt 0). When more than a third of an
  attempt's electorate wrote `timeout` ops for it (the run's round deadline passed on their
  clocks with no certificate; more than a third, so at least one honest member saw it), the
  next attempt's electorate is the members of this one that voted in the round or timed out
  this attempt (a live member still at work on the round times out too). A member that crashed,
  even after its commit or after a vote that never left it, thus leaves a stalled round's
  electorate, and the round can be certified without it.
- **Certificate.** Round r is certified with hash h when, in some attempt, more than two thirds
  of that attempt's electorate voted (r, h). Votes are per round, not per attempt (a second
  vote for one round is equivocation), and every attempt's electorate keeps every member that
  voted, so two attempts can never certify different hashes: if h had a quorum V in attempt k,
  every later electorate E contains V, and the voters of another hash number at most
  |E| - |V| < |E| / 3 (|V| > 2|E_k|/3 ≥ 2|E|/3).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .facts import Facts
from .genesis import Genesis

NEVER = -1
ACTIVITY_WINDOW = 2  # rounds a member stays a contributor without a commit, vote or timeout
MAX_ATTEMPTS = 64  # = the op schema's bound on `timeout.attempt`


def is_quorum(signers: int, electorate: int) -> bool:
    """More than two thirds, in integers (no float rounding at the boundary)."""
    return electorate > 0 and 3 * signers > 2 * electorate


def is_more_than_a_third(signers: int, electorate: int) -> bool:
    return electorate > 0 and 3 * signers > electorate


@dataclass(frozen=True)
class Certificate:
    """How round `round` was certified: the hash, who voted it, in which attempt, and whose
    contributions the certified set holds."""

    round: int
    hash: bytes
    voters: frozenset[bytes]
    attempts: tuple[frozenset[bytes], ...]  # the electorates of the attempts up to the certifying one
    accepted: frozenset[bytes]

    @property
    def electorate(self) -> frozenset[bytes]:
        """The electorate of the attempt that certified the round."""
        return self.attempts[-1]


def drawn_order(label: bytes, round_: int, seed: bytes, attempt: int, members: Iterable[bytes]) -> list[bytes]:
    """`members` in an order drawn from (`label`, round, attempt, `seed`): the same on every peer,
    new every round, and no peer can pick its place (the proposers, stewards and committees of
    node/rounds/orders.py, the scoring committee of scores.py)."""
    tag = hashlib.sha256(label + round_.to_bytes(8, "big") + attempt.to_bytes(2, "big") + seed).digest()
    return sorted(members, key=lambda key: hashlib.sha256(tag + key).digest())


# --- bans and contributors ----------------------------------------------------------------------


def banned(facts: Facts) -> set[bytes]:
    return facts.convicted | facts.forked | facts.equivocated


def is_banned(facts: Facts, author: bytes) -> bool:
    return author in facts.forked or author in facts.equivocated or author in facts.convicted


def is_eligible(facts: Facts, author: bytes, round_: int) -> bool:
    """May `author` contribute to round `round_` (see the module docstring)? Bans not considered."""
    join = facts.newest_join.get(author)
    return join is not None and _joined_for(join, _leave(facts, author), round_) and _active(facts, author, join, round_)


def has_lapsed(facts: Facts, author: bytes, round_: int) -> bool:
    """Is `author` a member whose join names a round ≤ `round_` but who is not a contributor of
    `round_` only because it was not active? Such a member must join again to take part."""
    join = facts.newest_join.get(author)
    if join is None:
        return False
    return _joined_for(join, _leave(facts, author), round_) and not _active(facts, author, join, round_)


def contributors(facts: Facts, round_: int) -> set[bytes]:
    """The unbanned authors that may contribute to `round_`."""
    return {a for a in facts.newest_join if not is_banned(facts, a) and is_eligible(facts, a, round_)}


def _leave(facts: Facts, author: bytes) -> tuple[int, int]:
    return facts.newest_leave.get(author, (NEVER, 0))


def _joined_for(join: tuple[int, int], leave: tuple[int, int], round_: int) -> bool:
    """Do the newest join and leave, (seq, round) each, make their author a member in `round_`?"""
    (join_seq, first), (leave_seq, last) = join, leave
    return first <= round_ and (leave_seq < join_seq or last >= round_)


def _active(facts: Facts, author: bytes, join: tuple[int, int], round_: int) -> bool:
    if round_ - join[1] < ACTIVITY_WINDOW:
        return True
    if facts.timeouts_in(round_ - 1) and not showed_up(facts, author, round_ - 1):
        return False  # round_ - 1 stalled and this author did not answer for it
    return any(showed_up(facts, author, r) for r in range(round_ - ACTIVITY_WINDOW, round_))


def showed_up(facts: Facts, author: bytes, round_: int) -> bool:
    """Did `author` commit, vote or time out in `round_`?"""
    return author in facts.commits_in(round_) or author in facts.votes_in(round_) or author in facts.timeouts_in(round_)


# --- the electorate and its attempts -------------------------------------------------------------


def first_electorate(facts: Facts, genesis: Genesis, round_: int, earned: frozenset[bytes]) -> frozenset[bytes]:
    """Attempt 0's electorate of `round_`, given the authors whose contributions were accepted
    before it (`earned`)."""
    able = contributors(facts, round_)
    if genesis.influence == "joined":
        return frozenset(able)
    trusted = able & (earned | genesis.trusted)
    return frozenset(trusted or able)


def attempts(facts: Facts, round_: int, first: frozenset[bytes]) -> list[frozenset[bytes]]:
    """The electorates of `round_`'s attempts so far, attempt 0 (`first`) first."""
    chain = [first]
    timeouts = facts.timeouts_in(round_)
    while len(chain) < MAX_ATTEMPTS:
        current, attempt = chain[-1], len(chain) - 1
        timed_out = {a for a in current if attempt in timeouts.get(a, ())}
        if not is_more_than_a_third(len(timed_out), len(current)):
            break
        voted = facts.votes_in(round_)
        chain.append(frozenset(a for a in current if a in timed_out or a in voted))
    return chain


def certify(facts: Facts, round_: int, electorates: list[frozenset[bytes]], excluded: set[bytes]) -> Certificate | None:
    """The certificate of `round_`: the first attempt in which more than two thirds of the
    electorate voted one hash (unique: see the module docstring), or None."""
    ballots: dict[bytes, set[bytes]] = defaultdict(set)
    proposers: dict[bytes, bytes | None] = {}
    for author, said in facts.votes_in(round_).items():
        if author not in excluded and len(said) == 1:
            ((hash_, proposer),) = said
            ballots[hash_].add(author)
            proposers[author] = proposer
    for attempt, electorate in enumerate(electorates):
        for hash_, voters in sorted(ballots.items()):
            counted = frozenset(voters & electorate)
            if is_quorum(len(counted), len(electorate)):
                return Certificate(round_, hash_, counted, tuple(electorates[: attempt + 1]),
                                   _accepted(facts, round_, [proposers[v] for v in counted]))
    return None


def _accepted(facts: Facts, round_: int, named: list[bytes | None]) -> frozenset[bytes]:
    """The contributors in the set of the proposer most voters name (see the module docstring)."""
    tally = Counter(p for p in named if p)
    if not tally:
        return frozenset()
    proposer = min(tally, key=lambda p: (-tally[p], p))
    proposed = facts.proposals_in(round_).get(proposer, set())
    if len(proposed) != 1:
        return frozenset()
    (authors,) = proposed
    return frozenset(a for a in authors if a in facts.commits_in(round_))
