"""Devices: specs and what they resolve to, the inner worker on a device, and a node's data-parallel
group (training/devices.py, training/inner.py, training/distributed/). CPU only: CUDA is simulated
where only its device count matters, and the data-parallel group runs as gloo processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import trio

from locomesh.training.devices import DataParallelError, DeviceError, autocast, describe, local_devices, resolve_device
from locomesh.training.distributed import DataParallelWorker, inner_worker
from locomesh.training.flat import flatten
from locomesh.training.inner import InnerConfig, Worker
from locomesh.training.participant import Participant
from locomesh.training.tasks import get_task

CPU = torch.device("cpu")
INNER = InnerConfig(batch_size=8)
BODY = {"task": "synthetic-lm", "task_config": {"d_model": 32, "n_layer": 1, "n_head": 2}, "seed": 3,
        "hparams": {"inner_steps": 3, "batch_size": 4}}


@pytest.fixture(scope="module")
def task():
    return get_task("synthetic-lm")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def four_gpus(monkeypatch):
    """torch answering as on a machine with four CUDA GPUs (only their count is asked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


# --- specs ---------------------------------------------------------------------------------------


def test_specs_resolve_to_what_the_machine_has(no_gpu):
    assert resolve_device("cpu") == CPU and resolve_device("auto") == CPU
    with pytest.raises(DeviceError, match="cuda asked for, this machine has no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="cuda:1 asked for, this machine has no CUDA device"):
        resolve_device("cuda:1")
    with pytest.raises(DeviceError, match="no usable MPS device"):
        resolve_device("mps")


def test_cuda_specs_on_a_machine_with_gpus(four_gpus):
    assert resolve_device("auto") == torch.device("cuda", 0) == resolve_device("cuda")
    assert resolve_device("cuda:3") == torch.device("cuda", 3)
    with pytest.raises(DeviceError, match="cuda:4 asked for, this machine has 4 CUDA devices"):
        resolve_device("cuda:4")


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:01", "cuda:0 ", "", "cpu,cuda", None])
def test_malformed_specs_are_device_errors(spec):
    with pytest.raises(DeviceError, match="is not a device"):
        resolve_device(spec)


def test_a_nodes_local_devices(four_gpus):
    gpus = [torch.device("cuda", index) for index in range(4)]
    assert local_devices("auto") == gpus == local_devices("cuda", 0)
    assert local_devices("cuda", 2) == gpus[:2]
    assert local_devices("cuda:2") == [gpus[2]] == local_devices("cuda:2", 1)
    assert local_devices("cpu") == [CPU] and local_devices("cpu", 3) == [CPU] * 3
    with pytest.raises(DeviceError, match="5 local workers asked for on auto, this machine has 4 CUDA devices"):
        local_devices("auto", 5)
    with pytest.raises(DeviceError, match="cuda:1, which is one device"):
        local_devices("cuda:1", 2)
    with pytest.raises(DeviceError, match="local workers"):
        local_devices("cpu", -1)
    assert describe(gpus[:2]) == "cuda:0,cuda:1 (data parallel)" and describe([CPU]) == "cpu"


def test_the_cpu_trains_in_float32():
    """No autocast on the CPU: its arithmetic stays the plain float32 one every build agrees on."""
    assert isinstance(autocast(CPU), contextlib.nullcontext)


# --- the worker on a device -------------------------------------------------------------------------


def _two_rounds(worker: Worker) -> tuple[bytes, list[float]]:
    theta = flatten(worker.model)
    first = worker.run_round(theta, 4)
    second = worker.run_round(theta - first.delta, 3)
    return first.delta.tobytes() + second.delta.tobytes(), [first.mean_loss, second.mean_loss]


def test_a_worker_on_the_cpu_is_the_worker_without_a_device():
    """Bit for bit: a device argument changes nothing on the CPU (nor does this module's code path
    change what the worker computed before it had one: tests/test_simulation.py pins that)."""
    task = get_task("synthetic-lm", BODY["task_config"])
    reference = _two_rounds(Worker(task, 1, 2, 3, INNER))
    assert _two_rounds(Worker(task, 1, 2, 3, INNER, device="cpu")) == reference
    assert _two_rounds(inner_worker(task, 1, 2, 3, INNER, device="cpu")) == reference


def test_given_batches_are_what_the_worker_trains_on(task):
    own = Worker(task, 1, 2, 5, INNER)
    theta = flatten(own.model)
    expected = own.run_round(theta, 4)
    given = Worker(task, 1, 2, 0, INNER)  # another peer: its own data would differ
    batches = iter([task.batch(2, 5, step, INNER.batch_size) for step in range(4)])
    result = given.run_round(theta, 4, batches=batches)
    assert np.array_equal(result.delta, expected.delta) and result.mean_loss == expected.mean_loss
    short = given.run_round(theta, 10, batches=iter([task.batch(2, 5, 0, 8), task.batch(2, 5, 1, 8)]))
    assert short.steps == 2  # the round ends when its batches do
    with pytest.raises(ValueError, match="not one batch"):
        given.run_round(theta, 3, batches=iter([]))


# --- a data-parallel group of two gloo processes -------------------------------------------------


def _running(pid: int) -> bool:
    """Is process `pid` there and not a zombie waiting for its (new) parent to reap it?"""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.exists():
        try:
            return stat.read_text().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_two_processes_train_as_one(task):
    """The same loss curve as one process with the whole batch, step by step (each rank has half
    the rows), and nearly the same Δ: only the float rounding of the gradient's sum differs."""
    single = Worker(task, 1, 2, 3, INNER)
    parallel = DataParallelWorker(task, 1, 2, 3, INNER, [CPU, CPU], timeout=120)
    try:
        theta = {"single": flatten(single.model), "parallel": flatten(parallel.model)}
        assert np.array_equal(theta["single"], theta["parallel"])
        for worker, name in ((single, "single"), (parallel, "parallel")):
            curve = []
            for _ in range(8):  # one step a round: each round's mean loss is its step's loss
                result = worker.run_round(theta[name], 1)
                curve.append(result.mean_loss)
                theta[name] = theta[name] - result.delta
            theta[name + " curve"] = curve
        np.testing.assert_allclose(theta["parallel curve"], theta["single curve"], rtol=1e-4)  # seen: 2e-7
        assert theta["single curve"][-1] < theta["single curve"][0]  # it learned something
        start = theta["single"]
        one, two = single.run_round(start, 4), parallel.run_round(start, 4)
        assert (one.steps, two.steps) == (4, 4) and parallel.steps_done == single.steps_done == 12
        assert np.linalg.norm(two.delta - one.delta) <= 1e-3 * np.linalg.norm(one.delta)  # seen: 3e-5
    finally:
        parallel.close()


def test_a_data_parallel_participant_trains_and_close_stops_its_processes():
    participant = Participant.for_run(BODY, b"\x01" * 32, device="cpu", local_workers=2)
    assert isinstance(participant.worker, DataParallelWorker) and participant.device == "cpu,cpu (data parallel)"
    pids = participant.worker.pids
    assert len(pids) == 2 and all(_running(pid) for pid in pids)
    contribution = participant.train()
    assert contribution.steps == 3 and np.isfinite(contribution.train_loss)
    assert np.isfinite(participant.evaluate()["loss"])
    participant.close()
    assert _gone(pids, 0.0)  # close waits for them
    participant.close()  # idempotent
    with pytest.raises(DataParallelError, match="closed"):
        participant.train()


def test_a_rank_that_fails_is_reported_with_its_error(task):
    parallel = DataParallelWorker(task, 1, 2, 3, INNER, [CPU, CPU], timeout=120)
    pids = parallel.pids
    inputs, targets = task.batch(2, 3, 0, INNER.batch_size)
    outside = inputs.clone()
    outside[-1, 0] = 1000  # no such token: rank 1's embedding lookup fails
    with pytest.raises(DataParallelError, match=r"rank 1 \(cpu\) failed \(step 0\):(.|\n)*IndexError"):
        parallel.run_round(flatten(parallel.model), 2, batches=iter([(outside, targets)]))
    assert _gone(pids, 0.0)  # a failed round stops the group
    with pytest.raises(DataParallelError, match="closed"):
        parallel.run_round(flatten(parallel.model), 1)


def test_a_rank_that_dies_mid_round_is_an_error_not_a_hang(task):
    parallel = DataParallelWorker(task, 1, 2, 3, INNER, [CPU, CPU], timeout=120)
    pids, steps = parallel.pids, []

    def kill_rank_one() -> bool:
        steps.append(parallel.steps_done)
        if len(steps) == 2:
            os.kill(pids[1], signal.SIGKILL)
        return False

    started = time.monotonic()
    with pytest.raises(DataParallelError, match=r"rank 1 \(cpu\) exited with code -9 \(step 2\)"):
        parallel.run_round(flatten(parallel.model), 10, stop=kill_rank_one)
    assert time.monotonic() - started < 60 and _gone(pids, 0.0)


RANKS_OF_A_PARENT_THAT_DIES = """
import time, torch
from locomesh.training.distributed import DataParallelWorker
from locomesh.training.inner import InnerConfig
from locomesh.training.tasks import get_task
worker = DataParallelWorker(get_task("synthetic-lm"), 1, 2, 3, InnerConfig(batch_size=8),
                            [torch.device("cpu")] * 2, timeout=120)
print(*worker.pids, flush=True)
time.sleep(600)
"""


def test_ranks_do_not_outlive_their_daemon():
    """A daemon killed outright (no close, no exit handlers): its ranks go on their own."""
    parent = subprocess.Popen([sys.executable, "-c", RANKS_OF_A_PARENT_THAT_DIES], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(word) for word in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(pid) for pid in pids)
    finally:
        parent.kill()
        parent.wait(30)
    assert _gone(pids, 15.0)


# --- the node --------------------------------------------------------------------------------------


def test_a_join_on_devices_the_machine_lacks_is_a_clear_error(no_gpu):
    from locomesh.node.rounds.service import NO_DEVICE, RoundService
    from locomesh.node.rpc.dispatch import RpcError

    def factory(body, key):  # as Participant.for_run(..., device="cuda:3") fails here
        return resolve_device("cuda:3")

    service = RoundService(None, None, None, device="cuda:3", local_workers=1, participant_factory=factory)
    service._node = SimpleNamespace(identity=SimpleNamespace(public_key=b"k" * 32))
    with pytest.raises(RpcError, match="cannot train here on device 'cuda:3': cuda:3 asked for") as caught:
        trio.run(service._make_participant, factory, {"any": "body"})
    assert caught.value.code == NO_DEVICE
    default = trio.run(service._default_factory)
    assert default.keywords == {"device": "cuda:3", "local_workers": 1, "train_threads": 0}
