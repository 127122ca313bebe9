"""The outer step gives bit-identical θ under every CPU setting we can switch; naive torch does not.

The payloads are made once, here, and written to files; each subprocess decodes,
validates, aggregates and applies them under one setting (torch's kernel
capability, NumPy's SIMD dispatch, the thread count) and prints the hashes. All
must agree. The control runs the naive torch versions of the same arithmetic in
the same subprocesses, to show the settings really change bits on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from locomesh.training.codec import Encoder, non_finite_payload
from locomesh.training.outer import EmptyRoundError, OuterStep, SpareVectors, params_hash
from locomesh.training.reference_hashes import (  # the vectors doctor checks a CPU with, too
    AGGREGATORS, AUTHORS, CAP, REFERENCE_HASHES, ROUNDS, write_round_files,
)

PROBE = r"""
import json, pathlib, sys
import numpy as np
from locomesh.training.outer import EmptyRoundError, OuterStep, SpareVectors, params_hash

folder = pathlib.Path(sys.argv[1])
spec = json.loads((folder / "spec.json").read_text())
theta = np.fromfile(folder / "theta.f32", dtype="<f4").astype(np.float32)
exact = {}
for name, options in spec["aggregators"]:
    step = OuterStep(theta, aggregator=name, max_update_norm=spec["cap"], **options)
    hashes = []
    for r in range(spec["rounds"]):
        payloads = {a.encode(): (folder / f"{r}-{a}.bin").read_bytes() for a in spec["authors"]}
        result = step.step(payloads)
        hashes.append([result.params_hash, sorted(a.decode() for a in result.rejected), result.capped])
    exact[name] = hashes

# Sharded exchange: the default aggregator shard by shard, the shards assembled (training/shards.py).
from locomesh.training.codec import split_payload
from locomesh.training.shards import ShardLayout, sharded_step
layout = ShardLayout(theta.size, spec["shard_values"])
step = OuterStep(theta, max_update_norm=spec["cap"])
hashes = []
for r in range(spec["rounds"]):
    payloads = {a.encode(): split_payload((folder / f"{r}-{a}.bin").read_bytes(), theta.size, layout.bounds)
                for a in spec["authors"]}
    result = sharded_step(step, layout, payloads)
    hashes.append([result.params_hash, sorted(a.decode() for a in result.rejected), result.capped])
exact["centered_clip@sharded"] = hashes

# Peer momentum: every author's momentum, aggregated (training/outer.py).
step = OuterStep(theta, max_update_norm=spec["cap"], peer_momentum=True)
hashes = []
for r in range(spec["rounds"]):
    payloads = {a.encode(): (folder / f"{r}-{a}.bin").read_bytes() for a in spec["authors"]}
    result = step.step(payloads)
    hashes.append([result.params_hash, sorted(a.decode() for a in result.rejected), result.capped])
exact["centered_clip+peer_momentum"] = hashes

import hashlib, torch
def digest(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
deltas = [np.fromfile(folder / f"delta-{a}.f32", dtype="<f4") for a in spec["authors"]]
# 16 rows: torch's reductions over rows switch kernels with the row count; 16 takes the one that
# depends on the CPU capability here. (Inputs are made with NumPy: torch.randn itself changes with it.)
stack = torch.from_numpy(np.stack([deltas[i % len(deltas)] * np.float32(1 + i / 16) for i in range(16)]))
weights = torch.linspace(-1, 1, 16)
naive = {
    "weighted_row_sum": digest((stack * weights[:, None]).sum(0)),
    "matvec": digest(stack.T.contiguous() @ weights),
    "sum_of_everything": digest(stack.sum().reshape(1)),
    "dot": digest(torch.dot(stack[0], stack[1]).reshape(1)),
}
print(json.dumps({"exact": exact, "naive": naive}))
"""


def simd_features() -> str:
    """NumPy's dispatched SIMD targets that this CPU has (the baseline cannot be switched off)."""
    core = np._core._multiarray_umath
    return " ".join(name for name in core.__cpu_dispatch__ if core.__cpu_features__.get(name))


SETTINGS = {
    "torch default, 1 thread": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
    "torch avx2, 1 thread": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"},
    "torch avx2, 2 threads": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"},
    "numpy without SIMD dispatch, 2 threads": {"NPY_DISABLE_CPU_FEATURES": simd_features(), "OMP_NUM_THREADS": "2"},
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outer-determinism")
    write_round_files(folder)
    results = {}
    for label, changes in SETTINGS.items():
        env = {key: value for key, value in os.environ.items() if key not in ("ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES")}
        env.update(changes)
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(folder)], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{label}: {done.stderr[-2000:]}"
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return folder, results


def test_outer_step_is_bit_identical_under_every_setting(outcomes):
    _, results = outcomes
    reference = results[next(iter(SETTINGS))]["exact"]
    assert set(reference) == {name for name, _ in AGGREGATORS} | {"centered_clip@sharded", "centered_clip+peer_momentum"}
    for label, result in results.items():
        assert result["exact"] == reference, f"{label} computed other bits"


def test_every_setting_computes_the_written_reference_hashes(outcomes):
    """The hashes `locomesh doctor` compares a machine against are the ones every setting computes."""
    _, results = outcomes
    for label, result in results.items():
        for name, _ in AGGREGATORS:
            assert [row[0] for row in result["exact"][name]] == REFERENCE_HASHES[name], f"{label}: {name}"


def test_subprocesses_agree_with_this_process(outcomes):
    """The probe really ran the outer step: the same hashes in-process, the bad payload rejected, the cap hit."""
    folder, results = outcomes
    reference = results[next(iter(SETTINGS))]["exact"]
    theta = np.fromfile(folder / "theta.f32", dtype="<f4").astype(np.float32)
    step = OuterStep(theta, aggregator="centered_clip", max_update_norm=CAP)
    authors = [f"author-{i}" for i in range(AUTHORS)]
    mine = []
    for r in range(ROUNDS):
        result = step.step({a.encode(): (folder / f"{r}-{a}.bin").read_bytes() for a in authors})
        mine.append([result.params_hash, sorted(a.decode() for a in result.rejected), result.capped])
    assert mine == reference["centered_clip"]
    assert mine[1][1] == ["author-0"] and mine[0][2]
    assert len({hashes[-1][0] for hashes in reference.values()}) == len(AGGREGATORS) + 2  # they do differ
    assert reference["centered_clip@sharded"][1][1] == ["author-0"]  # the NaN payload fails in its shards too


def test_control_naive_torch_changes_bits_under_the_same_settings(outcomes):
    """Teeth: the same settings make plain torch arithmetic give other bits on this machine."""
    _, results = outcomes
    differing = sorted(
        key for key in results[next(iter(SETTINGS))]["naive"] if len({r["naive"][key] for r in results.values()}) > 1
    )
    if not differing:
        pytest.skip("on this CPU naive torch arithmetic gave the same bits under every setting; the control shows nothing here")
    assert differing  # here: matvec and weighted_row_sum (capability), dot and sum_of_everything (threads)


# -- what one step computes ----------------------------------------------------------


def fp32_payloads(deltas: dict[bytes, np.ndarray]) -> dict[bytes, bytes]:
    return {author: Encoder("fp32").encode(delta) for author, delta in deltas.items()}


def test_nesterov_step_matches_the_formula():
    rng = np.random.default_rng(5)
    theta = rng.standard_normal(1000).astype(np.float32)
    step = OuterStep(theta, codec="fp32", aggregator="mean", lr=0.7, momentum=0.9)
    theta_ref, momentum_ref = theta.astype(np.float64), np.zeros(1000)
    for _ in range(3):
        deltas = {bytes([i]): rng.standard_normal(1000).astype(np.float32) for i in range(3)}
        result = step.step(fp32_payloads(deltas))
        g = np.mean([d.astype(np.float64) for d in deltas.values()], axis=0)
        momentum_ref = 0.9 * momentum_ref + g
        theta_ref = theta_ref - 0.7 * (g + 0.9 * momentum_ref)
        assert np.allclose(result.theta, theta_ref, rtol=1e-5, atol=1e-5)
        assert result.params_hash == params_hash(result.theta) and result.accepted == sorted(deltas)


def test_plain_momentum_and_sign_convention():
    """Δ = θ_r − θ_i: the step moves θ towards the workers' models."""
    theta = np.ones(64, np.float32)
    step = OuterStep(theta, codec="fp32", aggregator="mean", lr=1.0, momentum=0.0, nesterov=False)
    result = step.step(fp32_payloads({b"a": np.full(64, 0.25, np.float32)}))
    assert np.array_equal(result.theta, np.full(64, 0.75, np.float32))


def test_cap_scales_the_aggregate_down_to_the_cap():
    theta = np.zeros(10_000, np.float32)
    step = OuterStep(theta, codec="fp32", aggregator="mean", lr=1.0, momentum=0.0, max_update_norm=2.0)
    result = step.step(fp32_payloads({b"a": np.full(10_000, 0.5, np.float32)}))  # ‖g‖ = 50
    assert result.capped and result.aggregate_norm == pytest.approx(50.0)
    assert np.linalg.norm(result.theta.astype(np.float64)) == pytest.approx(2.0, rel=1e-6)


def test_bad_payloads_are_reported_not_raised_and_an_empty_round_changes_nothing():
    theta = np.arange(300, dtype=np.float32)
    step = OuterStep(theta, aggregator="mean")
    good = Encoder("int8").encode(np.ones(300, np.float32))
    result = step.step({b"good": good, b"nan": non_finite_payload("int8", float("nan"), 300), b"junk": b"\x00"})
    assert result.accepted == [b"good"] and sorted(result.rejected) == [b"junk", b"nan"]
    assert result.rejected[b"nan"].code == "bad-scale"
    before = step.theta.copy(), step.momentum.copy()
    with pytest.raises(EmptyRoundError) as caught:
        step.step({b"junk": b"\x00", b"short": good[:-3]})
    assert sorted(caught.value.rejected) == [b"junk", b"short"]
    assert np.array_equal(step.theta, before[0]) and np.array_equal(step.momentum, before[1])


def test_options_reach_the_aggregator_and_the_config_is_checked():
    step = OuterStep(np.zeros(8, np.float32), aggregator="trimmed_mean", beta=0.25)
    assert step.config.aggregator_options == {"beta": 0.25}
    with pytest.raises(ValueError):
        OuterStep(np.zeros(8, np.float32), aggregator="nope")
    with pytest.raises(ValueError):
        OuterStep(np.zeros(8, np.float64))


def test_krum_counts_rejected_payloads_against_f():
    """Two NaN payloads out of nine with f=3: seven remain, and Krum needs 2·1 + 3 = 5, not 9."""
    rng = np.random.default_rng(3)
    step = OuterStep(np.zeros(256, np.float32), aggregator="krum", f=3)
    payloads = {bytes([i]): Encoder("int8").encode(rng.standard_normal(256).astype(np.float32)) for i in range(7)}
    payloads |= {b"nan1": non_finite_payload("int8", float("nan"), 256), b"nan2": non_finite_payload("int8", float("inf"), 256)}
    result = step.step(payloads)
    assert sorted(result.rejected) == [b"nan1", b"nan2"] and len(result.accepted) == 7
    assert step.config.aggregator_options == {"f": 3}  # the configured bound is unchanged for later rounds


def test_a_spare_vector_is_reused_only_once_nothing_else_holds_it():
    spares = SpareVectors()
    held, viewed = np.zeros(16, np.float32), np.zeros(16, np.float32)
    view = viewed[4:]
    spares.retire(held, viewed, view)  # a view owns no memory: never kept
    viewed_id = id(viewed)
    del viewed  # still reachable through view.base
    taken = spares.take(16)
    assert taken is not held and id(taken) != viewed_id  # a new vector: both retired ones are in use
    del view
    assert id(spares.take(16)) == viewed_id  # its last holder is gone
    assert spares.take(16) is not held  # the test still holds it
    held_id = id(held)
    del held
    assert id(spares.take(16)) == held_id
    assert spares.take(8).size == 8  # no spare of that size: a new vector


def test_reusing_replaced_arrays_never_changes_a_state_someone_holds():
    """Snapshots of θ, momentum and the previous aggregate taken after each step keep their
    bits through later steps (which write into replaced arrays once they are free), and the
    steps give the same θ as steps that never reuse an array."""
    rng = np.random.default_rng(11)
    theta = rng.standard_normal(5_000).astype(np.float32)
    reusing, fresh = OuterStep(theta), OuterStep(theta)
    fresh._spares.KEEP = 0  # retires nothing: every array is new
    held: list[tuple[np.ndarray, ...]] = []
    for round_number in range(6):
        payloads = {bytes([i]): Encoder("int8").encode(rng.standard_normal(5_000).astype(np.float32)) for i in range(4)}
        a, b = reusing.step(payloads), fresh.step(payloads)
        assert a.params_hash == b.params_hash
        assert np.array_equal(reusing.momentum, fresh.momentum) and np.array_equal(reusing.previous, fresh.previous)
        if round_number % 2 == 0:  # a state being stored while the next rounds run
            state = (reusing.theta, reusing.momentum, reusing.previous)
            held.append((state, tuple(params_hash(v) for v in state)))
    for state, hashes in held:
        assert tuple(params_hash(v) for v in state) == hashes
    assert len(reusing._spares._vectors) > 0


def test_a_state_nobody_holds_is_updated_in_place_with_the_same_bits():
    """θ and the momentum are written in place when no one else holds them (a state costs four
    vectors, not six), and the bits are those of a step that writes new arrays."""
    rng = np.random.default_rng(12)
    theta = rng.standard_normal(5_000).astype(np.float32)
    in_place, copying = OuterStep(theta), OuterStep(theta)
    for _ in range(4):
        payloads = {bytes([i]): Encoder("int8").encode(rng.standard_normal(5_000).astype(np.float32)) for i in range(4)}
        arrays = id(in_place.theta), id(in_place.momentum)
        held = copying.theta, copying.momentum  # a snapshot being stored: never written again
        held_hashes = [params_hash(v) for v in held]
        new_hash = in_place.step(payloads).params_hash
        assert (id(in_place.theta), id(in_place.momentum)) == arrays
        assert copying.step(payloads).params_hash == new_hash
        assert copying.theta is not held[0] and [params_hash(v) for v in held] == held_hashes
        assert np.array_equal(in_place.momentum, copying.momentum)
        del held
