"""The activity rule (crdt/view.py): a member that neither commits nor votes for ACTIVITY_WINDOW
rounds leaves the electorate, so crashed peers stop weighing on the quorum."""

from __future__ import annotations

from locomesh.crdt.view import ACTIVITY_WINDOW

from .test_crdt_support import joined_replica, keys

MEMBERS = keys(6)
A, B, C, D, E, F = MEMBERS


def _hash(round_: int) -> bytes:
    return bytes([round_]) * 32


def _round(replica, round_: int, live, voters=None) -> None:
    """`live` commit in `round_`; `voters` (default: `live`) vote for its hash."""
    for member in live:
        replica.create(member, "commit", round=round_, hash=bytes([100 + round_]) * 32, size=10)
    for member in live if voters is None else voters:
        replica.create(member, "vote", round=round_, hash=_hash(round_))


def test_a_member_silent_for_the_activity_window_leaves_the_electorate_and_a_voter_stays():
    assert ACTIVITY_WINDOW == 2
    replica = joined_replica([A, B, C, D])
    for round_ in (1, 2):
        _round(replica, round_, live=(A, C), voters=(A, B, C))  # B only votes, D does nothing
    everyone = {m.public_key for m in (A, B, C, D)}
    assert replica.electorate(2) == everyone  # joined for round 1: still within the window
    assert replica.electorate(3) == everyone - {D.public_key}
    assert replica.lapsed(D.public_key, 3) and not replica.lapsed(B.public_key, 3)
    assert replica.state.round == 2


def test_crashes_spread_over_rounds_never_stall_the_certificates():
    """One of six members crashes every second round: half of them are gone by round 6. Counted
    forever, the dead would hold the quorum out from round 6 on; dropped after the window,
    every round up to 8 is certified."""
    replica = joined_replica(MEMBERS)
    crashes = {2: F, 4: E, 6: D}  # the member that is silent from that round on
    live = list(MEMBERS)
    for round_ in range(1, 9):
        if round_ in crashes:
            live.remove(crashes[round_])
        _round(replica, round_, live)
    assert replica.state.round == 8
    assert [replica.state.eligible[r] for r in range(1, 9)] == [6, 6, 6, 5, 5, 4, 4, 3]


def test_a_lapsed_member_that_joins_again_counts_from_the_round_its_join_names():
    replica = joined_replica([A, B, C, D])
    for round_ in (1, 2, 3):
        _round(replica, round_, live=(A, B, C))
    assert D.public_key not in replica.electorate(4) and replica.lapsed(D.public_key, 4)
    replica.create(D, "join", round=5)
    assert D.public_key not in replica.electorate(4) and not replica.lapsed(D.public_key, 4)
    assert D.public_key in replica.electorate(5) and D.public_key in replica.electorate(6)
    assert D.public_key not in replica.electorate(7)  # and lapses again if it stays silent


def test_a_late_joiner_or_a_leaver_has_not_lapsed():
    replica = joined_replica([A, B, C])
    replica.create(C, "leave", round=1)
    _round(replica, 1, live=(A, B))
    replica.create(D, "join", round=5)  # at most limits.AHEAD past round 1, the newest round voted for
    for round_ in (2, 3):
        _round(replica, round_, live=(A, B))
    assert not replica.lapsed(D.public_key, 4) and not replica.lapsed(C.public_key, 4)
    assert replica.electorate(4) == {A.public_key, B.public_key}
