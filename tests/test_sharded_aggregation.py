"""The sharded aggregation state machine (node/exchange/sharded_machine.py): one peer's part in one round."""

from __future__ import annotations

import random
from collections import deque

import pytest

from locomesh.node.exchange.sharded_machine import (
    ABANDON_AFTER, Accuse, Assemble, ComputeShard, Disputed, FetchInput, FetchResult, GiveUp, ImpossibleEvent,
    InputFetched,
    PublishResult, ResultFetched, ResultSigned, ShardComputed, ShardedAggregation, ShardPhase, Tick,
)
from locomesh.node.exchange.committees import plan, shard_committees

ME, A, B, C = b"me", b"a", b"b", b"c"
AUTHORS = (ME, A, B, C)
GOOD, BAD = b"good" * 8, b"bad!" * 8
WAIT = 10.0


def machine(committees, checks=(), authors=AUTHORS) -> tuple[ShardedAggregation, list]:
    aggregation = ShardedAggregation(ME, authors, committees, checks, now=0.0, result_wait=WAIT)
    return aggregation, aggregation.start()


def feed_inputs(aggregation, shard: int, now: float = 1.0) -> list:
    actions = []
    for author in AUTHORS:
        if author != ME:
            actions += aggregation.handle(InputFetched(shard, author, True, now))
    return actions


def sign(aggregation, shard: int, members, result_hash=GOOD, now: float = 1.0) -> list:
    actions = []
    for member in members:
        actions += aggregation.handle(ResultSigned(shard, member, result_hash, now))
    return actions


def test_an_honest_round_computes_the_seat_fetches_the_rest_and_assembles_once():
    aggregation, actions = machine([[ME, A], [B, C], [A, B]])
    assert actions == [FetchInput(0, A), FetchInput(0, B), FetchInput(0, C)]
    assert feed_inputs(aggregation, 0) == [ComputeShard(0)]
    assert aggregation.handle(ShardComputed(0, GOOD, 2.0)) == [PublishResult(0, GOOD)]
    assert sign(aggregation, 0, [A]) == []  # agrees with ours: nothing to do
    assert sign(aggregation, 1, [B]) == []  # the committee is not complete yet
    assert sign(aggregation, 1, [C]) == [FetchResult(1, GOOD, (B, C))]
    assert sign(aggregation, 2, [A, B]) == [FetchResult(2, GOOD, (A, B))]
    assert aggregation.handle(ResultFetched(1, True, 3.0)) == []
    assert aggregation.handle(ResultFetched(2, True, 3.0)) == [Assemble()]
    assert aggregation.done and aggregation.handle(Tick(100.0)) == []


def test_a_member_that_contradicts_the_committee_forces_a_recomputation_and_is_accused():
    aggregation, _ = machine([[ME, A], [B, C]])
    feed_inputs(aggregation, 0)
    aggregation.handle(ShardComputed(0, GOOD, 2.0))
    assert sign(aggregation, 1, [B]) == []
    recompute = sign(aggregation, 1, [C], BAD)
    assert recompute == [FetchInput(1, A), FetchInput(1, B), FetchInput(1, C)]
    assert aggregation.shards[1].phase is ShardPhase.INPUTS
    assert feed_inputs(aggregation, 1) == [ComputeShard(1)]
    assert aggregation.handle(ShardComputed(1, GOOD, 3.0)) == [Accuse(1, C, BAD, GOOD, "wrong-result"), Assemble()]


def test_a_wholly_byzantine_committee_is_caught_by_a_check():
    aggregation, actions = machine([[A, B], [A, C]], checks=[1])
    assert actions == [FetchInput(1, A), FetchInput(1, B), FetchInput(1, C)]
    assert sign(aggregation, 1, [A, C], BAD) == []  # a check waits for its own result, not for theirs
    feed_inputs(aggregation, 1)
    assert aggregation.handle(ShardComputed(1, GOOD, 2.0)) == [
        Accuse(1, A, BAD, GOOD, "wrong-result"), Accuse(1, C, BAD, GOOD, "wrong-result")]
    assert sign(aggregation, 0, [A, B]) == [FetchResult(0, GOOD, (A, B))]
    assert aggregation.handle(ResultFetched(0, True, 3.0)) == [Assemble()]


def test_a_dispute_makes_a_shard_settled_on_the_committees_word_be_recomputed():
    """A committee that is all Byzantine signs one wrong hash; a check elsewhere disputes it, and
    we recompute rather than rest on the committee's word. A shard computed here stays as it is."""
    aggregation, _ = machine([[ME, A], [B, C], [A, B]])
    feed_inputs(aggregation, 0)
    aggregation.handle(ShardComputed(0, GOOD, 2.0))
    sign(aggregation, 1, [B, C], BAD)
    aggregation.handle(ResultFetched(1, True, 3.0))
    assert aggregation.shards[1].phase is ShardPhase.SETTLED
    assert aggregation.handle(Disputed(0, 3.5)) == []  # computed here
    assert aggregation.handle(Disputed(1, 4.0)) == [FetchInput(1, A), FetchInput(1, B), FetchInput(1, C)]
    assert aggregation.handle(Disputed(1, 4.1)) == []  # already recomputing
    sign(aggregation, 2, [A, B])
    aggregation.handle(ResultFetched(2, True, 4.5))
    assert feed_inputs(aggregation, 1) == [ComputeShard(1)]
    assert aggregation.handle(ShardComputed(1, GOOD, 5.0)) == [
        Accuse(1, B, BAD, GOOD, "wrong-result"), Accuse(1, C, BAD, GOOD, "wrong-result"), Assemble()]


def test_a_lie_signed_after_our_computation_is_accused_at_once():
    aggregation, _ = machine([[ME, A]])
    feed_inputs(aggregation, 0)
    assert aggregation.handle(ShardComputed(0, GOOD, 2.0)) == [PublishResult(0, GOOD), Assemble()]
    aggregation2, _ = machine([[ME, A], [B, C]])
    feed_inputs(aggregation2, 0)
    aggregation2.handle(ShardComputed(0, GOOD, 2.0))
    assert sign(aggregation2, 0, [A], BAD) == [Accuse(0, A, BAD, GOOD, "wrong-result")]
    assert sign(aggregation2, 0, [A], BAD) == []  # accused once


def test_a_silent_member_does_not_hold_the_round_past_the_result_deadline():
    aggregation, _ = machine([[A, B]])
    sign(aggregation, 0, [A])
    assert aggregation.handle(Tick(WAIT - 0.1)) == []
    assert aggregation.handle(Tick(WAIT)) == [FetchInput(0, A), FetchInput(0, B), FetchInput(0, C)]
    feed_inputs(aggregation, 0, now=WAIT + 1)
    assert aggregation.handle(ShardComputed(0, GOOD, WAIT + 2)) == [Assemble()]
    assert sign(aggregation, 0, [B], GOOD, now=WAIT + 3) == []  # late, and right: nothing to say


def test_a_committee_that_does_not_deliver_what_it_signed_is_recomputed():
    aggregation, _ = machine([[A, B]])
    assert sign(aggregation, 0, [A, B]) == [FetchResult(0, GOOD, (A, B))]
    assert aggregation.handle(ResultFetched(0, False, 2.0)) == [FetchInput(0, A), FetchInput(0, B), FetchInput(0, C)]
    assert aggregation.handle(ResultFetched(0, True, 2.5)) == []  # overtaken: stale, changes nothing
    feed_inputs(aggregation, 0)
    assert aggregation.handle(ShardComputed(0, GOOD, 3.0)) == [Assemble()]


def test_a_member_that_signs_two_hashes_is_accused_of_equivocation():
    aggregation, _ = machine([[A, B]])
    sign(aggregation, 0, [A])
    actions = sign(aggregation, 0, [A], BAD)
    assert actions[0] == Accuse(0, A, BAD, GOOD, "equivocation")
    assert actions[1:] == [FetchInput(0, A), FetchInput(0, B), FetchInput(0, C)]


def test_signatures_from_outside_the_committee_and_our_own_count_for_nothing():
    aggregation, _ = machine([[A, B], [ME, C]])
    assert sign(aggregation, 0, [C, ME], BAD) == []
    assert aggregation.shards[0].signed == {}


def test_a_withheld_input_is_asked_for_again_with_growing_pauses_then_the_proposal_is_given_up():
    aggregation, _ = machine([[ME, A]])
    assert aggregation.handle(InputFetched(0, A, False, 1.0)) == []
    assert aggregation.handle(Tick(1.9)) == []
    assert aggregation.handle(Tick(2.0)) == [FetchInput(0, A)]
    assert aggregation.handle(InputFetched(0, A, False, 2.5)) == []
    assert aggregation.handle(Tick(4.4)) == []
    assert aggregation.handle(Tick(4.5)) == [FetchInput(0, A)]
    assert ABANDON_AFTER == 3
    assert aggregation.handle(InputFetched(0, A, False, 5.0)) == [GiveUp(0, A)]
    assert aggregation.done and feed_inputs(aggregation, 0) == []


def test_a_round_with_only_our_own_contribution_computes_at_once():
    aggregation, actions = machine([[ME]], authors=[ME])
    assert actions == [ComputeShard(0)]
    assert aggregation.handle(ShardComputed(0, GOOD, 1.0)) == [PublishResult(0, GOOD), Assemble()]


def test_events_the_protocol_cannot_produce_raise():
    aggregation, _ = machine([[A, B], [ME, C]])
    with pytest.raises(ImpossibleEvent):
        aggregation.handle(ShardComputed(0, GOOD, 1.0))  # nobody asked to compute a shard we wait for
    with pytest.raises(ImpossibleEvent):
        aggregation.handle(InputFetched(0, A, True, 1.0))  # nor fetched its inputs
    with pytest.raises(ImpossibleEvent):
        aggregation.handle(ResultFetched(1, True, 1.0))  # our seat's result is never fetched
    with pytest.raises(ImpossibleEvent):
        aggregation.handle(ResultSigned(5, A, GOOD, 1.0))


# -- many peers, some lying or silent ---------------------------------------------------------------

def run_group(members: int, byzantine: int, seed: int):
    """Every honest member's machine, driven to the end in one process: inputs always arrive,
    honest seats publish the true hash, each Byzantine seat signs a wrong hash or stays silent.
    Returns (the true hashes, what each honest peer settled each shard on, (accuser, accused)
    pairs, the members that signed a lie)."""
    rng = random.Random(seed)
    keys = [bytes([i]) * 4 for i in range(members)]
    liars = set(rng.sample(keys, byzantine))
    chosen = plan(members, byzantine_fraction=(byzantine + 1) / members)
    committees = shard_committees(1, seed.to_bytes(4, "big"), frozenset(keys), members, chosen.committee)
    truth = {s: b"true" + bytes([s]) for s in range(members)}
    honest = [key for key in keys if key not in liars]
    peers = {key: ShardedAggregation(key, keys, committees, rng.sample(range(members), chosen.verified),
                                     now=0.0, result_wait=WAIT) for key in honest}
    settled: dict[bytes, dict[int, bytes]] = {key: {} for key in honest}
    accusations: set[tuple[bytes, bytes]] = set()
    events: deque = deque()
    now = 1.0

    def carry(key: bytes, actions: list) -> None:
        for action in actions:
            if isinstance(action, FetchInput):
                events.append((key, InputFetched(action.shard, action.author, True, now)))
            elif isinstance(action, ComputeShard):
                settled[key][action.shard] = truth[action.shard]
                events.append((key, ShardComputed(action.shard, truth[action.shard], now)))
            elif isinstance(action, PublishResult):
                events.extend(
                    (other, ResultSigned(action.shard, key, action.result_hash, now)) for other in honest if other != key
                )
            elif isinstance(action, FetchResult):  # the values delivered hash to what was signed
                settled[key][action.shard] = action.result_hash
                events.append((key, ResultFetched(action.shard, True, now)))
            elif isinstance(action, Accuse):
                accusations.add((key, action.member))
            else:
                assert isinstance(action, Assemble), action

    for key in honest:
        carry(key, peers[key].start())
    signed_lies = set()
    for s, committee in enumerate(committees):
        for member in committee:
            if member in liars and rng.random() < 0.7:  # the others stay silent
                signed_lies.add(member)
                events.extend((key, ResultSigned(s, member, b"lie!" + bytes([s]), now)) for key in honest)
    while not all(peer.done for peer in peers.values()):
        if not events:
            now += WAIT
            events.extend((key, Tick(now)) for key in honest)
        key, event = events.popleft()
        carry(key, peers[key].handle(event))
    return truth, settled, accusations, signed_lies


@pytest.mark.parametrize("seed", range(6))
def test_with_fewer_than_a_third_lying_or_silent_every_honest_peer_settles_every_shard_on_the_truth(seed):
    truth, settled, accusations, signed_lies = run_group(members=10, byzantine=3, seed=seed)
    for key, shards in settled.items():
        assert shards == truth, f"peer {key!r} settled a wrong shard"
    accused = {member for _, member in accusations}
    assert accused == signed_lies  # every liar is caught (each committee holds an honest member), nobody else
