"""The daemon's side of a node's data-parallel group: `DataParallelWorker` (see the package docstring)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
import weakref
from dataclasses import dataclass
from itertools import pairwise
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable

import numpy as np
import torch

from ..devices import DataParallelError
from ..inner import Batches, InnerConfig, InnerResult, check_budget, check_trained, next_batch, round_over
from ..tasks import Task
from . import rank as rank_module

DEFAULT_TIMEOUT = 300.0  # a rank's start (CUDA and NCCL set-up included) or one step, at most
CLOSE_SECONDS = 10.0  # for the ranks to leave the group once told, before they are killed
DEATH_GRACE = 0.5  # for the others to show what they know when a rank reports a failure


@dataclass
class _Rank:
    """The parent's handle on one rank: its process, its end of the pipe, its device."""

    index: int
    device: torch.device
    process: BaseProcess
    conn: Connection

    def name(self) -> str:
        return f"rank {self.index} ({self.device})"


class DataParallelWorker:
    """A `Worker` (same `run_round`) whose inner steps run split over `devices`, one child process
    each (at least two, and no more than a batch has rows). Call `close()` when done: it stops the
    children (so does losing the last reference to the worker, and this process's exit). One call
    at a time, as `Worker`."""

    def __init__(
        self, task: Task, model_seed: int, run_seed: int, peer_index: int, config: InnerConfig,
        devices: list[torch.device], *, timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not 2 <= len(devices) <= config.batch_size:
            raise ValueError(f"data parallel over 2 to batch size ({config.batch_size}) devices, not {len(devices)}")
        self.task, self.config, self.timeout = task, config, timeout
        self.run_seed, self.peer_index = run_seed, peer_index
        self.devices = list(devices)
        # The parent's replica, never trained: the initial θ and the model the participant copies
        # to evaluate and score with, on the first device (built on the CPU first: the same bits).
        self.model = task.build_model(model_seed).to(self.devices[0])
        self.steps_done = 0  # across rounds: picks the data shard and the lr schedule
        self._ranks = _spawn(task, model_seed, config, self.devices, timeout)
        self._closer = weakref.finalize(self, _stop, self._ranks)
        try:
            self._replies(self._ranks, "start")
        except BaseException:
            self.close()
            raise

    def run_round(
        self, theta: np.ndarray, steps: int | None = None, seconds: float | None = None,
        stop: Callable[[], bool] | None = None, batches: Batches | None = None,
    ) -> InnerResult:
        """As `Worker.run_round`. `DataParallelError` if a rank fails; a round that raises
        anything stops the ranks (they may be mid-step), and the worker takes no further round."""
        check_budget(steps, seconds)
        ranks = self._live_ranks()
        try:
            return self._round(ranks, np.ascontiguousarray(theta, dtype=np.float32), steps, seconds, stop, batches)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids, in rank order."""
        return [rank.process.pid for rank in self._ranks]

    def close(self) -> None:
        """Stop the ranks: ask them to leave, kill those that have not within `CLOSE_SECONDS`.
        Idempotent."""
        self._closer()

    # --- one round ------------------------------------------------------------------------------

    def _round(self, ranks: list[_Rank], theta: np.ndarray, steps: int | None, seconds: float | None,
               stop: Callable[[], bool] | None, batches: Batches | None) -> InnerResult:
        for rank in ranks:
            self._send(rank, ("theta",), "the round's θ")
            self._send(rank, theta, "the round's θ", raw=True)
        self._replies(ranks, "loading θ")
        started = time.monotonic()
        losses: list[float] = []
        while (batch := next_batch(self, batches)) is not None:
            losses.append(self._step(ranks, *batch))
            self.steps_done += 1
            if round_over(losses, steps, seconds, started, stop):
                break
        check_trained(losses)
        delta = self._params(ranks[0])
        np.subtract(theta, delta, out=delta, dtype=np.float32)  # Δ = θ_r − θ_i, in the one new array
        return InnerResult(delta, len(losses), float(np.mean(losses)), time.monotonic() - started)

    def _step(self, ranks: list[_Rank], inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One inner step, each rank on its share of the batch's rows; the batch's loss."""
        rows, count = len(inputs), len(ranks)
        if rows < count:
            raise ValueError(f"a batch of {rows} rows cannot be split over {count} devices")
        what = f"step {self.steps_done}"
        bounds = [index * rows // count for index in range(count + 1)]
        for rank, (start, end) in zip(ranks, pairwise(bounds)):
            weight = (end - start) / rows  # its share: the ranks' gradients add up to the batch's
            self._send(rank, ("step", self.steps_done, inputs[start:end].numpy(), targets[start:end].numpy(), weight),
                       what)
        return self._replies(ranks, what)[0][1]

    def _params(self, rank: _Rank) -> np.ndarray:
        """The rank's parameters, flat float32, on the CPU."""
        self._send(rank, ("params",), "the round's parameters")
        self._replies([rank], "the round's parameters")
        if not rank.conn.poll(self.timeout):
            raise DataParallelError(f"{rank.name()} sent no parameters within {self.timeout:g} s")
        try:
            data = rank.conn.recv_bytes()
        except (EOFError, OSError):
            raise _dead(rank, "sending the round's parameters") from None
        return np.frombuffer(data, dtype=np.float32).copy()

    # --- talking to the ranks -------------------------------------------------------------------

    def _live_ranks(self) -> list[_Rank]:
        if not self._closer.alive:
            raise DataParallelError("this data-parallel worker is closed (a round failed, or it was closed)")
        return self._ranks

    def _send(self, rank: _Rank, message: Any, what: str, *, raw: bool = False) -> None:
        try:
            rank.conn.send_bytes(message) if raw else rank.conn.send(message)
        except (OSError, ValueError):
            raise _dead(rank, what) from None

    def _replies(self, ranks: list[_Rank], what: str) -> list[tuple]:
        """One reply from each of `ranks`, in their order, within `timeout` seconds in all;
        `DataParallelError` if one reports an error, dies or says nothing in time."""
        waiting = {rank.conn: rank for rank in ranks}
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + self.timeout
        while waiting:
            sentinels = {rank.process.sentinel: rank for rank in waiting.values()}
            ready = wait([*waiting, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                names = ", ".join(rank.name() for rank in waiting.values())
                raise DataParallelError(f"{names} sent nothing for {self.timeout:g} s ({what})")
            for conn in [conn for conn in ready if conn in waiting]:  # first: a dying rank's last words
                rank = waiting.pop(conn)
                replies[rank.index] = _reply(rank, what)
                if replies[rank.index][0] == "error":
                    raise self._blame(rank, replies[rank.index], what)
            for sentinel in ready:
                if sentinel in sentinels and sentinels[sentinel].conn in waiting:
                    raise _dead(sentinels[sentinel], what)
        return [replies[rank.index] for rank in ranks]

    def _blame(self, rank: _Rank, report: tuple, what: str) -> DataParallelError:
        """The error to raise once `rank` reports ("error", traceback, lost_peer) during `what`. The
        cause may be another rank: once one is gone, the group's collectives fail on all the others.
        So the others get `DEATH_GRACE` each to show theirs: a rank that died without a word is the
        cause, else one that failed on its own (not for a lost peer), else `rank`'s report."""
        reports = [(rank, report)]
        for other in self._ranks:
            if other is rank or not other.conn.poll(DEATH_GRACE):
                continue
            try:
                reports.append((other, other.conn.recv()))
            except (EOFError, OSError):
                return DataParallelError(f"{_dead(other, what)}; then {rank.name()} failed: "
                                         f"{report[1].strip().splitlines()[-1]}")
        own = [(other, message) for other, message in reports if message[0] == "error" and not message[2]]
        cause, message = own[0] if own else reports[0]
        return DataParallelError(f"{cause.name()} failed ({what}):\n{message[1]}")


def _reply(rank: _Rank, what: str) -> tuple:
    try:
        return rank.conn.recv()
    except (EOFError, OSError):
        raise _dead(rank, what) from None


def _dead(rank: _Rank, what: str) -> DataParallelError:
    rank.process.join(1.0)  # reap it, for its exit code
    code = rank.process.exitcode
    state = "is alive but its pipe is broken" if code is None else f"exited with code {code}"
    return DataParallelError(f"{rank.name()} {state} ({what})")


def _spawn(task: Task, model_seed: int, config: InnerConfig, devices: list[torch.device],
           timeout: float) -> list[_Rank]:
    """Start one rank process per device; they form their group while the caller waits."""
    context = multiprocessing.get_context("spawn")  # fork is unsafe in a process with threads or CUDA
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    ranks: list[_Rank] = []
    try:
        for index, device in enumerate(devices):
            spec = rank_module.RankSpec(
                rank=index, world=len(devices), device=str(device), init_method=init_method, task_name=task.name,
                task_config=dict(task.config), model_seed=model_seed, config=config, parent_pid=os.getpid(),
                timeout=timeout,
            )
            ours, theirs = context.Pipe()
            process = context.Process(target=rank_module.main, args=(spec, theirs), name=f"locomesh rank {index}",
                                      daemon=True)  # daemonic: terminated at this process's exit too
            process.start()
            theirs.close()  # only the child holds its end now: its death reads as end-of-file here
            ranks.append(_Rank(index, device, process, ours))
    except BaseException:
        _stop(ranks)  # the ones started would wait for the others until the group's timeout
        raise
    return ranks


def _stop(ranks: list[_Rank]) -> None:
    """Ask every rank to leave, wait `CLOSE_SECONDS` in all, kill the ones still there."""
    for rank in ranks:
        try:
            rank.conn.send(("close",))
        except (OSError, ValueError):
            pass  # gone already
    deadline = time.monotonic() + CLOSE_SECONDS
    for rank in ranks:
        rank.process.join(max(0.0, deadline - time.monotonic()))
    for rank in ranks:
        if rank.process.is_alive():
            rank.process.kill()
            rank.process.join(CLOSE_SECONDS)
        rank.conn.close()


def _free_port() -> int:
    """A TCP port on 127.0.0.1 free now, for rank 0's store (another program could take it before
    rank 0 binds it: then the ranks fail to start, and say so)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
