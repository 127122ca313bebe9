"""Thresholds over an electorate, in integers (no float rounding at a boundary), and the orders
drawn alike on every replica from a seed no key could choose."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def is_quorum(signers: int, electorate: int) -> bool:
    """More than two thirds: what certifies a round (and a snapshot)."""
    return electorate > 0 and 3 * signers > 2 * electorate


def is_more_than_a_third(signers: int, electorate: int) -> bool:
    """Enough that at least one of them is honest, with fewer than a third Byzantine."""
    return electorate > 0 and 3 * signers > electorate


def drawn_order(label: bytes, round_: int, seed: bytes, attempt: int, members: Iterable[bytes]) -> list[bytes]:
    """`members` in an order drawn from (`label`, round, attempt, `seed`): the same on every peer,
    new every round, and no peer can pick its place (proposers, stewards, committees, the fresh
    keys a round may take, the keys that earn a say)."""
    tag = hashlib.sha256(label + round_.to_bytes(8, "big") + attempt.to_bytes(2, "big") + seed).digest()
    return sorted(members, key=lambda key: hashlib.sha256(tag + key).digest())
