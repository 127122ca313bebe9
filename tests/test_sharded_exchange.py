"""Sharded exchange, the pure parts: shard payloads, their Merkle commitment, per-shard aggregation
assembled into the outer step, committees and the committee plan (training/shards.py,
protocol/merkle.py, node/exchange/committees.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from locomesh.node.exchange.committees import byzantine_bound, miss_probability, plan, shard_committees
from locomesh.protocol import merkle
from locomesh.training.codec import CodecError, Encoder, decode, encode, non_finite_payload, split_payload
from locomesh.training.simulation import DiLoCoConfig, simulate_diloco
from locomesh.training.inner import InnerConfig
from locomesh.training.outer import OuterStep
from locomesh.training.shards import (
    ShardedPayload, ShardLayout, aggregate_shard, check_shard, shard_result_hash, sharded_step,
)
from locomesh.training.tasks import get_task

RNG_SEED = 7


def vectors(count: int, numel: int, seed: int = RNG_SEED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(numel).astype(np.float32)
    return [(common + 0.3 * rng.standard_normal(numel)).astype(np.float32) for _ in range(count)]


# -- shard payloads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,numel", [("int8", 5000), ("int8", 1024), ("int4", 4097), ("fp32", 3001)])
def test_shard_payloads_are_the_whole_payload_cut_at_block_boundaries(mode, numel):
    x = vectors(1, numel)[0]
    layout = ShardLayout(numel, 1500, 1024)
    whole = Encoder(mode, error_feedback=True)
    sharded = Encoder(mode, error_feedback=True)
    for _ in range(2):  # the second round carries the error-feedback residual
        payload = whole.encode(x)
        shards = sharded.encode_shards(x, layout.bounds)
        assert shards == split_payload(payload, numel, layout.bounds)
        values = decode(payload, numel)
        for (start, stop), shard in zip(layout.bounds, shards):
            assert np.array_equal(decode(shard, stop - start), values[start:stop])
    if mode != "fp32":
        assert np.array_equal(whole.residual, sharded.residual)


def test_layout_rounds_shards_up_to_whole_blocks_and_covers_every_value():
    layout = ShardLayout(10_000, 1500, 1024)
    assert layout.shard_values == 2048 and layout.count == 5
    assert layout.bounds[0] == (0, 2048) and layout.bounds[-1] == (8192, 10_000)
    assert sum(layout.size(i) for i in range(layout.count)) == 10_000


def test_cuts_off_a_block_boundary_or_with_gaps_are_refused():
    x = vectors(1, 4096)[0]
    with pytest.raises(ValueError, match="block boundaries"):
        Encoder("int8").encode_shards(x, [(0, 1000), (1000, 4096)])
    with pytest.raises(ValueError, match="block boundaries"):
        split_payload(encode(x), 4096, [(0, 1024), (2048, 4096)])
    with pytest.raises(ValueError, match="end at"):
        Encoder("int8").encode_shards(x, [(0, 2048)])


# -- the Merkle commitment --------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13, 33])
def test_every_leaf_verifies_against_the_root_and_no_other_position_does(count):
    leaves = [merkle.leaf_hash(bytes([i])) for i in range(count)]
    root = merkle.root(leaves)
    for index in range(count):
        path = merkle.audit_path(leaves, index)
        assert len(path) <= max(1, (count - 1).bit_length())
        merkle.verify(leaves[index], index, count, path, root)
        for other in range(count):
            if other != index:
                with pytest.raises(merkle.MerkleError):
                    merkle.verify(leaves[index], other, count, path, root)


def test_a_wrong_leaf_count_or_path_is_a_typed_error():
    leaves = [merkle.leaf_hash(bytes([i])) for i in range(6)]
    root, path = merkle.root(leaves), merkle.audit_path(leaves, 4)
    with pytest.raises(merkle.MerkleError) as error:
        merkle.verify(merkle.leaf_hash(b"forged"), 4, 6, path, root)
    assert error.value.code == "wrong-root"
    for bad_path, count in ((path[:-1], 6), (path + [path[0]], 6), (path, 9)):
        with pytest.raises(merkle.MerkleError):
            merkle.verify(leaves[4], 4, count, bad_path, root)
    with pytest.raises(merkle.MerkleError) as error:
        merkle.verify(leaves[4], 4, 6, [b"short"] * len(path), root)
    assert error.value.code == "bad-path"
    with pytest.raises(merkle.MerkleError) as error:
        merkle.verify(leaves[0], 6, 6, path, root)
    assert error.value.code == "bad-index"
    with pytest.raises(merkle.MerkleError) as error:  # refused on its length, before it is walked
        merkle.verify(leaves[4], 4, 6, [b"\0" * 32] * (merkle.MAX_PATH + 1), root)
    assert error.value.code == "bad-path"
    # An inner node is not a leaf: the pair's node hash does not verify as leaf 0 of a 3-leaf tree.
    pair = merkle.root(leaves[:2])
    with pytest.raises(merkle.MerkleError):
        merkle.verify(pair, 0, 3, [merkle.root(leaves[:3][2:])], merkle.root(leaves[:3]))


def test_check_shard_accepts_the_committed_shard_and_refuses_a_swapped_or_oversized_one():
    numel = 9000
    layout = ShardLayout(numel, 2048)
    committed = ShardedPayload.encode(Encoder("int8"), vectors(1, numel)[0], layout)
    other = ShardedPayload.encode(Encoder("int8"), vectors(1, numel, seed=99)[0], layout)
    for index in range(layout.count):
        check_shard(committed.shards[index], index, layout, committed.root, committed.proof(index), codec="int8")
    with pytest.raises(merkle.MerkleError) as error:
        check_shard(other.shards[1], 1, layout, committed.root, committed.proof(1), codec="int8")
    assert error.value.code == "wrong-root"
    with pytest.raises(merkle.MerkleError):  # the right bytes presented as another shard
        check_shard(committed.shards[1], 2, layout, committed.root, committed.proof(1), codec="int8")
    with pytest.raises(CodecError) as error:  # refused on its size, before it is hashed
        check_shard(b"\0" * 10_000, 0, layout, committed.root, committed.proof(0), codec="int8")
    assert error.value.code == "too-large"
    with pytest.raises(merkle.MerkleError) as error:
        check_shard(committed.shards[0], layout.count, layout, committed.root, [], codec="int8")
    assert error.value.code == "bad-index"


# -- per-shard aggregation and the assembled step ----------------------------------------------------

def split_round(deltas: dict[str, np.ndarray], layout: ShardLayout) -> dict[str, list[bytes]]:
    return {author: split_payload(encode(delta), layout.numel, layout.bounds) for author, delta in deltas.items()}


@pytest.mark.parametrize("aggregator,options", [("mean", {}), ("coordinate_median", {}), ("trimmed_mean", {"beta": 0.2})])
def test_coordinatewise_aggregators_give_the_same_bits_sharded_or_not(aggregator, options):
    numel = 12_345
    layout = ShardLayout(numel, 3000)
    theta = vectors(1, numel, seed=1)[0]
    whole, sharded = OuterStep(theta, aggregator=aggregator, **options), OuterStep(theta, aggregator=aggregator, **options)
    for round_seed in range(3):
        deltas = {f"w{i}": v for i, v in enumerate(vectors(5, numel, seed=round_seed))}
        a = whole.step({author: encode(delta) for author, delta in deltas.items()})
        b = sharded_step(sharded, layout, split_round(deltas, layout))
        assert a.params_hash == b.params_hash and a.accepted == b.accepted


def test_a_shard_computed_by_another_peer_assembles_to_the_same_state():
    """What a committee member computes for its shard is what every peer would: two peers that
    hold the same state, one computing shards 0-1 and the other 2-3, assemble the same θ as a
    third that computed everything (CenteredClip, centred on the previous aggregate's shard)."""
    numel = 8192 + 500
    layout = ShardLayout(numel, 2048)
    theta = vectors(1, numel, seed=3)[0]
    peers = [OuterStep(theta, max_update_norm=50.0) for _ in range(3)]
    for round_seed in range(3):
        deltas = {f"w{i}": v for i, v in enumerate(vectors(6, numel, seed=10 + round_seed))}
        deltas["w5"] = deltas["w5"] * np.float32(-40)  # an attacker, clipped
        shards = split_round(deltas, layout)
        alone = sharded_step(peers[0], layout, shards)
        g = np.empty(numel, dtype=np.float32)
        results = {}
        for index, (start, stop) in enumerate(layout.bounds):
            peer = peers[1] if index < 2 else peers[2]
            values, accepted, _ = aggregate_shard(peer, layout, index, {a: s[index] for a, s in shards.items()})
            results[index] = shard_result_hash(round_seed, index, values)
            g[start:stop] = values
        assembled = [peer.apply_aggregate(g.copy(), accepted, {}) for peer in peers[1:]]
        assert {r.params_hash for r in assembled} == {alone.params_hash}
        assert np.array_equal(peers[0].previous, peers[1].previous)
        # Any peer holding the round's state recomputes a published shard from the committed
        # payloads and gets the signed hash; one changed bit gives another hash.
        checker = OuterStep(theta) if round_seed == 0 else None
        if checker is not None:
            recomputed, _, _ = aggregate_shard(checker, layout, 0, {a: s[0] for a, s in shards.items()})
            assert shard_result_hash(0, 0, recomputed) == results[0]
            recomputed[7] = np.nextafter(recomputed[7], np.float32(np.inf))
            assert shard_result_hash(0, 0, recomputed) != results[0]


def test_a_bad_shard_is_rejected_with_its_author_and_the_rest_is_aggregated():
    numel = 6000
    layout = ShardLayout(numel, 2048)
    deltas = {f"w{i}": v for i, v in enumerate(vectors(4, numel))}
    shards = split_round(deltas, layout)
    shards["w1"][2] = non_finite_payload("int8", float("nan"), layout.size(2))
    shards["w2"][0] = shards["w2"][2]  # the last, shorter shard in shard 0's place
    result = sharded_step(OuterStep(vectors(1, numel, seed=5)[0]), layout, shards)
    assert result.rejected["w1"].code == "bad-scale" and result.rejected["w2"].code == "wrong-numel"
    assert result.accepted == ["w0", "w3"]
    assert np.isfinite(result.theta).all()


def test_sharded_training_with_the_mean_is_allgather_bit_for_bit():
    task = get_task("synthetic-lm", {"alphabet": 8, "order": 1, "context": 16, "n_layer": 1, "n_head": 2,
                                     "d_model": 16, "eval_sequences": 32})
    config = DiLoCoConfig(workers=3, rounds=2, inner_steps=2, inner=InnerConfig(batch_size=4), aggregator="mean")
    allgather = simulate_diloco(task, config)
    sharded = simulate_diloco(task, DiLoCoConfig(**{**config.__dict__, "exchange": "sharded", "shard_values": 1024}))
    assert np.array_equal(allgather.theta, sharded.theta)
    assert sharded.bytes_per_worker > allgather.bytes_per_worker  # a header and a zstd frame per shard
    with pytest.raises(ValueError, match="exchange"):
        DiLoCoConfig(exchange="gossip")


# -- committees ---------------------------------------------------------------------------------------

def test_committees_are_distinct_balanced_drawn_alike_and_new_with_each_seed():
    electorate = frozenset(bytes([i]) * 32 for i in range(10))
    committees = shard_committees(4, b"seed", electorate, shards=10, size=3)
    assert committees == shard_committees(4, b"seed", set(electorate), shards=10, size=3)
    assert all(len(set(c)) == 3 and set(c) <= electorate for c in committees)
    assert set(Counter(m for c in committees for m in c).values()) == {3}  # 30 seats over 10 members
    assert committees != shard_committees(4, b"other", electorate, shards=10, size=3)
    assert committees != shard_committees(5, b"seed", electorate, shards=10, size=3)
    small = shard_committees(1, b"seed", frozenset(list(electorate)[:2]), shards=3, size=5)
    assert all(len(set(c)) == 2 for c in small)


# -- the committee plan -----------------------------------------------------------------------------

def test_byzantine_bound_is_the_largest_count_strictly_below_the_fraction():
    assert [byzantine_bound(n, 1 / 3) for n in (3, 4, 8, 9, 10, 64)] == [0, 1, 2, 2, 3, 21]
    assert byzantine_bound(10, 0.2) == 1 and byzantine_bound(11, 0.2) == 2


def test_small_groups_get_a_committee_that_always_holds_an_honest_member():
    for members in (4, 8, 16):
        chosen = plan(members)
        assert chosen.committee == chosen.byzantine + 1 and chosen.verified == 0
        assert chosen.miss_probability == 0.0


@pytest.mark.parametrize("members", [64, 256, 1000])
def test_the_plan_meets_the_target_and_nothing_cheaper_does(members):
    chosen = plan(members)
    assert chosen.miss_probability <= 1e-6
    f, shards = chosen.byzantine, chosen.shards
    for k in range(1, chosen.committee + 1):
        for v in range(shards + 1):
            cheaper = k + v * members / shards < chosen.payloads_fetched
            if cheaper:
                assert miss_probability(members, f, shards, k, v) > 1e-6


def test_the_bound_matches_counting_for_a_tiny_group():
    # 6 members, 2 Byzantine, 1 shard, committees of 2: C(2,2)/C(6,2) = 1/15, nobody verifies.
    assert miss_probability(6, 2, 1, 2, 0) == pytest.approx(1 / 15)
    # One honest verifier in four checks the single shard: nothing can stand.
    assert miss_probability(6, 2, 1, 2, 1) == 0.0
