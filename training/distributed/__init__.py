"""Data parallelism inside one node: its inner steps split over its local devices, one process each.

A node with several GPUs (or, for tests, several CPU processes) trains as one DiLoCo peer: the
same θ_r in, one Δ out, the same data stream as a node with one device, only faster. The daemon
starts the processes itself (no torchrun): `DataParallelWorker` spawns one child per device
("spawn" start method: a fork of a process that has threads, or CUDA, is unsafe), and the
children form a torch.distributed process group over 127.0.0.1 (NCCL on GPUs, gloo on CPUs).
The parent is no rank of the group: it only drives the ranks, over one pipe each.

    parent                                           rank r (of N, on its own device)
    ------                                           --------------------------------
    spawn N ranks, wait for each to be ready   -->   init the group; rebuild the task by
                                                     (name, config) and its model from the seed
    per round: θ_r (float32 bytes) to each     -->   load θ_r into the replica
    per step: the step's whole batch is drawn  -->   rows [r·B/N, (r+1)·B/N) of it: forward and
      here, each rank gets its rows                  backward, the gradients summed over the
                                                     ranks, clip, AdamW; the batch's loss
    stop? steps? time? (asked between steps)   <--   every rank acks with the whole batch's loss
    end of round: ask rank 0 for its θ_i       <--   rank 0's parameters, float32 bytes
    Δ = θ_r − θ_i on the CPU, as `Worker` does

Each rank's loss is weighted by its share of the batch's rows before backward, so the summed
gradient is the whole batch's gradient: the same step as one process with the whole batch, up to
float rounding. Every rank applies the same update to the same parameters, so the replicas stay
equal, and θ_r is loaded afresh each round anyway.

Failure: every wait on a rank has a timeout, and a rank that dies, stops answering or raises ends
the round with `DataParallelError` (the worker then stops all its ranks, and refuses further
rounds). A rank exits when the parent calls `close()`, and on its own when the parent process is
gone (its pipe reaches end-of-file, and a watcher thread sees its parent change): a rank never
outlives its daemon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..devices import DataParallelError
from .parent import DataParallelWorker

if TYPE_CHECKING:
    import torch

    from ..inner import InnerConfig, Worker
    from ..tasks import Task

__all__ = ["DataParallelError", "DataParallelWorker", "inner_worker"]


def inner_worker(
    task: Task, model_seed: int, run_seed: int, peer_index: int, config: InnerConfig, *,
    device: str | torch.device = "cpu", local_workers: int = 1,
) -> Worker | DataParallelWorker:
    """This peer's inner worker on the devices `local_devices(device, local_workers)` names: a
    `Worker` on one, a `DataParallelWorker` over several (at most one per row of a batch).
    `DeviceError` if this machine lacks them, `DataParallelError` if the ranks do not start."""
    from ..devices import local_devices
    from ..inner import Worker

    devices = local_devices(str(device), local_workers)[: config.batch_size]
    if len(devices) == 1:
        return Worker(task, model_seed, run_seed, peer_index, config, device=devices[0])
    return DataParallelWorker(task, model_seed, run_seed, peer_index, config, devices)
