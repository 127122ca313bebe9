"""Attack: keys that only joined try to weigh in (issue #18, finding 3).

Joining an open run is free, so a key that merely joined must not choose the checkpoint that
syncing peers download, vote in a quorum, or stall one by never voting: influence is earned by
a contribution that a certified round accepted (crdt/electorate.py). Through the real Replica.
"""

from __future__ import annotations

from locomesh.crdt import Replica

from .test_crdt_support import genesis, keys

HONEST = keys(4)
SYBILS = keys(5, offset=100)
STATE = b"\x51" * 32
HONEST_CHECKPOINT, BOGUS_CHECKPOINT = b"\xc1" * 32, b"\x0b" * 32  # the bogus ID sorts first on a tie


def _payload(member) -> bytes:
    return member.public_key[:16] * 2


def _certify(replica: Replica, round_: int, state: bytes, proposer=HONEST[0], members=HONEST) -> None:
    """`members` commit in `round_`, `proposer` proposes them all and each votes `state` naming it."""
    for member in members:
        replica.create(member, "commit", round=round_, hash=_payload(member), size=10)
    replica.create(proposer, "propose", round=round_, authors=sorted(m.public_key for m in members))
    for member in members:
        replica.create(member, "vote", round=round_, hash=state, proposer=proposer.public_key)


def _earned_run() -> Replica:
    """A run (influence earned, the default) created by HONEST[0]; all four honest members joined
    for round 1 and rounds 1 and 2 were certified (round 1 by the creator alone: nobody else had
    earned a say yet; round 2 by all four, whose round-1 contributions were accepted)."""
    replica = Replica(genesis(HONEST[0], influence="earned"))
    for member in HONEST:
        replica.create(member, "join", round=1)
    _certify(replica, 1, b"\x50" * 32)
    assert replica.state.certificates[1].voters == {HONEST[0].public_key}
    _certify(replica, 2, STATE, proposer=HONEST[1])
    assert replica.state.certificates[2].voters == {m.public_key for m in HONEST}
    return replica


def test_sybil_attestations_do_not_choose_the_canonical_checkpoint():
    """Five keys that joined for a far round (so never in any electorate) attest a bogus ID for the
    certified round: on bfb477a they outnumbered the four honest attestations and every syncing
    peer downloaded the bogus checkpoint."""
    replica = _earned_run()
    for member in HONEST:
        replica.create(member, "checkpoint", round=2, id=HONEST_CHECKPOINT, size=1000)
    for sybil in SYBILS:
        replica.create(sybil, "join", round=6)  # a far round: never in any electorate
        replica.create(sybil, "attest", round=2, id=BOGUS_CHECKPOINT, size=1000)
    assert replica.state.checkpoint.id == HONEST_CHECKPOINT
    assert [c.id for c in replica.checkpoint_candidates(2)] == [HONEST_CHECKPOINT]


def test_a_voter_minority_s_bogus_attestation_is_ranked_but_never_first_against_the_majority():
    replica = _earned_run()
    for member in HONEST[:3]:
        replica.create(member, "checkpoint", round=2, id=HONEST_CHECKPOINT, size=1000)
    replica.create(HONEST[3], "attest", round=2, id=BOGUS_CHECKPOINT, size=1000)
    assert [(c.id, c.attestations) for c in replica.checkpoint_candidates(2)] == [(HONEST_CHECKPOINT, 3), (BOGUS_CHECKPOINT, 1)]


def test_keys_that_only_joined_do_not_enter_the_electorate_nor_stall_its_quorum():
    """Ten keys join for round 3 and never vote: counted, they would hold the quorum out (4 of 14
    votes); on bfb477a the round was never certified."""
    replica = _earned_run()
    sybils = keys(10, offset=200)
    for sybil in sybils:
        replica.create(sybil, "join", round=3)
    assert replica.state.earned == frozenset(m.public_key for m in HONEST)
    assert replica.electorate(3) == frozenset(m.public_key for m in HONEST)
    assert {s.public_key for s in sybils} <= replica.contributors(3)  # they may still contribute
    _certify(replica, 3, b"\x53" * 32, proposer=HONEST[2])
    assert replica.state.round == 3


def test_a_contribution_accepted_by_a_certified_round_earns_its_author_a_say():
    replica = _earned_run()
    newcomer = keys(1, offset=300)[0]
    replica.create(newcomer, "join", round=3)
    assert newcomer.public_key not in replica.electorate(3)
    for member in (*HONEST, newcomer):
        replica.create(member, "commit", round=3, hash=_payload(member), size=10)
    replica.create(HONEST[2], "propose", round=3, authors=sorted(m.public_key for m in (*HONEST, newcomer)))
    for member in HONEST:
        replica.create(member, "vote", round=3, hash=b"\x53" * 32, proposer=HONEST[2].public_key)
    assert replica.state.round == 3
    assert newcomer.public_key in replica.electorate(4)


def test_before_any_round_only_the_creator_and_the_allowlist_weigh():
    replica = Replica(genesis(HONEST[0], influence="earned"))
    for member in (*HONEST, *SYBILS):
        replica.create(member, "join", round=1)
    assert replica.electorate(1) == frozenset({HONEST[0].public_key})
    assert len(replica.contributors(1)) == 9


def test_a_run_whose_trusted_members_are_all_gone_falls_back_to_its_contributors():
    replica = Replica(genesis(HONEST[0], influence="earned"))
    for member in HONEST[1:]:
        replica.create(member, "join", round=1)
    assert replica.electorate(1) == frozenset(m.public_key for m in HONEST[1:])
