"""Which train shards each member trains on in a round: deterministic, disjoint, reshuffled."""

from __future__ import annotations

import pytest

from locomesh.training.data.assignment import assigned, assignment, shards_per_member

ROSTER = [bytes([i]) * 32 for i in range(1, 9)]


def test_shards_per_member_rounds_up_and_is_at_least_one():
    assert shards_per_member(1000, 2500) == 3
    assert shards_per_member(1000, 3000) == 3
    assert shards_per_member(1000, 0) == 1
    with pytest.raises(ValueError):
        shards_per_member(0, 10)


def test_the_assignment_is_deterministic_and_pinned():
    first = assignment(100, 7, 3, ROSTER, 4)
    assert first == assignment(100, 7, 3, ROSTER, 4)
    # Pinned: every peer must compute this, whatever its NumPy or platform; a change here splits runs.
    assert assignment(10, 1, 2, [b"a" * 32, b"b" * 32, b"c" * 32], 3) == {
        b"b" * 32: (1, 0, 9), b"c" * 32: (2, 5, 3), b"a" * 32: (8, 4, 6),
    }


def test_members_get_disjoint_shards_when_there_are_enough():
    for round_number in range(20):
        shards = assignment(40, 11, round_number, ROSTER, 5)  # 8 * 5 = 40: every shard exactly once
        flat = [shard for member in ROSTER for shard in shards[member]]
        assert sorted(flat) == list(range(40))
        partial = assignment(100, 11, round_number, ROSTER, 3)
        flat = [shard for member in ROSTER for shard in partial[member]]
        assert len(set(flat)) == len(flat) == 24 and all(0 <= shard < 100 for shard in flat)


def test_every_shard_is_covered_over_rounds():
    # Rounds draw independently, so coverage is a coupon collector's: 8 of 200 shards a round need
    # about 200 * ln(200) / 8 = 130 rounds on average; 400 leave a shard unseen with odds e**-16 each.
    seen = set()
    for round_number in range(400):
        for shards in assignment(200, 5, round_number, ROSTER[:4], 2).values():
            seen.update(shards)
    assert seen == set(range(200))


def test_the_round_and_the_seed_reshuffle():
    base = assignment(1000, 1, 1, ROSTER, 2)
    assert assignment(1000, 1, 2, ROSTER, 2) != base
    assert assignment(1000, 2, 1, ROSTER, 2) != base


def test_the_roster_order_and_repeats_do_not_matter():
    shuffled = list(reversed(ROSTER)) + ROSTER[:2]
    assert assignment(64, 3, 9, shuffled, 4) == assignment(64, 3, 9, ROSTER, 4)
    assert assigned(64, 3, 9, shuffled, ROSTER[2], 4) == assignment(64, 3, 9, ROSTER, 4)[ROSTER[2]]


def test_too_few_shards_wrap_around_evenly():
    shards = assignment(5, 3, 4, ROSTER, 2)  # 16 places for 5 shards
    flat = [shard for member in ROSTER for shard in shards[member]]
    assert sorted(set(flat)) == list(range(5))
    counts = [flat.count(shard) for shard in range(5)]
    assert max(counts) - min(counts) <= 1
    assert all(len(set(member_shards)) == 2 for member_shards in shards.values())


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="not in the round's roster"):
        assigned(10, 1, 1, ROSTER, b"x" * 32, 1)
    for args in ((0, 1, 1, 1), (10, -1, 1, 1), (10, 1, 2**64, 1), (10, 1, 1, 0)):
        with pytest.raises(ValueError):
            assignment(args[0], args[1], args[2], ROSTER, args[3])
