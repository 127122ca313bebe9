"""Who does what in a round, drawn alike on every peer: the proposer order, the state stewards,
and the round a join names. Pure functions of the round, its attempt and a seed no key could know
when it was made (the hash certified before the round). The scoring committee, which the run
state itself must know, is drawn by the same `drawn_order` in crdt/scores.py."""

from __future__ import annotations

from locomesh.crdt.electorate import drawn_order
from locomesh.node.rounds.events import Author


def first_round_to_join(certified: int, *, under_way: bool) -> int:
    """The round a join names: the next one, or the one after when commits for the next are out
    already (a peer that joins a round under way would only hold it up)."""
    return certified + (2 if under_way else 1)


def state_stewards(round_number: int, seed: bytes, electorate: set[Author] | frozenset[Author]) -> list[Author]:
    """The members that store round `round_number`'s new state for peers that sync; the others
    only attest its checkpoint ID (writing a whole state every round on every peer cost each CPU
    time that the round's training and exchange were short of). More than the faults a quorum
    tolerates (f < n/3), at least two: one honest steward that voted the certified hash always
    stores it. Drawn as the proposers are, so the work moves round by round."""
    order = drawn_order(b"locomesh steward", round_number, seed, 0, electorate)
    return order[: max(2, (len(order) - 1) // 3 + 1)]


def proposer_order(round_number: int, seed: bytes, candidates: set[Author] | frozenset[Author], attempt: int = 0) -> list[Author]:
    """The order in which `candidates` may propose the set of round `round_number` (in attempt
    `attempt`): drawn from the round, the attempt and `seed` (the hash of the state certified
    before the round, which no key could know when it was made: nobody grinds a key to come first
    in a round of its choosing), so it changes every round and every attempt."""
    return drawn_order(b"locomesh proposer", round_number, seed, attempt, candidates)


def shard_committees(round_number: int, seed: bytes, electorate: set[Author] | frozenset[Author], shards: int,
                     size: int) -> list[list[Author]]:
    """Who aggregates each of `shards` shards in sharded exchange: `size` distinct members each
    (fewer only if the electorate is smaller), taken in turn from one order drawn like the
    proposers', so every member aggregates shards × size / members of them, give or take one.
    `seed` must be fixed only after the round's contributions are (the certified hash before the
    round and the followed proposal's op ID): a key or a commit cannot be made to land on a
    committee of its choosing. Each committee is a uniformly drawn set of `size` members, which
    is what `node/sharded/plan.py`'s bound assumes."""
    if shards < 1 or size < 1:
        raise ValueError("shards and committee size must be positive")
    order = drawn_order(b"locomesh committee", round_number, seed, 0, electorate)
    size = min(size, len(order))
    return [[order[(shard * size + j) % len(order)] for j in range(size)] for shard in range(shards)]
