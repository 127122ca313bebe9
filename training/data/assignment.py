"""Which train shards each member trains on in a round: drawn from the run's seed and the round.

Why a drawing and not a choice:

- **No two peers train on the same tokens in a round.** The round's members are put in an
  order, the shards in a permutation, and member i takes the `per_member` shards after position
  ``i * per_member`` of it: disjoint whenever ``len(roster) * per_member <= shard_count``. With
  fewer shards than that, positions wrap around the permutation and shards are shared, as evenly
  as the numbers allow.
- **Checkable after the fact.** The assignment depends only on the run's seed, the round number
  and the round's roster (the contributors its certificate names), all public once the round is
  certified: anyone can recompute what a member was meant to train on, and a member cannot pick
  its data. A member's place in the order is the SHA-256 of its key with the seed and round, so
  grinding keys to land on chosen shards means grinding hashes, and the permutation does not
  depend on the roster at all.
- **Rounds reshuffle.** The order and the permutation are drawn afresh each round (and for
  each run's seed), so a member sees different data every round and, over rounds, every shard
  is trained on.

The permutation is a Fisher-Yates shuffle driven by the raw 64-bit outputs of a PCG64 bit
generator seeded from SHA-256(label, seed, round). NumPy keeps a bit generator's raw stream the
same across versions and platforms but not the algorithms of `Generator`'s methods, so the
shuffle is written out here: every peer computes the same permutation whatever its NumPy.

Pure: no files, no network.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

ORDER_LABEL = b"locomesh data order"
PERMUTATION_LABEL = b"locomesh data perm"
_U64 = 1 << 64


def shards_per_member(shard_tokens: int, tokens_per_round: int) -> int:
    """How many shards a member trains on in a round to see `tokens_per_round` tokens: at least 1."""
    if shard_tokens < 1 or tokens_per_round < 0:
        reason = f"shard_tokens must be positive and tokens_per_round not negative, not {shard_tokens}, {tokens_per_round}"
        raise ValueError(reason)
    return max(1, -(-tokens_per_round // shard_tokens))


def assignment(
    shard_count: int, seed: int, round_number: int, roster: Iterable[bytes], per_member: int
) -> dict[bytes, tuple[int, ...]]:
    """Each member of `roster` (public keys; order and repeats do not matter) and the indices of
    the `per_member` train shards (of `shard_count`) it trains on in round `round_number` of a run
    whose seed is `seed`. See the module docstring for the drawing and what it promises."""
    _check(shard_count, seed, round_number, per_member)
    permutation = _permutation(shard_count, seed, round_number)
    order = sorted(set(roster), key=lambda key: (_order_key(seed, round_number, key), key))
    return {
        member: tuple(permutation[(position * per_member + j) % shard_count] for j in range(per_member))
        for position, member in enumerate(order)
    }


def assigned(
    shard_count: int, seed: int, round_number: int, roster: Iterable[bytes], member: bytes, per_member: int
) -> tuple[int, ...]:
    """The shards `member` trains on in round `round_number` (`assignment`); `ValueError` if it is
    not in `roster`."""
    shards = assignment(shard_count, seed, round_number, roster, per_member).get(member)
    if shards is None:
        raise ValueError(f"{member.hex()[:16]} is not in the round's roster")
    return shards


def _check(shard_count: int, seed: int, round_number: int, per_member: int) -> None:
    if shard_count < 1 or per_member < 1:
        raise ValueError(f"shard_count and per_member must be positive, not {shard_count}, {per_member}")
    if not (0 <= seed < _U64 and 0 <= round_number < _U64):
        raise ValueError("the seed and the round number are unsigned 64-bit integers")


def _order_key(seed: int, round_number: int, key: bytes) -> bytes:
    return hashlib.sha256(ORDER_LABEL + _u64(seed) + _u64(round_number) + key).digest()


def _permutation(shard_count: int, seed: int, round_number: int) -> list[int]:
    """A permutation of range(shard_count) drawn from (seed, round): Fisher-Yates over PCG64's raw
    outputs, with rejection so every permutation is equally likely."""
    digest = hashlib.sha256(PERMUTATION_LABEL + _u64(seed) + _u64(round_number)).digest()
    draws = _raw_draws(np.random.PCG64(int.from_bytes(digest, "big")))
    permutation = list(range(shard_count))
    for top in range(shard_count - 1, 0, -1):
        span = top + 1
        limit = _U64 - _U64 % span  # draws at or above it would favour the low values
        draw = next(draws)
        while draw >= limit:
            draw = next(draws)
        j = draw % span
        permutation[top], permutation[j] = permutation[j], permutation[top]
    return permutation


def _raw_draws(bits: np.random.PCG64) -> Iterator[int]:
    """The bit generator's raw 64-bit outputs, one by one (fetched in batches: the same stream)."""
    while True:
        yield from bits.random_raw(1024).tolist()


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")
