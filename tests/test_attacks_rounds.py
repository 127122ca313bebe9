"""Attacks on a round's liveness (issue #18, findings 1, 7 and B) on the agreement (node/agreement/:
Tendermint over the run's CRDT): a proposer that withholds its own payload, a proposer order a
key could grind, a member that crashed, a minority that would end an attempt or an epoch early;
and what `run status` says of a round that waits. The chain's rules (crdt/chain.py) through the
real Replica, ops written by hand; the seat and machine (node/agreement/seat.py) in
tests/agreement_sim.py's World. The same attacks against real nodes in netsim:
tests/test_attacks_netsim.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from locomesh.crdt import Replica, Value
from locomesh.node.agreement import tendermint as tm
from locomesh.node.agreement.proposing import own_value
from locomesh.node.agreement.seat import Answer, Seat, Write
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.status import waiting_on
from locomesh.protocol import Identity, peer_id_from_public_key

from .agreement_sim import World, state_of
from .test_crdt_support import H1, H2, certify, joined_replica, keys

# --- a proposer that withholds its own payload ------------------------------------------------------


def test_a_proposer_that_withholds_its_own_payload_is_passed_over():
    """A member commits every round and never serves its payload; in its turn as proposer its value
    names that payload. On bfb477a the honest peers followed such a proposal for ever (320 Fetch
    actions, still in `propose` after 6 hours). Now nobody finds the value valid (its payload cannot
    be fetched), the attempt ends nil, the next proposer's value is decided, and no certified set
    ever holds the withheld payload."""
    world = World(seed=3, n=4, behaviours={3: "withhold"})
    world.run(until=300)
    withholder = world.members[3].key
    replica = world.honest()[0].replica
    chain = replica.chain
    assert world.agree() and chain.round >= 15, "the honest members stalled on the withheld proposal"
    its_turns = []
    for round_, certificate in sorted(chain.certificates.items()):
        assert withholder not in certificate.accepted
        # proposal rows: (id, author, round, epoch, attempt, valid, set, members, last)
        first = [row for row in replica.facts.in_round("proposal", round_).get(withholder, ())
                 if (row[3], row[4]) == (certificate.epoch, 0)]
        if first:  # its turn first: its value named its own payload, and was passed over
            assert all(replica.commit_ops(round_)[withholder] in row[6] for row in first)
            assert certificate.attempt >= 1 and certificate.proposer != withholder
            its_turns.append(round_)
    assert len(its_turns) >= 3, its_turns


# --- the proposer order ---------------------------------------------------------------------------

MEMBERS = keys(4)
KEYS = frozenset(member.public_key for member in MEMBERS)


def _run() -> Replica:
    """A run of four (all admitted at genesis) whose round 1 is certified: round 2's electorate is all four."""
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    assert replica.chain.tip.electorate == KEYS
    return replica


def test_the_proposer_order_is_drawn_from_the_certified_hash_so_no_key_is_ground_to_be_first():
    """On bfb477a the order was drawn from the round number alone: a key could be ground offline
    to come first in any round it chose. Now the seed is the state hash certified before the round:
    the same round, the same electorate, another certified hash, another first proposer."""
    firsts = set()
    for i in range(32):
        replica = joined_replica(MEMBERS)
        certify(replica, MEMBERS, state=bytes([i]) * 32)
        assert replica.chain.tip.round == 2 and replica.chain.tip.seed == bytes([i]) * 32
        firsts.add(replica.chain.proposer(0))
    assert firsts == KEYS


def test_every_member_proposes_once_in_turn_and_each_epoch_draws_its_own_order():
    """A member that is gone costs one attempt, never more: in any |E| attempts in a row each
    member proposes once."""
    chain = _run().chain
    for start in range(3 * len(KEYS)):
        assert {chain.proposer(attempt) for attempt in range(start, start + len(KEYS))} == KEYS
    assert len({tuple(chain.proposer(attempt, epoch=epoch) for attempt in range(4)) for epoch in range(8)}) > 1


# --- run status -----------------------------------------------------------------------------------

RECOVER = 120.0


def participation(replica: Replica, me: Identity, *, connected: set[bytes] = frozenset()) -> SimpleNamespace:
    """What node/rounds/status.py reads of a `RunParticipation`: its replica, round machine (at the
    replica's certified round) and agreement seat, its peers (`connected`: keys it holds a
    connection to) and its recover deadline."""
    chain = replica.chain
    return SimpleNamespace(
        me=me.public_key, identity=me, replica=replica,
        machine=rm.RoundMachine(me.public_key, state_round=chain.round, state_hash=chain.state_of(chain.round)),
        seat=Seat(me.public_key, timeouts=tm.Timeouts, recover_after=lambda: RECOVER),
        sitting_out=lambda: None, _peer_id=peer_id_from_public_key, recover_after=lambda: RECOVER,
        node=SimpleNamespace(peers={peer_id_from_public_key(key) for key in connected}))


def agree(p: SimpleNamespace, now: float) -> None:
    """Show the seat the replica and carry out what it says (answers: we hold every payload, and
    a value's state is `state_of` it), until it says nothing more."""
    outs = p.seat.observe(p.replica.chain, p.replica.facts, now)
    while outs:
        out = outs.pop(0)
        if isinstance(out, Write):
            p.replica.create(p.identity, out.op_type, **out.fields)
            outs += p.seat.observe(p.replica.chain, p.replica.facts, now)
            continue
        question = out.question
        if isinstance(question, tm.NeedValue):
            value = own_value(p.replica.chain, p.replica.facts, set(p.replica.commit_ops(out.round)))
            answer = tm.ValueReady(question.attempt, value)
        elif isinstance(question, tm.Check):
            answer = tm.Checked(question.value.id, True)
        else:
            answer = tm.Hashed(question.value.id, state_of(question.value.id))
        outs += p.seat.answer(Answer(out.round, out.epoch, answer))


def peers(*identities: Identity) -> list[str]:
    return sorted(peer_id_from_public_key(identity.public_key) for identity in identities)


async def test_run_status_says_what_a_round_waits_for_and_on_whom():
    replica = _run()
    chain = replica.chain
    proposer = next(m for m in MEMBERS if m.public_key == chain.proposer(0))
    me = next(m for m in MEMBERS if m is not proposer)
    others = [m for m in MEMBERS if m is not me]
    p = participation(replica, me, connected={m.public_key for m in others if m is not proposer})
    start = trio.current_time()
    assert p.machine.handle(rm.Observation(start, 1, chain.state_of(1), {}, eligible=4)) == [rm.StartTraining(2)]
    assert waiting_on(p) == {"for": "our inner steps", "on": [], "unreachable": []}
    replica.create(me, "commit", round=2, hash=H1, size=10)
    p.machine.handle(rm.Trained(2, H1, 10, 1.0, start))
    agree(p, start)  # our commit starts the round's agreement here
    waiting = waiting_on(p)
    assert waiting["for"] == "the proposal of attempt 0" and waiting["on"] == waiting["unreachable"] == peers(proposer)
    assert (waiting["attempt"], waiting["epoch"], waiting["step"], waiting["deadline_s"], waiting["stuck"]) == (
        0, 0, "propose", RECOVER, None)
    assert waiting["next"].startswith("prevote the attempt's proposal once its payloads are here")
    for member in others:
        replica.create(member, "commit", round=2, hash=H2, size=10)
    value = own_value(chain, replica.facts, set(replica.commit_ops(2)))
    replica.create(proposer, "proposal", round=2, epoch=0, attempt=0, valid=0, **value.fields())
    agree(p, start + 1.0)  # checked, prevoted
    waiting = waiting_on(p)
    assert waiting["for"] == "prevotes of more than two thirds of 4" and waiting["on"] == peers(*others)
    assert waiting["unreachable"] == peers(proposer) and waiting["step"] == "prevote"
    for member in others[:2]:
        replica.create(member, "prevote", round=2, epoch=0, attempt=0, value=value.id)
    agree(p, start + 2.0)  # three of four prevoted the value: locked, precommitted
    waiting = waiting_on(p)
    assert waiting["for"] == "precommits of more than two thirds of 4" and waiting["on"] == peers(*others)
    assert waiting["step"] == "precommit" and waiting["next"].startswith("adopt the state once the round is certified")
    replica.create(others[0], "precommit", round=2, epoch=0, attempt=0, value=value.id, state=state_of(value.id))
    assert waiting_on(p)["on"] == peers(*others[1:])


# --- a member that crashed ------------------------------------------------------------------------

THREE = keys(3, offset=40)
X, Y, Z = THREE  # X created the run


def _three_member_run() -> Replica:
    """Rounds 1 (X alone) and 2 (all three) certified; round 3 is under way."""
    replica = joined_replica(THREE)
    certify(replica, THREE)
    certify(replica, THREE)
    assert replica.chain.tip.round == 3 and len(replica.chain.tip.electorate) == 3
    return replica


def _by_key(key: bytes) -> Identity:
    return next(identity for identity in THREE if identity.public_key == key)


def _propose(replica: Replica, held: list[Identity], attempt: int, epoch: int = 0) -> Value:
    """The proposer of `attempt` proposes the value of what it holds (the payloads of `held`)."""
    chain = replica.chain
    value = own_value(chain, replica.facts, {identity.public_key for identity in held})
    assert value is not None
    replica.create(_by_key(chain.proposer(attempt)), "proposal", round=chain.tip.round, epoch=epoch, attempt=attempt,
                   valid=0, **value.fields())
    return value


def _turn(replica: Replica, alive: list[Identity], epoch: int = 0) -> int:
    """The first attempt whose proposer is alive."""
    alive_keys = {identity.public_key for identity in alive}
    return next(a for a in range(8) if replica.chain.proposer(a, epoch=epoch) in alive_keys)


@pytest.mark.parametrize("z_committed", [False, True])
def test_a_member_that_crashed_does_not_deadlock_a_three_member_run(z_committed):
    """Z crashes in round 3 (before committing, or after its commit went out but before anyone
    fetched its payload): a quorum of three needs all three precommits, and on bfb477a the other
    two sat in the round for ever. Here X and Y prevote and precommit in vain, then each signs a
    `recover` carrying its lock: two of three start a recovery epoch, whose first round a majority
    decides; its value names their recovers, so Z, named by neither a recover nor a payload, leaves
    the electorate. Back, it commits, and is in it again from the round after."""
    replica = _three_member_run()
    chain = replica.chain
    alive = [X, Y]
    for member in THREE if z_committed else alive:
        replica.create(member, "commit", round=3, hash=member.public_key, size=10)
    attempt = _turn(replica, alive)
    value = _propose(replica, alive, attempt)
    for member in alive:
        replica.create(member, "prevote", round=3, epoch=0, attempt=attempt, value=value.id)
        replica.create(member, "precommit", round=3, epoch=0, attempt=attempt, value=value.id, state=H1)
    assert chain.round == 2, "two of three precommits certified a round"
    lock = {"lock": attempt + 1, "value": value.id}
    replica.create(X, "recover", round=2, epoch=0, state=chain.state_of(2), **lock)
    assert chain.tip.epoch.number == 0, "one of three started a recovery"
    replica.create(Y, "recover", round=2, epoch=0, state=chain.state_of(2), **lock)
    assert (chain.tip.round, chain.tip.epoch.number, chain.tip.epoch.recovery) == (3, 1, True)
    assert chain.carried() is None  # two prevotes of three prove no lock: any valid value may be decided
    attempt = _turn(replica, alive, epoch=1)
    recovered = _propose(replica, alive, attempt, epoch=1)
    for member in alive:
        replica.create(member, "precommit", round=3, epoch=1, attempt=attempt, value=recovered.id, state=H2)
    assert chain.round == 3 and chain.certificates[3].epoch == 1 and chain.certificates[3].state == H2
    assert chain.certificates[3].accepted == {X.public_key, Y.public_key}
    assert replica.electorate(4) == {X.public_key, Y.public_key}
    assert Z.public_key in chain.tip.membership.roster and chain.tip.membership.roster[Z.public_key].say
    certify(replica, THREE)  # round 4: Z is back and commits; X and Y, the electorate, certify it
    assert chain.certificates[4].accepted == {m.public_key for m in THREE}
    assert replica.electorate(5) == {m.public_key for m in THREE}


# --- attempts never add up, and a minority ends nothing early ---------------------------------------


def test_precommits_of_different_attempts_values_or_states_never_make_a_certificate_and_one_is_final():
    """A certificate is more than two thirds of the electorate precommitting one (value, state) in
    one attempt, with that attempt's proposal of the value (3 of 4 here). Precommits split across
    attempts, or across states of one value, or of a value no proposer of theirs proposed, certify
    nothing; once a round is certified, more precommits of another value change nothing."""
    replica = _run()
    chain = replica.chain
    for member in MEMBERS:
        replica.create(member, "commit", round=2, hash=member.public_key, size=10)
    by_key = {member.public_key: member for member in MEMBERS}
    turns = [by_key[chain.proposer(attempt)] for attempt in range(5)]  # round 2's proposers
    first = own_value(chain, replica.facts, set(replica.commit_ops(2)))
    replica.create(turns[0], "proposal", round=2, epoch=0, attempt=0, valid=0, **first.fields())
    split = [(0, H1), (0, H1), (0, H2), (1, H1)]  # per member: the attempt and state of its precommit of `first`
    for member, (attempt, state) in zip(MEMBERS, split):
        replica.create(member, "precommit", round=2, epoch=0, attempt=attempt, value=first.id, state=state)
    assert chain.round == 1
    unproposed = Value(2, first.set[:2], (), first.last)  # attempt 2's proposer proposed nothing
    for member in MEMBERS[:3]:
        replica.create(member, "precommit", round=2, epoch=0, attempt=2, value=unproposed.id, state=H1)
    assert chain.round == 1
    replica.create(turns[3], "proposal", round=2, epoch=0, attempt=3, valid=0, **first.fields())
    for member in MEMBERS[:3]:
        replica.create(member, "precommit", round=2, epoch=0, attempt=3, value=first.id, state=H2)
    assert chain.round == 2 and (chain.certificates[2].attempt, chain.certificates[2].state) == (3, H2)
    other = Value(2, first.set[1:], (), first.last)
    replica.create(turns[4], "proposal", round=2, epoch=0, attempt=4, valid=0, **other.fields())
    for member in MEMBERS:
        replica.create(member, "precommit", round=2, epoch=0, attempt=4, value=other.id, state=H1)
    assert (chain.certificates[2].value_id, chain.certificates[2].state) == (first.id, H2)
    assert replica.state.rounds[-1] == (2, H2)


def test_a_minority_cannot_end_an_attempt_nor_an_epoch_early():
    """A recovery epoch needs more than half of the electorate (exactly half with the run's
    creator): fewer, or half without the creator, change nothing, whatever they sign or precommit."""
    replica = _run()
    chain = replica.chain
    creator, *others = MEMBERS
    state = chain.state_of(1)
    replica.create(others[0], "recover", round=1, epoch=0, state=state, lock=0, value=b"")
    replica.create(others[1], "recover", round=1, epoch=0, state=state, lock=0, value=b"")
    assert chain.tip.epoch.number == 0 and chain.tip.electorate == KEYS  # two of four, without the creator
    for member in others[:2]:
        replica.create(member, "commit", round=2, hash=member.public_key, size=10)
        for attempt in range(4):
            replica.create(member, "precommit", round=2, epoch=0, attempt=attempt, value=H1, state=H1)
    assert chain.round == 1 and chain.tip.epoch.number == 0
    replica.create(creator, "recover", round=1, epoch=0, state=state, lock=0, value=b"")
    assert chain.tip.epoch.number == 1 and chain.tip.epoch.recovery  # three of four
    again = _run()
    for member in (creator, others[0]):
        again.create(member, "recover", round=1, epoch=0, state=again.chain.state_of(1), lock=0, value=b"")
    assert again.chain.tip.epoch.number == 1, "exactly half with the creator recovers"
