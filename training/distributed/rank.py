"""One rank of a node's data-parallel group: the body of a child process `DataParallelWorker` spawns.

The rank answers its parent's messages one at a time, in order, each with one reply (the parent
waits for it, with a timeout, before it sends the next):

    ("theta",) + θ as raw float32 bytes   ->  ("ok", None): θ loaded into the replica
    ("step", step, inputs, targets, weight) -> ("ok", loss): one inner step on these rows (their
                                              loss counts `weight`, their share of the batch)
    ("params",)                            ->  ("params",) + the replica's θ as float32 bytes
    ("close",), or the pipe's end-of-file  ->  the rank leaves the group and exits

Anything that goes wrong is reported as ("error", traceback, lost_peer) before the rank exits, so
the parent can say what happened (`lost_peer`: a collective failed, so the cause is another
rank). A watcher thread ends the process once its parent is gone, also while it is stuck in a
collective that would only time out later.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..flat import flatten, unflatten_into
from ..inner import InnerConfig, forward_backward, make_optimizer, optimizer_step
from ..tasks import get_task

PARENT_CHECK_SECONDS = 0.5


@dataclass(frozen=True)
class RankSpec:
    """All a rank needs to start, picklable: where it is in the group, and how to rebuild its model."""

    rank: int
    world: int
    device: str
    init_method: str  # tcp://127.0.0.1:PORT, where rank 0 serves the group's store
    task_name: str
    task_config: dict[str, Any]
    model_seed: int
    config: InnerConfig
    parent_pid: int
    timeout: float  # of the group's collectives: a rank whose peer vanished fails instead of hanging


def main(spec: RankSpec, conn: Connection) -> None:
    """The child process's target: start, serve the parent until it says close or goes, exit."""
    # Ctrl-C in a terminal reaches the whole process group: the daemon shuts down and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(spec.parent_pid)
    try:
        rank = Rank(spec)
        conn.send(("ready",))
        rank.serve(conn)
        rank.leave()
    except Exception as error:  # noqa: BLE001 - whatever it was, the parent must hear of it
        try:  # the innermost frames of the traceback: where it broke
            conn.send(("error", traceback.format_exc(limit=-8), isinstance(error, PeerLost)))
        except OSError:
            pass  # the parent is gone: nobody to tell
        os._exit(1)  # not a normal exit: a group with a missing peer can hang in its teardown


class PeerLost(RuntimeError):
    """A collective of the group failed: another rank is gone or failed (the parent then looks for
    that rank's own report, the cause)."""


class Rank:
    """A model replica and its AdamW state on this rank's device, in the group."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:  # the CPU's cores shared out, not each rank with as many threads as there are cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world))
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo", init_method=spec.init_method, rank=spec.rank,
            world_size=spec.world, timeout=timedelta(seconds=spec.timeout),
            device_id=self.device if self.device.type == "cuda" else None,
        )
        task = get_task(spec.task_name, spec.task_config)
        self.model = task.build_model(spec.model_seed).to(self.device)  # on the CPU first: the same bits
        self.optimizer = make_optimizer(self.model, spec.config)
        self.theta = bytearray(4 * sum(parameter.numel() for parameter in self.model.parameters()))

    def serve(self, conn: Connection) -> None:
        """Answer the parent's messages until it says close or its pipe ends."""
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return  # the parent closed its end, or died
            if message[0] == "close":
                return
            if message[0] == "theta":
                conn.send(self.load(conn))
            elif message[0] == "step":
                conn.send(("ok", self.step(*message[1:])))
            elif message[0] == "params":
                conn.send(("params",))
                conn.send_bytes(self.params())
            else:
                raise ValueError(f"unknown message {message[0]!r}")

    def load(self, conn: Connection) -> tuple[str, None]:
        conn.recv_bytes_into(self.theta)
        unflatten_into(self.model, np.frombuffer(self.theta, dtype=np.float32))
        self.model.train()
        return ("ok", None)

    def step(self, step: int, inputs: np.ndarray, targets: np.ndarray, weight: float) -> float:
        """One inner step on this rank's rows, whose loss counts `weight` (their share of the batch's
        rows): the gradients summed over the ranks are the whole batch's. Returns the batch's loss."""
        loss = forward_backward(self.model, torch.from_numpy(inputs), torch.from_numpy(targets), self.device, weight)
        self._sum_gradients()
        optimizer_step(self.model, self.optimizer, self.spec.config, step)
        total = (loss * weight).float()
        _all_reduce(total)
        return total.item()

    def _sum_gradients(self) -> None:
        """Every rank's gradients summed, in one collective over one flat buffer (many small ones
        cost a launch each). torch's DistributedDataParallel would overlap it with the backward
        pass, but importing it costs seconds of torch._dynamo at every start."""
        grads = [parameter.grad for parameter in self.model.parameters() if parameter.grad is not None]
        flat = _flatten_dense_tensors(grads)
        _all_reduce(flat)
        for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(summed)

    def params(self) -> np.ndarray:
        return flatten(self.model)

    def leave(self) -> None:
        dist.destroy_process_group()


def _all_reduce(tensor: torch.Tensor) -> None:
    """Sum `tensor` over the group, in place; `PeerLost` if the collective fails."""
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:  # gloo's and NCCL's errors for a peer that vanished or broke
        raise PeerLost(f"a collective failed, another rank is gone or failed: {error}") from error


def _watch_parent(parent_pid: int) -> None:
    """End this process once its parent is gone (it is then adopted: its parent pid changes)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="parent watcher", daemon=True).start()
