"""Tasks: the Markov source's exact floor, deterministic shards, text-lm, entry points, errors."""

from __future__ import annotations

import itertools
import sys
import textwrap

import numpy as np
import pytest
import torch

from locomesh.training.flat import flatten
from locomesh.training.tasks import MarkovSource, SyntheticLM, Task, TaskError, get_task

TINY = {"context": 8, "n_layer": 1, "n_head": 2, "d_model": 16, "eval_sequences": 8}


def _sequence_probability(source: MarkovSource, sequence: tuple[int, ...]) -> float:
    """P(sequence) from first principles: stationary start state, then the transitions."""
    state = 0
    for symbol in sequence[: source.order]:
        state = state * source.alphabet + symbol
    probability = source.stationary[state]
    for symbol in sequence[source.order :]:
        probability *= source.transitions[state, symbol]
        state = source.next_state(state, symbol)
    return float(probability)


def test_window_floor_matches_brute_force_enumeration():
    source = MarkovSource(alphabet=3, order=2, concentration=0.3, seed=5)
    length = 5  # predict symbols 1..4 of every 5-symbol sequence
    joint_entropy = 0.0
    for sequence in itertools.product(range(3), repeat=length):
        p = _sequence_probability(source, sequence)
        joint_entropy -= p * np.log(p)
    # X_0 is the older digit of the stationary start state.
    first_marginal = np.bincount(np.arange(9) // 3, weights=source.stationary, minlength=3)
    first_symbol = -first_marginal @ np.log(first_marginal)
    # H(X_1..X_4 | X_0) / 4 is the best mean loss over the 4 predicted positions.
    assert source.window_floor(length - 1) == pytest.approx((joint_entropy - first_symbol) / 4, rel=1e-9)


def test_stationary_distribution_is_fixed_point_and_entropy_rate_matches_samples():
    source = MarkovSource(alphabet=4, order=2, concentration=0.5, seed=1)
    pi = source.stationary
    moved = np.zeros_like(pi)
    for state in range(source.num_states):
        for symbol in range(source.alphabet):
            moved[source.next_state(state, symbol)] += pi[state] * source.transitions[state, symbol]
    np.testing.assert_allclose(moved, pi, atol=1e-12)
    # Empirical: mean −log P(next | state) over sampled text converges to the entropy rate.
    sequences = source.sample(np.random.default_rng(0), count=400, length=100)
    states = sequences[:, 0] * 4 + sequences[:, 1]
    log_losses = []
    for position in range(2, 100):
        symbols = sequences[:, position]
        log_losses.append(-np.log(source.transitions[states, symbols]))
        states = source.next_state(states, symbols)
    assert np.mean(log_losses) == pytest.approx(source.entropy_rate(), abs=0.02)


def test_default_task_floor_is_below_uniform_and_model_is_small():
    task = get_task()
    assert isinstance(task, SyntheticLM) and isinstance(task, Task)
    assert task.entropy_rate() < task.floor() < np.log(task.config["alphabet"])
    assert 100_000 <= flatten(task.build_model(0)).size <= 1_000_000
    result = task.evaluate(task.build_model(0))
    assert result["floor"] == task.floor() and result["loss"] > task.floor()


def test_shards_are_deterministic_and_distinct_per_peer_and_step():
    task = get_task("synthetic-lm", TINY)
    inputs, targets = task.batch(3, 0, 7, 4)
    again, _ = task.batch(3, 0, 7, 4)
    assert inputs.shape == (4, 8) and inputs.dtype == torch.int64
    assert torch.equal(inputs, again)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert not torch.equal(inputs, task.batch(3, 1, 7, 4)[0])
    assert not torch.equal(inputs, task.batch(3, 0, 8, 4)[0])
    assert not torch.equal(inputs, task.batch(4, 0, 7, 4)[0])


def test_build_model_is_deterministic_and_keeps_global_rng():
    task = get_task("synthetic-lm", TINY)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = flatten(task.build_model(9))
    assert torch.equal(torch.rand(1), expected_next)
    assert np.array_equal(first, flatten(task.build_model(9)))
    assert not np.array_equal(first, flatten(task.build_model(10)))


def test_text_lm_on_a_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    task = get_task("text-lm", {"paths": [str(path)], **TINY})
    inputs, targets = task.batch(0, 2, 5, 3)
    assert inputs.shape == (3, 8) and int(inputs.max()) < 256
    assert torch.equal(inputs, task.batch(0, 2, 5, 3)[0])
    assert not torch.equal(inputs, task.batch(0, 3, 5, 3)[0])
    result = task.evaluate(task.build_model(0))
    assert result["floor"] is None and result["loss"] > 0


def test_text_lm_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    short = tmp_path / "short.txt"
    short.write_bytes(b"abc")
    with pytest.raises(TaskError, match="cannot read"):
        get_task("text-lm", {"paths": [str(tmp_path / "missing.txt")]})
    with pytest.raises(TaskError, match="is empty"):
        get_task("text-lm", {"paths": [str(empty)]})
    with pytest.raises(TaskError, match="too little"):
        get_task("text-lm", {"paths": [str(short)]})
    with pytest.raises(TaskError, match="non-empty list"):
        get_task("text-lm", {})


def test_entry_point_task(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        textwrap.dedent(
            """
            from locomesh.training.tasks import get_task

            def tiny(config):
                return get_task("synthetic-lm", {"alphabet": config["alphabet"], "context": 8,
                                                  "d_model": 16, "n_head": 2, "n_layer": 1})

            def not_a_task(config):
                return 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("my_tasks:tiny", {"alphabet": 5})
    assert task.config["alphabet"] == 5
    with pytest.raises(TaskError, match="not a Task"):
        get_task("my_tasks:not_a_task")
    with pytest.raises(TaskError, match="no callable"):
        get_task("my_tasks:missing")
    with pytest.raises(TaskError, match="cannot import"):
        get_task("no_such_module_anywhere:tiny")
    sys.modules.pop("my_tasks", None)


@pytest.mark.parametrize(
    "name, config, message",
    [
        ("no-such-task", None, "unknown task"),
        ("synthetic-lm", {"colour": 1}, "unknown config key"),
        ("synthetic-lm", {"order": "two"}, "must be int"),
        ("synthetic-lm", {"order": True}, "must be int"),
        ("synthetic-lm", {"d_model": 30, "n_head": 4}, "not a multiple"),
        ("synthetic-lm", {"alphabet": 1}, "alphabet >= 2"),
        ("synthetic-lm", [("order", 2)], "must be a mapping"),
    ],
)
def test_bad_names_and_configs_raise_task_error(name, config, message):
    with pytest.raises(TaskError, match=message):
        get_task(name, config)


@pytest.mark.parametrize("setting, closest", [("lr", "did you mean 'inner_lr' or 'outer_lr'? "),
                                              ("inner_step", "did you mean 'inner_steps'? "),
                                              ("alphabt", "did you mean 'alphabet'? "),
                                              ("colour", "")])
def test_an_unknown_setting_of_run_create_lists_run_and_task_settings_and_the_closest(setting, closest):
    """Issue #37: `run create --set lr=nan` answered "unknown config key" with the task's keys only,
    as if the run had no settings of its own: the keys `run create` does not know as run settings go
    to the task, so its refusal must name both kinds, and the closest first."""
    from locomesh.node.runs.registry import split_settings
    from locomesh.training.run_settings import RunSettingsError, check_run_settings

    hparams, task_config = split_settings({setting: float("nan")})
    with pytest.raises(RunSettingsError) as refused:
        check_run_settings("synthetic-lm", task_config, hparams)
    message = str(refused.value)
    assert message.startswith(f"unknown setting {setting!r}: {closest}(run settings: inner_steps, ")
    assert message.endswith("task 'synthetic-lm' settings: alphabet, concentration, context, d_model, eval_sequences, "
                            "n_head, n_layer, order, source_seed)")
