"""Inner-step throughput of the Llama presets through the node's own inner worker, per device.

    .venv/bin/python bench/llama_throughput.py [--device all] [--preset 20m] [--steps N]
                                               [--batch-size B] [--context T]

What is timed is what a node's round runs: `Worker.run_round` (and, over several GPUs,
`DataParallelWorker.run_round`) on batches of random tokens, so each step's host-to-device copy,
the bf16 autocast forward and backward, gradient clipping, AdamW and the per-step loss read-back
(a device sync) all count. A first round of warm-up steps (allocator, kernels' autotuning) is not
timed; the second round's `seconds` is.

`--device`: "all" (default) measures the CPU and, where CUDA is there, each GPU alone and (with
several) all of them data parallel; or one spec of `training.devices` ("cpu", "cuda:1", ...), or
"dp" for the data-parallel group alone. On a GPU the row also gives the model FLOPs utilization:
(6·N + 12·L·d·T) FLOPs per token (N parameters, L layers, width d, context T: weights forward and
backward, plus attention's scores) at the measured tokens per second, over the card's dense bf16
peak (looked up by its name; blank for a card not in `PEAK_BF16`). Data parallel counts every
GPU's peak and gives each GPU `--batch-size` rows (the group's batch is that times the GPUs).

Defaults are sized per kind: on the CPU 4 sequences of 128 tokens and 10 timed steps (under a
minute on two cores), on a GPU 32 of the preset's whole context and 30 timed steps.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Iterator

import torch

from _report import machine, report
from locomesh.training.devices import describe
from locomesh.training.distributed import DataParallelWorker
from locomesh.training.flat import flatten, param_count
from locomesh.training.inner import InnerConfig, Worker
from locomesh.training.tasks import get_task

# Dense bf16 tensor-core peak, FLOP/s, by a name fragment of torch.cuda.get_device_name (first match).
PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12}
CPU_DEFAULTS = {"batch_size": 4, "context": 128, "steps": 10, "warmup": 2}
GPU_DEFAULTS = {"batch_size": 32, "context": 0, "steps": 30, "warmup": 5}  # context 0: the preset's


def random_batches(vocab: int, rows: int, context: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets) of uniformly random tokens, on the CPU as a round's batches are."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(vocab, (rows, context + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def flops_per_token(task, params: int, context: int) -> float:
    """6·N for the weights (forward and backward) plus 12·L·d·T for attention's scores and mixing."""
    config = task.model_config
    return 6 * params + 12 * config.num_hidden_layers * config.hidden_size * context


def peak(card: str) -> float | None:
    return next((value for fragment, value in PEAK_BF16.items() if fragment in card), None)


def measure(target: str, args: argparse.Namespace) -> dict:
    """One row: `target` is "cpu", "cuda:N" or "dp" (every GPU, data parallel)."""
    gpu = target != "cpu"
    defaults = GPU_DEFAULTS if gpu else CPU_DEFAULTS
    rows = args.batch_size or defaults["batch_size"]
    steps = args.steps or defaults["steps"]
    task = get_task("llama", {"preset": args.preset, "sequence_length": args.context or defaults["context"]})
    context = task.context
    devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())] if target == "dp" else \
        [torch.device(target)]
    config = InnerConfig(batch_size=rows * len(devices))
    if target == "dp":
        worker = DataParallelWorker(task, 0, 0, 0, config, devices)
    else:
        worker = Worker(task, 0, 0, 0, config, device=devices[0])
    try:
        theta = flatten(worker.model)
        batches = random_batches(task.model_config.vocab_size, config.batch_size, context, seed=0)
        worker.run_round(theta, defaults["warmup"], batches=batches)
        result = worker.run_round(theta, steps, batches=batches)
    finally:
        worker.close()
    params = param_count(worker.model)
    tokens_per_s = result.steps * config.batch_size * context / result.seconds
    row = {"device": describe(devices), "card": _card(devices[0]), "batch": config.batch_size, "context": context,
           "steps": result.steps, "step_ms": 1e3 * result.seconds / result.steps, "tokens_per_s": tokens_per_s,
           "loss": result.mean_loss}
    card_peak = peak(row["card"]) if gpu else None
    if card_peak is not None:
        row["mfu"] = tokens_per_s * flops_per_token(task, params, context) / (card_peak * len(devices))
    return row


def _card(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name where the system says it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next(line.partition(":")[2].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def targets(choice: str) -> list[str]:
    if choice != "all":
        return [choice]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu", *(f"cuda:{index}" for index in range(gpus)), *(["dp"] if gpus > 1 else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="all", help='"all", "dp", or a device spec (cpu, cuda:N, ...)')
    parser.add_argument("--preset", default="20m")
    parser.add_argument("--steps", type=int, help="timed steps (default: 10 on the CPU, 30 on a GPU)")
    parser.add_argument("--batch-size", type=int, help="sequences a step, per device (default: 4 CPU, 32 GPU)")
    parser.add_argument("--context", type=int, help="tokens a sequence (default: 128 CPU, the preset's on a GPU)")
    args = parser.parse_args()
    rows = [measure(target, args) for target in targets(args.device)]
    task = get_task("llama", {"preset": args.preset})
    meta = {**machine(), "torch": torch.__version__, "threads": torch.get_num_threads(), "preset": args.preset,
            "params": task.model_config.num_parameters(), "cuda": torch.version.cuda}
    report("llama_throughput", rows, meta)


if __name__ == "__main__":
    main()
