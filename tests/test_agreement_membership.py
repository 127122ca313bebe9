"""A say must be earned (crdt/membership.py), values are checked alike everywhere (crdt/value.py), and
the run's view costs per op what the op touches (crdt/chain.py): each attack of issue #45 that
worked on 24b704e, run against the real replicas."""

from __future__ import annotations

from locomesh.crdt import InvalidValue, Replica, Value
from locomesh.crdt.membership import JOIN_FRESH
from locomesh.crdt.ops.base import MAX_CHANGES
from locomesh.node.agreement.proposing import own_value

from .agreement_sim import World
from .test_crdt_support import genesis, keys

HASH = b"\x11" * 32


def _sets(world: World) -> list[tuple[int, set[bytes], set[bytes]]]:
    """(round, payload authors, their authors without a say then) of every round certified."""
    chain = world.honest()[0].replica.chain
    return [(r, set(c.reading.payloads), set(c.reading.fresh)) for r, c in sorted(chain.certificates.items())]


def test_nine_fresh_keys_beside_four_members_gain_a_say_no_faster_than_earned_and_never_a_third():
    """On 24b704e nine fresh keys that committed zero payloads were 9 of 13 inputs of round 2's
    aggregate, all earned a vote, and certified any hash in round 3 without one honest vote."""
    world = World(seed=4, n=4, sybils=9)
    world.run(until=900)
    sybils = {m.key for m in world.members if m.behaviour == "sybil"}
    chain = world.honest()[0].replica.chain
    assert world.agree() and chain.round >= 20
    for _round, authors, fresh in _sets(world):
        assert 3 * len(fresh) < len(authors) or len(fresh) <= 1  # under a third; at least one may be taken
        assert fresh <= sybils
    earn = world.genesis.earn_rounds
    for round_ in range(1, 3 * earn + 2):  # the honest keep more than two thirds for 3 x earn_rounds rounds
        electorate = chain.certificates[round_].electorate
        assert 3 * len(electorate - sybils) > 2 * len(electorate), f"round {round_}: {len(electorate & sybils)} sybils"
    counted: dict[bytes, int] = {}
    for round_, authors, fresh in _sets(world):
        for key in fresh:
            counted[key] = counted.get(key, 0) + 1
        for key in chain.certificates[round_].electorate & sybils:
            assert counted.get(key, 0) >= earn, "a say before earn_rounds counted rounds"


def test_a_run_of_one_that_others_join_grows_to_eight_voters_and_says_who_is_earning():
    world = World(seed=6, n=8, open_run=True)
    world.run(until=60)
    earning = world.members[0].replica.state.earning
    assert len(earning) == 7 and all(0 <= rounds <= world.genesis.earn_rounds for rounds in earning.values())
    world.run(until=4000, stop=lambda: len(world.members[0].replica.chain.tip.electorate) == 8)
    assert len(world.members[0].replica.chain.tip.electorate) == 8 and world.agree()


def test_a_set_of_one_sybil_payload_is_invalid_everywhere():
    """On 24b704e, after a split, three Byzantine votes made honest members aggregate a Sybil's
    single payload. A value must hold payloads of more than a third of the electorate."""
    creator, *others = keys(5)
    replica = Replica(genesis(creator, admitted=[k.public_key for k in others[:3]]))
    for key in (creator, *others):
        replica.create(key, "join", round=1)
    replica.create(creator, "commit", round=1, hash=HASH, size=10)
    joins = tuple(sorted(row[0] for row in replica.facts.rows["join"] if row[1] != creator.public_key))
    first = Value(1, tuple(replica.commit_ops(1).values()), joins)
    replica.create(creator, "proposal", round=1, epoch=0, attempt=0, valid=0, **first.fields())
    replica.create(creator, "precommit", round=1, epoch=0, attempt=0, value=first.id, state=HASH)
    assert replica.chain.round == 1 and len(replica.chain.tip.electorate) == 4
    sybil = others[3]
    replica.create(sybil, "commit", round=2, hash=HASH, size=10)
    single = Value(2, (replica.commit_ops(2)[sybil.public_key],))
    try:
        replica.chain.read(single)
    except InvalidValue as error:
        assert "no payload of a key with a say" in str(error) or "may not contribute" in str(error)
    else:
        raise AssertionError("a value of one Sybil payload was valid")


def test_five_thousand_joins_wait_their_turn_and_cost_no_derivation_per_op():
    """On 24b704e 5,000 joins raised deriving the run's view from 17 ms to 3.3 s, and each further
    op cost 3.6 s more: the view looped over every key that ever joined, for every round. Joins
    now touch only the facts until a value admits them, MAX_CHANGES at most a round."""
    creator, *flood = keys(1 + 2000, offset=100)
    replica = Replica(genesis(creator))
    replica.create(creator, "join", round=1)
    for key in flood:
        replica.create(key, "join", round=1)
    assert list(replica.chain.tip.membership.roster) == [creator.public_key]
    assert len(replica.joining()) == len(flood)
    replica.create(creator, "commit", round=1, hash=HASH, size=10)
    value = own_value(replica.chain, replica.facts, {creator.public_key})
    assert value is not None and len(value.members) == MAX_CHANGES
    replica.create(creator, "proposal", round=1, epoch=0, attempt=0, valid=0, **value.fields())
    replica.create(creator, "precommit", round=1, epoch=0, attempt=0, value=value.id, state=HASH)
    assert len(replica.chain.tip.membership.roster) == 1 + MAX_CHANGES
    assert replica.chain.tip.electorate == {creator.public_key}  # fresh keys have no say


def test_a_stale_join_is_not_admitted():
    creator, late = keys(2, offset=300)
    replica = Replica(genesis(creator))
    replica.create(creator, "join", round=1)
    replica.create(late, "join", round=0)
    for round_ in range(1, JOIN_FRESH + 3):
        replica.create(creator, "commit", round=round_, hash=HASH, size=10)
        value = Value(round_, (replica.commit_ops(round_)[creator.public_key],), (),
                      own_value(replica.chain, replica.facts, {creator.public_key}).last)
        replica.create(creator, "proposal", round=round_, epoch=0, attempt=0, valid=0, **value.fields())
        replica.create(creator, "precommit", round=round_, epoch=0, attempt=0, value=value.id, state=HASH)
    assert replica.chain.round == JOIN_FRESH + 2
    assert late.public_key not in replica.joining()
    assert own_value(replica.chain, replica.facts, {creator.public_key}) is None or not any(
        replica.facts.refs[op][1][1] == late.public_key for op in own_value(
            replica.chain, replica.facts, {creator.public_key}).members)
