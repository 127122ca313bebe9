"""How large the shard committees of sharded exchange must be, and how many shards each peer
recomputes, for a wrong aggregate to be caught before a round is certified.

The threat: the members of one shard's committee all sign the same wrong result. If any member
is honest, the committee disagrees and the shard is recomputed; so a wrong result can only stand
when the whole committee is Byzantine, and then only if no honest peer happens to recompute that
shard (each recomputes `verified` shards of its own choice, drawn from private randomness after
the results are out, so no attacker knows which). With n members of which f are Byzantine, S
shards, committees of k drawn uniformly (`shard_committees` below) and h = n − f honest
verifiers, the chance that some shard's wrong result survives is at most

    S · C(f, k) / C(n, k) · (1 − v / S)^h

(a union bound over shards; the hypergeometric term is the chance a committee is all Byzantine).
What it costs a peer, in payloads fetched per round: k for the committee seats it holds (S·k/n
shards, each a 1/S slice of n payloads) and v·n/S for its checks; `plan` takes the cheapest
(k, v) under the target. docs/design-notes.md ("Sharded exchange") gives the table. Who sits on
which committee is drawn by `shard_committees`, alike on every peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from locomesh.crdt.quorum import drawn_order

Author = bytes

DEFAULT_TARGET = 1e-6
MAX_COMMITTEE = 64


@dataclass(frozen=True)
class CommitteePlan:
    members: int
    byzantine: int  # the most Byzantine members the plan holds against
    shards: int
    committee: int  # k: members that aggregate each shard
    verified: int  # v: shards each peer recomputes itself

    @property
    def miss_probability(self) -> float:
        """The bound above: the chance a wrong shard result stands until certification."""
        return miss_probability(self.members, self.byzantine, self.shards, self.committee, self.verified)

    @property
    def payloads_fetched(self) -> float:
        """Payload slices a peer downloads per round for its committee seats and its checks, in
        whole payloads (the aggregate it fetches comes on top)."""
        return min(self.committee, self.members) + self.verified * self.members / self.shards


def miss_probability(members: int, byzantine: int, shards: int, committee: int, verified: int) -> float:
    if not 0 <= byzantine < members or shards < 1 or committee < 1 or not 0 <= verified <= shards:
        raise ValueError("need 0 <= byzantine < members, shards >= 1, committee >= 1, 0 <= verified <= shards")
    captured = comb(byzantine, committee) / comb(members, committee) if committee <= members else 0.0
    unchecked = (1 - verified / shards) ** (members - byzantine)
    return min(1.0, shards * captured * unchecked)


def byzantine_bound(members: int, fraction: float) -> int:
    """The most Byzantine members a plan must hold against: the largest f with f < fraction · n
    (fraction 1/3: f = ⌈n/3⌉ − 1, the most a quorum of two thirds tolerates)."""
    f = int(fraction * members)
    return f - 1 if f == fraction * members else f


def plan(members: int, *, byzantine_fraction: float = 1 / 3, shards: int | None = None,
         target: float = DEFAULT_TARGET) -> CommitteePlan:
    """The cheapest (committee size, shards verified) for `members` with fewer than
    `byzantine_fraction` of them Byzantine, `shards` shards (default: one per member), such that
    a wrong result stands with probability at most `target`. A committee of f + 1 always holds an
    honest member, so the plan never needs more."""
    if members < 1 or not 0 < target < 1:
        raise ValueError("need members >= 1 and 0 < target < 1")
    shards = shards or members
    f = byzantine_bound(members, byzantine_fraction)
    best: CommitteePlan | None = None
    for k in range(1, min(f + 1, MAX_COMMITTEE) + 1):
        v = _fewest_checks(members, f, shards, k, target)
        if v is None:
            continue
        candidate = CommitteePlan(members, f, shards, k, v)
        if best is None or candidate.payloads_fetched < best.payloads_fetched:
            best = candidate
    if best is None:  # only when f + 1 > MAX_COMMITTEE and checks cannot make up for it
        raise ValueError(f"no committee of at most {MAX_COMMITTEE} reaches {target:g} for {members} members")
    return best


def _fewest_checks(members: int, f: int, shards: int, k: int, target: float) -> int | None:
    """The least v with the miss probability at most `target` (it falls as v grows), or None."""
    if miss_probability(members, f, shards, k, shards) > target:
        return None
    low, high = 0, shards
    while low < high:
        middle = (low + high) // 2
        if miss_probability(members, f, shards, k, middle) <= target:
            high = middle
        else:
            low = middle + 1
    return low


def shard_committees(round_number: int, seed: bytes, electorate: set[Author] | frozenset[Author], shards: int,
                     size: int) -> list[list[Author]]:
    """Who aggregates each of `shards` shards in sharded exchange: `size` distinct members each
    (fewer only if the electorate is smaller), taken in turn from one order drawn like the
    proposers', so every member aggregates shards × size / members of them, give or take one.
    `seed` must be fixed only after the round's contributions are (the certified hash before the
    round and the followed proposal's op ID): a key or a commit cannot be made to land on a
    committee of its choosing. Each committee is a uniformly drawn set of `size` members, which
    is what `this module's bound assumes."""
    if shards < 1 or size < 1:
        raise ValueError("shards and committee size must be positive")
    order = drawn_order(b"locomesh committee", round_number, seed, 0, electorate)
    size = min(size, len(order))
    return [[order[(shard * size + j) % len(order)] for j in range(size)] for shard in range(shards)]
