"""DiLoCo simulation, the DDP baseline, the inner loop and the flat parameter vector."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locomesh.training.simulation import DDPConfig, DiLoCoConfig, simulate_ddp, simulate_diloco
from locomesh.training.flat import flatten, param_count, unflatten_into
from locomesh.training.inner import InnerConfig, Worker
from locomesh.training.outer import params_hash
from locomesh.training.tasks import get_task

# Order 1 over 8 symbols: a few dozen steps of a one-layer model already learn something.
TINY_TASK = {"alphabet": 8, "order": 1, "context": 16, "n_layer": 1, "n_head": 2, "d_model": 32,
             "eval_sequences": 64}
INNER = InnerConfig(lr=1e-2, batch_size=8)


@pytest.fixture(scope="module")
def task():
    torch.set_num_threads(1)
    return get_task("synthetic-lm", TINY_TASK)


def _initial_loss(task) -> float:
    return task.evaluate(task.build_model(0))["loss"]


def test_flatten_unflatten_round_trip_is_exact(task):
    model = task.build_model(0)
    vector = flatten(model)
    assert vector.dtype == np.float32 and vector.shape == (param_count(model),)
    # The tied head is one tensor: counted once.
    assert param_count(model) == sum(p.numel() for p in set(model.parameters()))
    changed = np.random.default_rng(0).standard_normal(vector.size).astype(np.float32)
    unflatten_into(model, changed)
    assert np.array_equal(flatten(model), changed)
    assert np.array_equal(flatten(model).view(np.uint32), changed.view(np.uint32))
    with pytest.raises(ValueError, match="float32 vector"):
        unflatten_into(model, changed[:-1])
    with pytest.raises(ValueError, match="float32 vector"):
        unflatten_into(model, changed.astype(np.float64))


def test_inner_schedule():
    config = InnerConfig(lr=1.0, warmup_steps=4, decay_steps=14, min_lr_ratio=0.1)
    assert [config.lr_at(step) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert config.lr_at(9) == pytest.approx(0.55)
    assert config.lr_at(14) == pytest.approx(0.1) and config.lr_at(100) == pytest.approx(0.1)


def test_worker_returns_pseudo_gradient_and_keeps_adamw_state(task):
    worker = Worker(task, model_seed=0, run_seed=0, peer_index=1, config=INNER)
    theta = flatten(worker.model)
    result = worker.run_round(theta, steps=5)
    assert result.steps == 5 and result.delta.dtype == np.float32
    assert np.array_equal(result.delta, np.subtract(theta, flatten(worker.model), dtype=np.float32))
    worker.run_round(theta, steps=3)
    states = worker.optimizer.state.values()
    assert {int(state["step"]) for state in states} == {8}  # not reset between rounds
    assert worker.run_round(theta, seconds=0.0).steps == 1  # a time budget still takes one step
    with pytest.raises(ValueError):
        worker.run_round(theta)


def test_diloco_lowers_eval_loss_and_is_deterministic(task):
    config = DiLoCoConfig(workers=3, rounds=3, inner_steps=10, inner=INNER, codec="int8")
    seen = []
    result = simulate_diloco(task, config, on_round=seen.append)
    assert [record.round_index for record in seen] == [1, 2, 3]
    assert result.loss < _initial_loss(task) - 0.2
    assert seen[-1].eval_loss == result.loss and result.floor == task.floor()
    assert result.bytes_per_worker == seen[-1].bytes_per_worker > 0
    # int8 with 1024-element blocks: about a byte per parameter per round, far below fp32.
    assert result.bytes_per_worker < 3 * 1.1 * result.theta.size
    assert result.samples == 3 * 3 * 10 * 8
    again = simulate_diloco(task, config)
    assert params_hash(again.theta) == params_hash(result.theta)


def test_ddp_baseline_lowers_eval_loss_and_counts_bytes(task):
    result = simulate_ddp(task, DDPConfig(workers=3, steps=30, inner=INNER, eval_every=10))
    assert result.loss < _initial_loss(task) - 0.2
    assert [record.round_index for record in result.history] == [10, 20, 30]
    assert result.bytes_per_worker == 4 * result.theta.size * 30
    assert result.samples == 3 * 30 * 8


def test_byzantine_workers_must_be_a_strict_subset(task):
    from locomesh.training.attacks import zero

    config = DiLoCoConfig(workers=2, rounds=1, inner_steps=1, inner=INNER)
    with pytest.raises(ValueError, match="strict subset"):
        simulate_diloco(task, config, byzantine={0: zero, 1: zero})
    with pytest.raises(ValueError, match="strict subset"):
        simulate_diloco(task, config, byzantine={5: zero})


def test_both_methods_start_from_a_warm_start(task):
    warm = simulate_ddp(task, DDPConfig(workers=3, steps=30, inner=INNER, run_seed=1)).theta
    # No training: each returns exactly the θ it was given, not the model seed's initialisation.
    idle_diloco = simulate_diloco(
        task, DiLoCoConfig(workers=2, rounds=0, inner=INNER), initial_theta=warm
    )
    idle_ddp = simulate_ddp(task, DDPConfig(workers=2, steps=0, inner=INNER), initial_theta=warm)
    assert params_hash(idle_diloco.theta) == params_hash(idle_ddp.theta) == params_hash(warm)
    # One short round from the warm θ keeps its progress; from scratch it is still near the start.
    config = DiLoCoConfig(workers=2, rounds=1, inner_steps=2, inner=INNER)
    from_warm = simulate_diloco(task, config, initial_theta=warm)
    assert from_warm.loss < simulate_diloco(task, config).loss - 0.1
    with pytest.raises(ValueError, match="parameters"):
        simulate_ddp(task, DDPConfig(workers=2, steps=1, inner=INNER), initial_theta=warm[:-1])
    with pytest.raises(ValueError, match="parameters"):
        simulate_diloco(task, config, initial_theta=warm[:-1])
