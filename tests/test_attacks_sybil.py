"""Attack: keys that only joined try to weigh in (issue #18, finding 3).

Joining an open run is free, so a key that merely joined must not choose the checkpoint that
syncing peers download, vote or propose, nor stall a quorum by never voting: a fresh key has no
say (crdt/membership.py) until it has done `earn_rounds` rounds of counted work, and it may commit
a payload only in the rounds whose slate draws it. Through the real Replica. (Nine Sybils beside
four members, the agreement run for real: tests/test_agreement_membership.py.)
"""

from __future__ import annotations

from locomesh.crdt import InvalidValue, Replica, Value

from .test_crdt_support import certify, genesis, keys

HONEST = keys(4)
SYBILS = keys(5, offset=100)
STATE = b"\x51" * 32
HONEST_CHECKPOINT, BOGUS_CHECKPOINT = b"\xc1" * 32, b"\x0b" * 32  # the bogus ID sorts first on a tie


def _public(identities) -> frozenset[bytes]:
    return frozenset(identity.public_key for identity in identities)


def _earned_run() -> Replica:
    """An open run created by HONEST[0], which admitted the three other honest members at genesis;
    all four joined for round 1, and rounds 1 and 2 were certified (round 1 by the creator alone,
    round 1's electorate; round 2 by all four, whose joins round 1 admitted)."""
    replica = Replica(genesis(HONEST[0], admitted=sorted(_public(HONEST[1:]))))
    for member in HONEST:
        replica.create(member, "join", round=1)
    certify(replica, HONEST, b"\x50" * 32)
    assert replica.chain.voters(1) == {HONEST[0].public_key}
    certify(replica, HONEST, STATE)
    assert replica.chain.voters(2) == _public(HONEST)
    return replica


def test_sybil_attestations_do_not_choose_the_canonical_checkpoint():
    """Five keys that joined attest a bogus ID for a certified round: on bfb477a they outnumbered
    the four honest attestations and every syncing peer downloaded the bogus checkpoint. Only the
    members whose precommit named the round's certified state attest it, so not even once their
    joins are admitted (on the roster, without a say) do theirs count."""
    replica = _earned_run()
    for member in HONEST:
        replica.create(member, "checkpoint", round=2, id=HONEST_CHECKPOINT, size=1000)
    for sybil in SYBILS:
        replica.create(sybil, "join", round=3)
        replica.create(sybil, "attest", round=2, id=BOGUS_CHECKPOINT, size=1000)
    assert replica.state.checkpoint.id == HONEST_CHECKPOINT
    assert [c.id for c in replica.checkpoint_candidates(2)] == [HONEST_CHECKPOINT]
    certify(replica, HONEST, b"\x53" * 32)  # round 3 admits their joins
    assert _public(SYBILS) <= set(replica.chain.tip.membership.roster)
    for member in HONEST:
        replica.create(member, "checkpoint", round=3, id=HONEST_CHECKPOINT, size=1000)
    for sybil in SYBILS:
        replica.create(sybil, "attest", round=3, id=BOGUS_CHECKPOINT, size=1000)
    assert replica.state.checkpoint == replica.checkpoint_candidates(3)[0]
    assert [(c.round, c.id, c.attestations) for c in replica.checkpoint_candidates(3)] == [(3, HONEST_CHECKPOINT, 4)]


def test_a_voter_minority_s_bogus_attestation_is_ranked_but_never_first_against_the_majority():
    replica = _earned_run()
    for member in HONEST[:3]:
        replica.create(member, "checkpoint", round=2, id=HONEST_CHECKPOINT, size=1000)
    replica.create(HONEST[3], "attest", round=2, id=BOGUS_CHECKPOINT, size=1000)
    assert [(c.id, c.attestations) for c in replica.checkpoint_candidates(2)] == [(HONEST_CHECKPOINT, 3), (BOGUS_CHECKPOINT, 1)]


def test_keys_that_only_joined_neither_vote_nor_propose_nor_stall_the_quorum():
    """Ten keys join and never vote for real: counted, they would hold the quorum out (4 of 14
    votes; on bfb477a the round was never certified), or, voting together, certify a value of
    their own. Admitted to the roster, they are in no electorate and no proposer turn; their
    precommits and proposals count for nothing, and only the ones the round's slate draws may
    have a payload in it (at most a third of its inputs)."""
    replica = _earned_run()
    sybils = keys(10, offset=200)
    for sybil in sybils:
        replica.create(sybil, "join", round=3)
    certify(replica, HONEST, b"\x53" * 32)  # round 3 admits their joins
    chain = replica.chain
    assert _public(sybils) <= set(chain.tip.membership.roster)
    assert replica.electorate(4) == _public(HONEST)
    assert {chain.proposer(attempt) for attempt in range(64)} == _public(HONEST)
    drawn = replica.contributors(4) - _public(HONEST)
    assert len(drawn) == len(HONEST) // 2 and drawn <= _public(sybils)  # the slate: half of E, drawn
    # Every Sybil commits, proposes the ten payloads and precommits them.
    for sybil in sybils:
        replica.create(sybil, "commit", round=4, hash=sybil.public_key, size=10)
    theirs = Value(4, tuple(sorted(op for author, op in replica.commit_ops(4).items() if author in _public(sybils))))
    try:
        chain.read(theirs)
    except InvalidValue as error:
        assert "may not contribute" in str(error) or "no payload of a key with a say" in str(error)
    else:
        raise AssertionError("a value of Sybil payloads alone was valid")
    for sybil in sybils:
        replica.create(sybil, "proposal", round=4, epoch=0, attempt=0, valid=0, **theirs.fields())
        replica.create(sybil, "precommit", round=4, epoch=0, attempt=0, value=theirs.id, state=b"\x66" * 32)
    assert chain.round == 3
    # The four members certify the round without them; a drawn Sybil's payload may be in it.
    certify(replica, [*HONEST, *sybils], b"\x54" * 32)
    certificate = chain.certificates[4]
    assert chain.voters(4) == _public(HONEST) and certificate.state == b"\x54" * 32
    assert set(certificate.reading.fresh) <= drawn and len(certificate.reading.fresh) <= 1
    assert replica.electorate(5) == _public(HONEST)


def test_a_fresh_key_earns_a_say_by_earn_rounds_of_counted_work_and_not_before():
    """On bfb477a one contribution accepted by a certified round gave its author a vote. Now a
    fresh key's payload must count in `earn_rounds` certified rounds (it may commit in a round
    only when the round's slate draws it: here it is the only fresh key, always drawn)."""
    replica = _earned_run()
    newcomer = keys(1, offset=300)[0]
    everyone = [*HONEST, newcomer]
    replica.create(newcomer, "join", round=3)
    assert newcomer.public_key not in replica.contributors(3)  # not on the roster yet
    certify(replica, everyone)  # round 3 admits its join
    earn = replica.genesis.earn_rounds
    for counted in range(earn):
        round_ = replica.chain.tip.round
        assert newcomer.public_key not in replica.electorate(round_)
        assert replica.state.earning == {newcomer.public_key: earn - counted}
        assert newcomer.public_key in replica.contributors(round_)
        certify(replica, everyone)
        assert replica.chain.certificates[round_].reading.fresh == {newcomer.public_key}
        assert replica.chain.voters(round_) == _public(HONEST)  # it precommitted nothing
    assert newcomer.public_key in replica.electorate(replica.chain.tip.round)
    assert replica.state.earning == {}
    certify(replica, everyone)
    assert newcomer.public_key in replica.chain.voters(replica.chain.round)


def test_before_any_round_only_the_creator_weighs_and_only_admitted_keys_contribute():
    replica = Replica(genesis(HONEST[0], admitted=sorted(_public(HONEST[1:]))))
    for member in (*HONEST, *SYBILS):
        replica.create(member, "join", round=1)
    assert replica.electorate(1) == frozenset({HONEST[0].public_key})
    assert replica.contributors(1) == _public(HONEST)  # the Sybils wait for a round to admit their joins
    assert replica.chain.proposer(0) == HONEST[0].public_key


def test_members_that_are_gone_leave_the_electorate_and_those_that_contribute_go_on():
    """The run's trusted members stop (a crash: no leave); after `absent_rounds` rounds in which
    their payloads counted nowhere and they precommitted no certificate, they leave the
    electorate, so those that contribute hold its quorum alone (and one that comes back is back
    in it from the round after its payload counts again)."""
    replica = _earned_run()
    gone, there = HONEST[3], HONEST[:3]
    absent = replica.genesis.absent_rounds
    for _ in range(absent):
        chain = replica.chain
        assert gone.public_key in chain.tip.electorate
        turn = next(attempt for attempt in range(4) if chain.proposer(attempt) != gone.public_key)
        certify(replica, there, attempt=turn)  # three of four: a quorum
    assert replica.chain.tip.electorate == _public(there)
    assert gone.public_key in replica.chain.tip.membership.roster  # it keeps its say, away
    certify(replica, HONEST)  # back: it commits; its payload counts
    assert replica.chain.tip.electorate == _public(HONEST)
