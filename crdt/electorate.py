"""Who weighs in a round: its contributors, its electorate, the electorate's attempts, its certificate.

Everything here is a pure function of the facts (facts.py) and the genesis, so of the op set.

- **Bans** here are those the facts prove alone (a fork, an equivocation, a conviction), plus
  `disputed`, where a caller passes it: the members that disputes of their shard results ban
  (view.py: `dispute_bans`, judged once the rest of the view is derived).
- **Contributors of round r** (may commit a payload): the unbanned authors with a join in force
  at r (their newest join naming a round ≤ r, not followed by a leave naming a round before r: a
  join again that names a later round leaves the rounds before it as they were), and who are
  *active*: their join names one of
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
- **Attempts.** Round r's electorate starts as above (attempt 0). An attempt ends, and the next
  one begins, in one of two ways:
  - *timed out*: more than a third of the attempt's electorate wrote `timeout` ops for it (the
    round's deadline passed on their clocks with no certificate; more than a third, so at least
    one honest member saw it);
  - *split*: no hash can reach a quorum in it any more: the most votes any hash holds plus the
    members yet to vote are not more than two thirds of the electorate. This needs no clock: it
    follows from the votes alone, as soon as they are seen, so honest members that aggregated
    different sets (a join, a restart, a proposer that handed over early) start the next attempt
    within a gossip delay instead of a deadline. It is stable: a new vote moves a member from
    "yet to vote" to a hash, which never raises that sum, and a ban only lowers it.
  The next attempt's electorate is the members of this one that voted in it or timed out (a
  member that crashed, even after its commit, leaves it, and the round can be certified without
  it). A member whose vote died with a split attempt votes again, in the next attempt, for the
  set that attempt's members converge on (node/rounds/machine.py: the set most votes of the split
  attempt named).
- **Votes and locks.** One vote per member per attempt (a second one for the same attempt is
  equivocation). A vote *stands* through the later attempts until the attempt it was cast in
  splits: a member whose attempt only timed out keeps its vote (it is locked), and a fresh vote
  from a member whose earlier vote still stands is not counted (an honest member never casts
  one).
- **Certificate.** Round r is certified with hash h when, in some attempt, more than two thirds
  of that attempt's electorate have a standing vote for h; the first such attempt certifies.
  Unique: if h had a quorum V in attempt k, that attempt never splits, so the votes of V stand in
  every later attempt and every later electorate E contains V (they voted); the voters of
  another hash number at most |E| - |V| < |E| / 3 (|V| > 2|E_k|/3 ≥ 2|E|/3).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable
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


def banned(facts: Facts, disputed: Collection[bytes] = ()) -> set[bytes]:
    return facts.convicted | facts.forked | facts.equivocated | set(disputed)


def is_banned(facts: Facts, author: bytes, disputed: Collection[bytes] = ()) -> bool:
    return author in facts.forked or author in facts.equivocated or author in facts.convicted or author in disputed


def is_eligible(facts: Facts, author: bytes, round_: int) -> bool:
    """May `author` contribute to round `round_` (see the module docstring)? Bans not considered."""
    join = join_in_force(facts, author, round_)
    return join is not None and _active(facts, author, join, round_)


def has_lapsed(facts: Facts, author: bytes, round_: int) -> bool:
    """Is `author` a member in `round_` that is not a contributor of it only because it was not
    active, and has not joined again since? Such a member must join again to take part."""
    join = join_in_force(facts, author, round_)
    if join is None or facts.newest_join[author] != join:
        return False  # not a member, or a join again is on its way (it names a later round)
    return not _active(facts, author, join, round_)


def contributors(facts: Facts, round_: int, disputed: Collection[bytes] = ()) -> set[bytes]:
    """The unbanned authors that may contribute to `round_`."""
    return {a for a in facts.newest_join if not is_banned(facts, a, disputed) and is_eligible(facts, a, round_)}


def join_in_force(facts: Facts, author: bytes, round_: int) -> tuple[int, int] | None:
    """The join, (seq, round), that makes `author` a member in `round_`: its newest join naming a
    round ≤ `round_`, unless the first leave after it names a round before `round_`; None if none
    does. A join naming a later round (a lapsed member joining again, a member back from a pause)
    changes nothing for the rounds before it: certificates already made stay made."""
    named = [join for join in facts.joins_of.get(author, ()) if join[1] <= round_]
    if not named:
        return None
    join = max(named)
    after = [leave for leave in facts.leaves_of.get(author, ()) if leave[0] > join[0]]
    if after and min(after)[1] < round_:
        return None
    return join


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


def first_electorate(facts: Facts, genesis: Genesis, round_: int, earned: frozenset[bytes],
                     disputed: Collection[bytes] = ()) -> frozenset[bytes]:
    """Attempt 0's electorate of `round_`, given the authors whose contributions were accepted
    before it (`earned`) and those banned by disputes (`disputed`). Every later attempt's is a
    subset of it (`round_history`), so a member left out here weighs in no attempt of `round_`."""
    able = contributors(facts, round_, disputed)
    if genesis.influence == "joined":
        return frozenset(able)
    trusted = able & (earned | genesis.trusted)
    return frozenset(trusted or able)


Ballot = tuple[bytes, bytes]  # (hash, proposer or b"")


@dataclass(frozen=True)
class Attempt:
    """One attempt of a round: its electorate, the votes that stand in it, and whether it split."""

    electorate: frozenset[bytes]
    standing: dict[bytes, Ballot]  # member -> its standing vote (members that have none are left out)
    split: bool

    def tally(self) -> Counter:
        """hash -> standing votes for it."""
        return Counter(hash_ for hash_, _proposer in self.standing.values())


def _ballots(facts: Facts, round_: int) -> dict[bytes, dict[int, Ballot]]:
    """author -> attempt -> its vote in that attempt, for the unbanned voters of `round_`."""
    excluded = banned(facts)
    return {
        author: {attempt: (hash_, proposer) for attempt, hash_, proposer in said}
        for author, said in facts.votes_in(round_).items() if author not in excluded
    }


def _is_split(standing: dict[bytes, Ballot], electorate: frozenset[bytes]) -> bool:
    """Can no hash reach a quorum in this attempt any more (see the module docstring)?"""
    most = max(Counter(hash_ for hash_, _p in standing.values()).values(), default=0)
    return bool(electorate) and not is_quorum(most + len(electorate) - len(standing), len(electorate))


def round_history(facts: Facts, round_: int, first: frozenset[bytes]) -> list[Attempt]:
    """`round_`'s attempts so far, attempt 0 (electorate `first`) first."""
    ballots, timeouts = _ballots(facts, round_), facts.timeouts_in(round_)
    history: list[Attempt] = []
    electorate, carried = first, {}  # carried: standing votes of the attempt before, if it did not split
    while True:
        number = len(history)
        standing = {a: carried[a] if a in carried else ballots[a][number]
                    for a in electorate if a in carried or number in ballots.get(a, {})}
        split = _is_split(standing, electorate)
        history.append(Attempt(electorate, standing, split))
        timed_out = {a for a in electorate if number in timeouts.get(a, ())}
        if len(history) == MAX_ATTEMPTS or not (split or is_more_than_a_third(len(timed_out), len(electorate))):
            return history
        electorate = frozenset(a for a in electorate if a in timed_out or a in standing)
        carried = {} if split else standing


def split_votes(history: list[Attempt]) -> dict[bytes, int]:
    """proposer -> how many standing votes named its set in the latest attempt of `history` that
    split (before the one under way); empty if none split. The set the next attempt converges on."""
    split = next((attempt for attempt in reversed(history[:-1]) if attempt.split), None)
    if split is None:
        return {}
    return dict(Counter(proposer for _hash, proposer in split.standing.values() if proposer))


def certify(facts: Facts, round_: int, history: list[Attempt]) -> Certificate | None:
    """The certificate of `round_`: the first attempt in which more than two thirds of the
    electorate have a standing vote for one hash (unique: see the module docstring), or None."""
    for number, attempt in enumerate(history):
        for hash_, count in sorted(attempt.tally().items()):
            if is_quorum(count, len(attempt.electorate)):
                voters = {a: proposer for a, (h, proposer) in attempt.standing.items() if h == hash_}
                electorates = tuple(a.electorate for a in history[: number + 1])
                return Certificate(round_, hash_, frozenset(voters), electorates,
                                   _accepted(facts, round_, list(voters.values())))
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
