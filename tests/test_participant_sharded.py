"""A participant's share of a sharded round (training/participant.py, training/participant_shards.py,
netsim/sim_participant.py): framed shard payloads, one shard aggregated at a time, the results
applied; the same state as the peer that computed every shard, and as allgather where the
aggregator is coordinate-wise."""

from __future__ import annotations

import numpy as np
import pytest

from locomesh.netsim.sim_participant import JUNK_MARK, PAYLOAD_MARK, SimCost, SimParticipant
from locomesh.training.codec import CodecError, max_payload_size, split_payload
from locomesh.training.outer import EmptyRoundError
from locomesh.training.adversary import AttackingParticipant
from locomesh.training.participant import Participant, ParticipantError, RoundSettings
from locomesh.training.run_settings import RunSettingsError, default_hparams
from locomesh.training.shards import (
    DEFAULT_SHARD_VALUES, ShardLayout, frame_shards, shard_result_hash, sharded_step, unframe, unframe_shards,
)

RUN = b"\x07" * 32
HPARAMS = {"inner_steps": 2, "batch_size": 4, "shard_values": 4096}  # 15,328 values: 4 shards
BODY = {"task": "synthetic-lm", "task_config": {"d_model": 32, "n_layer": 1, "n_head": 2}, "seed": 3, "hparams": HPARAMS}
KEYS = [bytes([index + 1]) * 32 for index in range(3)]


def peers(count: int = 1, **hparams) -> list[Participant]:
    body = {**BODY, "hparams": {**HPARAMS, **hparams}}
    return [Participant.for_run(body, KEYS[0]) for _ in range(count)]


def trainers(**hparams) -> list[Participant]:
    body = {**BODY, "hparams": {**HPARAMS, **hparams}}
    return [Participant.for_run(body, key) for key in KEYS]


def by_committee(peer, payloads: dict[bytes, bytes]):
    """What the committees compute between them and every peer applies: each shard aggregated
    alone (here by `peer`), its result carried as bytes, then every result applied."""
    framed = {author: peer.sharded_payload(payload).shards for author, payload in payloads.items()}
    results, accepted, rejected = [], None, {}
    for index in range(peer.shard_layout().count):
        values, shard_accepted, refused = peer.aggregate_shard(index, {a: s[index] for a, s in framed.items()})
        data = peer.result_to_bytes(values)
        assert len(data) == peer.result_size(index)
        results.append(peer.result_from_bytes(index, data))
        accepted = set(shard_accepted) if accepted is None else accepted & set(shard_accepted)
        rejected.update(refused)
    return peer.apply_shards(results, sorted(accepted - set(rejected)), rejected)


# -- the frame --------------------------------------------------------------------------------------

def test_a_frame_holds_the_shards_in_order_and_refuses_anything_off_its_limits():
    shards = [b"abc", b"", b"defgh"]
    data = frame_shards(shards)
    assert unframe(data, [3, 4, 5]) == shards and unframe(bytearray(data), [9, 9, 9]) == shards
    bad = {
        "fewer": frame_shards(shards[:2]),
        "more": frame_shards([*shards, b"x"]),
        "too long a shard": frame_shards([b"abcd", b"", b"defgh"]),
        "truncated": data[:-1],
        "trailing": data + b"\0",
        "no header": data[:5],
        "empty": b"",
        "lying length": data[:4] + (1 << 31).to_bytes(4, "big") + data[8:],
        "not bytes": "abc",
    }
    for what, frame in bad.items():
        with pytest.raises(CodecError) as error:
            unframe(frame, [3, 4, 5])
        assert error.value.code == "bad-frame", what


def test_a_frame_of_a_layout_is_bounded_by_its_codec():
    layout = ShardLayout(5000, 2048, 1024)
    shards = [b"\1" * 10, b"\2" * 20, b"\3" * 30]
    assert unframe_shards(frame_shards(shards), layout, codec="int8") == shards
    with pytest.raises(CodecError, match="bad-frame"):  # more than int8 can make of the short last shard
        unframe_shards(frame_shards([b"", b"", b"\0" * 4000]), layout, codec="int8")
    assert unframe_shards(frame_shards([b"", b"", b"\0" * 3616]), layout, codec="fp32")[2] == b"\0" * 3616


# -- the run setting --------------------------------------------------------------------------------

def test_shard_values_is_a_run_setting_with_a_default_and_a_range():
    assert default_hparams()["shard_values"] == DEFAULT_SHARD_VALUES == RoundSettings().shard_values
    assert RoundSettings.from_hparams({"shard_values": 1024}).shard_values == 1024
    for bad in (1023, 1 << 25, 4096.0, True):
        with pytest.raises(RunSettingsError, match="shard_values"):
            RoundSettings.from_hparams({"shard_values": bad})


# -- the real participant ---------------------------------------------------------------------------

def test_a_sharded_payload_is_the_whole_payload_cut_at_the_layout_and_framed():
    whole, sharded = trainers(), trainers()
    layout = whole[0].shard_layout()
    assert layout == ShardLayout(whole[0].outer.numel, 4096, 1024) and layout.count == 4
    for _ in range(2):  # the second round carries the error-feedback residual
        a, b = whole[0].train(), sharded[0].train(sharded=True)
        assert sharded[0].sharded_payload(b.payload).shards == split_payload(a.payload, layout.numel, layout.bounds)
        assert len(b.payload) <= sharded[0].max_sharded_payload_size()
    limits = [sharded[0].shard_limit(i) for i in range(4)]
    assert limits == [max_payload_size("int8", layout.size(i), 1024) for i in range(4)]
    assert sharded[0].max_sharded_payload_size() == 4 * (1 + 4) + sum(limits)  # the count and four lengths
    sharded[0].payload_limits(RUN, 1, sharded[0].max_sharded_payload_size(), sharded=True)
    with pytest.raises(ParticipantError):
        sharded[0].payload_limits(RUN, 1, sharded[0].max_sharded_payload_size() + 1, sharded=True)
    with pytest.raises(ParticipantError):  # an allgather payload keeps its own, smaller bound
        sharded[0].payload_limits(RUN, 1, sharded[0].max_sharded_payload_size())


def test_shards_aggregated_one_at_a_time_give_the_state_of_the_step_over_all_of_them():
    """CenteredClip (not coordinate-wise: the same bits only because each shard is clipped alone in
    both) over two rounds, so the second centres on the first's assembled aggregate."""
    contributors = trainers()
    committee, reference = peers(2)
    layout = reference.shard_layout()
    for _ in range(2):
        before = reference.state_hash()
        payloads = {key: p.train(sharded=True).payload for key, p in zip(KEYS, contributors)}
        assembled = by_committee(committee, payloads)
        alone = sharded_step(reference.outer, layout, {a: reference.sharded_payload(p).shards for a, p in payloads.items()},
                             bucket_seed=reference.round.to_bytes(8, "big"))
        reference.round += 1
        assert committee.state_hash() == reference.state_hash() != before and committee.round == reference.round
        assert assembled.accepted == alone.accepted == sorted(KEYS)
        for p in contributors:  # the next round trains from θ_{r+1}
            by_committee(p, payloads)


@pytest.mark.parametrize("codec", ["int8", "int4", "fp32"])
def test_sharded_with_the_mean_is_allgather_bit_for_bit(codec):
    """As tests/test_sharded_exchange.py proves for simulate_diloco: a coordinate-wise aggregator
    over shard payloads that decode to the whole payload's values gives the same state."""
    allgather, sharded = trainers(aggregator="mean", codec=codec), trainers(aggregator="mean", codec=codec)
    for _ in range(2):
        payloads = {key: p.train().payload for key, p in zip(KEYS, allgather)}
        framed = {key: p.train(sharded=True).payload for key, p in zip(KEYS, sharded)}
        hashes = {p.aggregate(payloads).params_hash for p in allgather}
        hashes |= {by_committee(p, framed).params_hash for p in sharded}
        assert len(hashes) == 1
        assert len({p.state_hash() for p in allgather + sharded}) == 1


def test_a_bad_shard_is_rejected_with_its_author_and_a_result_is_checked_as_it_arrives():
    contributors = trainers()
    peer = peers()[0]
    payloads = {key: p.train(sharded=True).payload for key, p in zip(KEYS, contributors)}
    shards = {key: peer.sharded_payload(payload).shards[1] for key, payload in payloads.items()}
    shards[KEYS[2]] = shards[KEYS[2]][:-3]
    values, accepted, rejected = peer.aggregate_shard(1, shards)
    assert accepted == KEYS[:2] and set(rejected) == {KEYS[2]} and values.shape == (4096,)
    assert peer.result_hash(1, values) == shard_result_hash(1, 1, values)  # the round being aggregated: r + 1
    data = peer.result_to_bytes(values)
    for bad in (data[:-4], data + b"\0" * 4, np.full(4096, np.nan, dtype="<f4").tobytes()):
        with pytest.raises(ValueError):
            peer.result_from_bytes(1, bad)
    for index in (-1, 4, True):
        with pytest.raises(ValueError):
            peer.aggregate_shard(index, shards)
        with pytest.raises(ValueError):
            peer.result_size(index)
    with pytest.raises(CodecError, match="bad-frame"):
        peer.sharded_payload(payloads[KEYS[0]][:-1])


def test_applying_nothing_or_misfit_results_leaves_the_state_as_it_was():
    peer = peers()[0]
    layout, before = peer.shard_layout(), peer.state_hash()
    results = [np.zeros(layout.size(i), dtype=np.float32) for i in range(layout.count)]
    with pytest.raises(EmptyRoundError):
        peer.apply_shards(results, [], {KEYS[1]: CodecError("bad-scale", "x")})
    for misfit in (results[:-1], [*results[:-1], np.zeros(3, dtype=np.float32)],
                   [*results[:-1], results[-1].astype(np.float64)],
                   [*results[:-1], np.full(layout.size(layout.count - 1), np.inf, dtype=np.float32)]):
        with pytest.raises(ValueError):
            peer.apply_shards(misfit, [KEYS[0]], {})
    assert peer.state_hash() == before and peer.round == 0


def test_a_test_adversary_attacks_in_allgather_exchange_only():
    attacker = AttackingParticipant.for_run(BODY, KEYS[0], "sign_flip_x100")
    with pytest.raises(ParticipantError, match="allgather"):
        attacker.train(sharded=True)


# -- the simulated participant ----------------------------------------------------------------------

SIM_BODY = {"seed": 5, "hparams": {"inner_steps": 2}}
SIM_COST = SimCost(payload_bytes=1000, state_bytes=256, aggregate_seconds=2.0, shards=4)


def test_sim_participants_applying_each_others_shard_results_reach_one_state_without_the_junk():
    keys = [bytes([i + 1]) * 32 for i in range(5)]
    sims = [SimParticipant(SIM_BODY, key, SIM_COST, byzantine=index == 4) for index, key in enumerate(keys)]
    layout = sims[0].shard_layout()
    assert layout.count == 4 and [layout.size(i) for i in range(4)] == [250] * 4
    for _ in range(2):
        payloads = {key: sim.train(sharded=True).payload for key, sim in zip(keys, sims)}
        assert all(len(p) <= sims[0].max_sharded_payload_size() for p in payloads.values())
        sims[0].payload_limits(RUN, 1, len(payloads[keys[0]]), sharded=True)
        framed = {key: sims[0].sharded_payload(payload).shards for key, payload in payloads.items()}
        assert {pieces[i][0] for pieces in framed.values() for i in range(4)} == {PAYLOAD_MARK, JUNK_MARK}
        # Member i computes shard i; everyone applies the four results, fetched as bytes.
        results, hashes = [], set()
        for index in range(4):
            member = sims[index]
            values, accepted, rejected = member.aggregate_shard(index, {k: p[index] for k, p in framed.items()})
            assert accepted == sorted(keys[:4]) and set(rejected) == {keys[4]}
            assert member.take_pending_seconds() == pytest.approx(0.5)
            hashes.add(member.result_hash(index, values))
            results.append(sims[4].result_from_bytes(index, member.result_to_bytes(values)))
        assert len(hashes) == 4
        for sim in sims:
            sim.apply_shards(results, keys[:4], {keys[4]: CodecError("bad-shard", "junk")})
        assert len({sim.state_hash() for sim in sims}) == 1
    # The junk author's pieces change nothing: the same results without it.
    without = {k: p for k, p in framed.items() if k != keys[4]}
    assert sims[0].aggregate_shard(2, {k: p[2] for k, p in without.items()})[0].tobytes() == results[2].tobytes()


def test_a_sim_participant_refuses_a_shard_with_no_valid_piece_and_misfit_frames_and_results():
    sim = SimParticipant(SIM_BODY, KEYS[0], SIM_COST, byzantine=True)
    pieces = sim.sharded_payload(sim.train(sharded=True).payload).shards
    with pytest.raises(ValueError, match="none of 1"):
        sim.aggregate_shard(0, {KEYS[0]: pieces[0]})
    with pytest.raises(CodecError, match="bad-frame"):
        sim.sharded_payload(frame_shards(pieces[:3]))
    with pytest.raises(ValueError):
        sim.result_from_bytes(0, b"\0" * 31)
    with pytest.raises(ValueError):
        sim.apply_shards([], [], {})
    with pytest.raises(ParticipantError):
        sim.payload_limits(RUN, 1, len(frame_shards(pieces)))  # a framed size is no allgather payload's
    assert sim.result_size(3) == 4 * 250 and sim.shard_limit(3) == 250 and sim.round == 0
