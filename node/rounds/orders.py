"""Who does what in a round, drawn alike on every peer: the proposer order, the state stewards,
and the round a join names (the committees of sharded exchange are drawn in
`node/exchange/committees.py`). Pure functions of the round, its attempt and a seed no key could know
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

