"""The absence rule (crdt/membership.py): a member of the electorate whose payload counted in no
certified set and that no value names as a precommitter (`last`) for `absent_rounds` rounds leaves
the electorate, so crashed peers stop weighing on the quorum; it keeps its say on the roster and is
back from the round after a certified set counts its payload again."""

from __future__ import annotations

from .test_crdt_support import attempt_proposed_by, certify, joined_replica, keys

MEMBERS = keys(6)
A, B, C, D, E, F = MEMBERS


def _round(replica, live, contributors=None) -> None:
    """Certify the next round with `live` precommitting (the first of them in turn proposes) and
    `contributors` (default: `live`) committing."""
    certify(replica, live, bytes([replica.chain.tip.round]) * 32, contributors=live if contributors is None else contributors,
            attempt=attempt_proposed_by(replica, live))


def test_a_member_absent_for_absent_rounds_leaves_the_electorate_and_a_precommitter_stays():
    replica = joined_replica([A, B, C, D])
    assert replica.genesis.absent_rounds == 3
    _round(replica, [A, B, C, D])  # round 1 counts every payload
    for _ in (2, 3, 4):
        _round(replica, [A, B, C], contributors=[A, C])  # B only precommits, D does nothing
    everyone = {m.public_key for m in (A, B, C, D)}
    assert [replica.chain.certificates[r].electorate for r in (2, 3, 4)] == [everyone] * 3
    assert replica.electorate(5) == everyone - {D.public_key}
    assert D.public_key in replica.state.members and replica.chain.tip.membership.roster[D.public_key].say
    assert replica.state.round == 4


def test_an_absent_member_is_back_after_a_certified_set_counts_its_payload():
    replica = joined_replica([A, B, C, D])
    for _ in range(4):
        _round(replica, [A, B, C])
    assert D.public_key not in replica.electorate(5)
    assert D.public_key in replica.contributors(5)  # still on the roster with a say: it may commit
    _round(replica, [A, B, C], contributors=[A, B, C, D])
    assert D.public_key in replica.chain.certificates[5].accepted
    assert D.public_key in replica.electorate(6)
    for _ in range(3):
        _round(replica, [A, B, C])
    assert all(D.public_key in replica.electorate(r) for r in (6, 7, 8))
    assert D.public_key not in replica.electorate(9)  # and leaves again if it stays away


def test_crashes_spread_over_rounds_never_stall_the_certificates():
    """One of six members crashes every third round. Counted forever, the dead would hold the
    quorum out from round 8 on (three of six live); dropped after `absent_rounds`, every round up
    to 11 is certified."""
    replica = joined_replica(MEMBERS)
    crashes = {2: F, 5: E, 8: D}  # the member that is silent from that round on
    live = list(MEMBERS)
    for round_ in range(1, 12):
        if round_ in crashes:
            live.remove(crashes[round_])
        _round(replica, live)
    assert replica.state.round == 11
    assert [len(replica.chain.certificates[r].electorate) for r in range(1, 12)] == [1, 6, 6, 6, 5, 5, 5, 4, 4, 4, 3]


def test_a_member_counts_as_present_from_the_round_its_join_is_admitted_in():
    """A key admitted late is not absent for the rounds before its join: it leaves only after
    `absent_rounds` rounds of its own without a sign of life."""
    replica = joined_replica([A, B, C], admitted=[m.public_key for m in (B, C, D)])
    _round(replica, [A, B, C])
    _round(replica, [A, B, C])
    replica.create(D, "join", round=3)
    _round(replica, [A, B, C])  # round 3's value admits D's join
    assert D.public_key in replica.electorate(4)
    for _ in (4, 5):
        _round(replica, [A, B, C])
    assert D.public_key in replica.electorate(6)
    _round(replica, [A, B, C])
    assert D.public_key not in replica.electorate(7)
