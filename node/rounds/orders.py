"""Who does what in a round, drawn alike on every peer: the state stewards, and the round a join
names (the proposers are drawn in crdt/chain.py, the committees of sharded exchange in
`node/exchange/committees.py`). Pure functions of the round and a seed no key could know when it
was made (the hash certified before the round)."""

from __future__ import annotations

from locomesh.crdt.quorum import drawn_order
from locomesh.node.rounds.events import Author


def first_round_to_join(certified: int, *, under_way: bool) -> int:
    """The round a join names: the next one, or the one after when commits for the next are out
    already (a peer that joins a round under way could not finish it)."""
    return certified + (2 if under_way else 1)


def state_stewards(round_number: int, seed: bytes, electorate: set[Author] | frozenset[Author]) -> list[Author]:
    """The members that store round `round_number`'s new state for peers that sync; the others
    only attest its checkpoint ID (writing a whole state every round on every peer cost each CPU
    time that the round's training and exchange were short of). More than the faults a quorum
    tolerates (f < n/3), at least two: one honest steward that computed the certified state always
    stores it. Drawn from the seed, so the work moves round by round."""
    order = drawn_order(b"locomesh steward", round_number, seed, 0, electorate)
    return order[: max(2, (len(order) - 1) // 3 + 1)]
