"""DiLoCo vs synchronous data parallel at equal samples: eval loss and bytes each worker sends.

N workers train the default task (`synthetic-lm`, whose best possible loss is known; context 32
here to halve the cost, the model is otherwise the default ~103k parameters). DDP averages
the N workers' gradients at every step (T steps, 4 × params bytes per worker per step counted);
DiLoCo runs R rounds of H = T / R inner steps and sends one encoded pseudo-gradient per round:
fp32, int8, and 4-bit with error feedback. Both see the same samples: worker i's batch at step t
is the same shard in both.

Warm start (as in the DiLoCo paper, which starts from a pretrained model): before the compared
phase, `--warm-steps` (100) DDP steps on samples of their own (run seed 1; the compared phase
uses run seed 0) give the one θ0 that every method starts from. Its 12,800 samples and its
bytes are the same for every method and are reported in meta["warm_start"], not in the rows.
Without it (`--warm-steps 0`) DiLoCo's batch-16 workers spend the first 2-3 rounds on the
initial plateau that DDP's 8× batch leaves at once, and int8 missed its target
(docs/measurements.md).

Targets: DiLoCo int8 within 2% of DDP's eval loss (loss ≤ 1.02 × DDP's) while each worker sends
≥ 500× fewer bytes; 4-bit with error feedback within 2% and ≥ 1000× fewer. The bytes reduction
is about H × 4 / (payload bytes per parameter), so H = 150 is what buys 500× and 1000×.

    .venv/bin/python bench/diloco_vs_ddp.py --jobs 2   # full mode (its run time: docs/measurements.md)
    .venv/bin/python bench/diloco_vs_ddp.py --quick    # a smoke run of the same pipeline

Fairness: DDP runs at every lr of `--ddp-lr` (3e-3, 1e-2, 2e-2) and the best one is the
baseline (meta["baseline"]); all use AdamW, warmup 20 and cosine decay to 0.1× over the run.
DiLoCo uses the same inner AdamW and schedule (lr 3e-3, not tuned further), outer Nesterov lr
0.7, momentum 0.9 (the paper's values), and the plain mean as aggregator.

`--task llama`: the same comparison on real text, the `llama` task on this Python's standard
library sources, BPE-tokenized (vocabulary 2048) and packed in shards of 4096 tokens
(bench/_corpus.py; cached under bench/out/corpus/). The model: hidden 128, 2 layers, 4 heads (2
key/value heads), MLP 384, context 64, tied embeddings: 656k parameters (`--llama` overrides any
field by its Hugging Face name, as JSON). Defaults differ from synthetic-lm's (`TASK_DEFAULTS`):
4 workers, batch 8, H = 150, R = 6, DDP lrs 3e-3, 6e-3, 1.2e-2, 512 eval windows, a warm start
of 400 steps. Training windows come from the packed train shards (`PackedStream`): a fixed draw
of them is set aside for the warm start (its tokens are its own), the rest dealt out among the
workers by the run seed, disjoint, and each worker reads its own shards' windows in order (each
token once per epoch), step t taking the batch after step t − 1's, as a daemon reads the shards
a round assigns it. Eval: the held-out shards (the task's `attach_dataset`), loss in nats per
token. Full mode: a 400-step warm start (~1.5 CPU-minutes), then 6 simulations of about 3
CPU-minutes each.

On this model int8 misses the 2% target by far (measured 2026-11-26, 2 shared cores; full mode
9 minutes wall with --jobs 2): DDP at its best lr (6e-3) 4.203 nats/token, DiLoCo fp32 1.091×
that, int8 1.091× (669× fewer bytes), int4+ef 1.092× (1605×): the codec costs nothing, DiLoCo
itself does. Knobs tried (int8 against DDP at 6e-3; 4 workers, H = 150, R = 6 unless said):
warm start 100 steps 1.117, 400 steps 1.091 (hence the default); warm 100 with inner lr 6e-3
1.162; warm 400 with inner lr 1.5e-3 1.101, outer lr 0.4 1.107, outer lr 1.0 1.101, H = 50 ×
R = 18 1.088 (only 219× fewer bytes), R = 12 (twice the tokens) 1.140. The gap grows with the
workers: 2 workers 1.043, 1 worker 1.014 (fp32). A 656k-parameter model on 1.9M tokens is far
from converged, and averaging 4 replicas that drifted apart for H steps then costs more than
DDP's 4× batch does; synthetic-lm meets the target because both methods end near its entropy
floor.

    .venv/bin/python bench/diloco_vs_ddp.py --task llama --jobs 2
    .venv/bin/python bench/diloco_vs_ddp.py --task llama --quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, report

from locomesh.training.simulation import DDPConfig, DiLoCoConfig, simulate_ddp, simulate_diloco
from locomesh.training.inner import InnerConfig
from locomesh.training.tasks import get_task
from locomesh.training.tasks.base import seeded_rng

# Per task, the defaults of the flags that default to None. synthetic-lm's are the bench's
# original ones; llama's fit this CPU (see the module docstring).
TASK_DEFAULTS = {
    "synthetic-lm": {"workers": 8, "inner_steps": 150, "rounds": 8, "batch": 16, "inner_lr": 3e-3,
                     "ddp_lr": "3e-3,1e-2,2e-2", "context": 32, "eval_sequences": 1024, "warm_steps": 100},
    "llama": {"workers": 4, "inner_steps": 150, "rounds": 6, "batch": 8, "inner_lr": 3e-3,
              "ddp_lr": "3e-3,6e-3,1.2e-2", "context": 64, "eval_sequences": 512, "warm_steps": 400},
}
# The llama model (Hugging Face field names); vocab_size is the tokenizer's, the context `--context`.
LLAMA_MODEL = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "tie_word_embeddings": True}
STREAM_TAG, RESERVE_TAG = 0x5354, 0x5753  # seeds of the shards' deal to workers and of the warm start's set

# DiLoCo variants: label -> (codec, error feedback)
VARIANTS = {"fp32": ("fp32", False), "int8": ("int8", True), "int4+ef": ("int4", True)}
TARGETS = {"int8": (1.02, 500), "int4+ef": (1.02, 1000)}  # loss ratio ceiling, bytes ratio floor
WARM_SEED = 1  # the warm start's samples: a run seed the compared phase (run seed 0) never uses
WARM_LR = 3e-3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (minutes → seconds)")
    parser.add_argument("--task", default="synthetic-lm", choices=sorted(TASK_DEFAULTS),
                        help="synthetic-lm (default) or llama on the packed stdlib corpus")
    parser.add_argument("--workers", type=int, default=None, help="8 (llama: 4)")
    parser.add_argument("--inner-steps", type=int, default=None, help="H (150)")
    parser.add_argument("--rounds", type=int, default=None, help="R; DDP takes R × H steps (8; llama: 6)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per worker per step (16; llama: 8)")
    parser.add_argument("--inner-lr", type=float, default=None, help="3e-3")
    parser.add_argument("--ddp-lr", default=None,
                        help="comma-separated DDP lrs; each is run, the best is the baseline "
                             "(3e-3,1e-2,2e-2; llama: 3e-3,6e-3,1.2e-2)")
    parser.add_argument("--warm-steps", type=int, default=None,
                        help="shared DDP warm start (own samples) before both methods; 0: none (100; llama: 400)")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--context", type=int, default=None, help="32 (llama: 64)")
    parser.add_argument("--eval-sequences", type=int, default=None, help="1024 (llama: 512)")
    parser.add_argument("--llama", default="{}", help="llama only: JSON of model fields over LLAMA_MODEL's")
    parser.add_argument("--vocab", type=int, default=2048, help="llama only: the BPE tokenizer's vocabulary")
    parser.add_argument("--shard-tokens", type=int, default=4096, help="llama only: tokens per packed shard")
    parser.add_argument("--only", default="ddp,fp32,int8,int4+ef", help="comma-separated subset")
    parser.add_argument("--aggregator", default="mean")
    parser.add_argument("--exchange", default="allgather",
                        help="allgather, sharded, or both (each DiLoCo variant in each mode, sharded beside allgather)")
    parser.add_argument("--shard-values", type=int, default=16384, help="values per shard in sharded exchange")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per simulation")
    parser.add_argument("--jobs", type=int, default=1, help="simulations run side by side")
    args = parser.parse_args()
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.llama_model = {**LLAMA_MODEL, **json.loads(args.llama)}
    if args.quick:
        args.inner_steps, args.rounds, args.batch, args.eval_sequences = 20, 2, 8, 128
        args.warm_steps = min(args.warm_steps, 10)
    args.ddp_lrs = [float(lr) for lr in args.ddp_lr.split(",")]
    return args


def inner_config(lr: float, args: argparse.Namespace) -> InnerConfig:
    # Cosine decay over the whole run for both methods: the same schedule, counted in inner steps.
    total = args.inner_steps * args.rounds
    return InnerConfig(lr=lr, batch_size=args.batch, warmup_steps=20, decay_steps=total)


def progress(label: str):
    def show(record) -> None:
        print(f"  {label} {record.round_index}: eval {record.eval_loss:.4f}", file=sys.stderr, flush=True)

    return show


def warm_start(args: argparse.Namespace):
    """The θ both methods start from: `--warm-steps` DDP steps (N workers, constant lr after the
    warmup) on samples of their own (run seed WARM_SEED), so the compared phase reuses none of
    them. None when --warm-steps is 0."""
    if args.warm_steps == 0:
        return None
    torch.set_num_threads(args.threads)
    config = DDPConfig(
        workers=args.workers, steps=args.warm_steps, run_seed=WARM_SEED,
        inner=InnerConfig(lr=WARM_LR, batch_size=args.batch, warmup_steps=20),
    )
    return simulate_ddp(make_task(args, warm=True), config)


def run_method(method: str, args: argparse.Namespace, theta0):
    """One simulation ("ddp@<lr>" or a DiLoCo variant label) from θ0 (None: the model seed's
    initialisation): (result, CPU seconds). Runs in a worker process under --jobs, so it builds
    its own task."""
    torch.set_num_threads(args.threads)
    task = make_task(args)
    started = time.process_time()
    if method.startswith("ddp@"):
        config = DDPConfig(
            workers=args.workers, steps=args.inner_steps * args.rounds,
            inner=inner_config(float(method[4:]), args), eval_every=args.inner_steps,
        )
        result = simulate_ddp(task, config, on_eval=progress(method), initial_theta=theta0)
    else:
        variant, _, exchange = method.partition("@")
        codec, error_feedback = VARIANTS[variant]
        config = DiLoCoConfig(
            workers=args.workers, rounds=args.rounds, inner_steps=args.inner_steps,
            inner=inner_config(args.inner_lr, args), codec=codec, error_feedback=error_feedback,
            aggregator=args.aggregator, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
            exchange=exchange or "allgather", shard_values=args.shard_values,
        )
        result = simulate_diloco(task, config, on_round=progress(method), initial_theta=theta0)
    return result, time.process_time() - started


def make_task(args: argparse.Namespace, warm: bool = False):
    """The task a simulation trains; for llama the warm start's (`warm`) reads shards of its own."""
    if args.task == "llama":
        return llama_stream(args, warm)
    return get_task("synthetic-lm", {"context": args.context, "eval_sequences": args.eval_sequences})


def llama_corpus(args: argparse.Namespace):
    from _corpus import stdlib_corpus  # synthetic-lm runs need no tokenizers

    return stdlib_corpus(vocab_size=args.vocab, shard_tokens=args.shard_tokens)


def llama_task(args: argparse.Namespace, corpus):
    """The LlamaTask of the run, its held-out shards attached (what it evaluates on)."""
    config = {**args.llama_model, "vocab_size": corpus.index.vocab_size, "max_position_embeddings": args.context,
              "sequence_length": args.context, "dataset": corpus.dataset_id.hex(),
              "eval_sequences": args.eval_sequences}
    task = get_task("llama", config)
    task.attach_dataset(corpus.index, corpus.heldout_shards())
    return task


def warm_shard_count(args: argparse.Namespace) -> int:
    """Train shards set aside for the warm start: enough for each worker's warm steps."""
    per_worker = math.ceil(args.warm_steps * args.batch * (args.context + 1) / args.shard_tokens)
    return args.workers * max(1, per_worker)


def llama_stream(args: argparse.Namespace, warm: bool) -> PackedStream:
    corpus = llama_corpus(args)
    shards = corpus.train_shards()
    # A fixed draw of train shards for the warm start (the same for every run seed), the rest for
    # the compared phase: the warm start's tokens are its own, as synthetic-lm's are.
    order = seeded_rng(RESERVE_TAG).permutation(len(shards))
    reserved = warm_shard_count(args) if args.warm_steps else 0
    if reserved + args.workers > len(shards):
        raise SystemExit(f"the corpus has {len(shards)} train shards: too few for {reserved} warm-start shards "
                         f"and {args.workers} workers")
    chosen = order[:reserved] if warm else order[reserved:]
    return PackedStream(llama_task(args, corpus), [shards[i] for i in sorted(chosen)], args.workers)


class PackedStream:
    """The llama task with a training stream: `batch(run_seed, i, t, B)` is worker i's step-t batch
    of windows of the packed train shards it was given; model and evaluation are the LlamaTask's
    (on the held-out shards).

    The shards are dealt out among the workers by the run seed (a seeded permutation, worker i
    taking every `workers`-th shard of it from position i: disjoint, each a mix of the corpus);
    each worker's shards, concatenated, are cut into windows of context + 1 tokens read in order,
    B a step, starting over after the last (each token once per epoch). Deterministic in
    (run_seed, i, t): the same batch for DDP's worker i at step t and DiLoCo's at inner step t.
    """

    name = "llama"

    def __init__(self, task, shards: list[np.ndarray], workers: int) -> None:
        self.task = task
        self.config = task.config
        self.shards = shards
        self.workers = workers
        self.window = task.context + 1
        self.tokens = sum(len(shard) for shard in shards)
        self._windows: dict[tuple[int, int], torch.Tensor] = {}

    def build_model(self, seed: int):
        return self.task.build_model(seed)

    def evaluate(self, model, batch_size: int = 16):
        return self.task.evaluate(model, batch_size)

    def windows(self, run_seed: int, worker: int) -> torch.Tensor:
        key = (run_seed, worker)
        if key not in self._windows:
            order = seeded_rng(STREAM_TAG, run_seed).permutation(len(self.shards))
            mine = np.concatenate([self.shards[i] for i in order[worker % self.workers :: self.workers]])
            count = len(mine) // self.window
            self._windows[key] = torch.from_numpy(mine[: count * self.window].astype(np.int64)).view(count, self.window)
        return self._windows[key]

    def batch(self, run_seed: int, peer_index: int, step: int, batch_size: int):
        windows = self.windows(run_seed, peer_index)
        rows = torch.arange(step * batch_size, (step + 1) * batch_size) % len(windows)
        sequences = windows[rows]
        return sequences[:, :-1], sequences[:, 1:]


def main() -> None:
    args = parse_args()
    if args.task == "llama":
        llama_corpus(args)  # made and cached once, before the simulations' processes load it
    task = make_task(args)
    only = args.only.split(",")
    ddp_methods = [f"ddp@{lr:g}" for lr in args.ddp_lrs] if "ddp" in only else []
    exchanges = {"allgather": [""], "sharded": ["@sharded"], "both": ["", "@sharded"]}[args.exchange]
    methods = ddp_methods + [method + suffix for method in VARIANTS if method in only for suffix in exchanges]
    started = time.process_time()
    warm = warm_start(args)
    warm_cpu = time.process_time() - started
    theta0 = None if warm is None else warm.theta
    # Each method is an independent, deterministic simulation: running them side by side in
    # processes changes nothing but the wall time.
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = pool.map(run_method, methods, [args] * len(methods), [theta0] * len(methods))
        outcomes = dict(zip(methods, runs))
    # The baseline is DDP at its best lr: DiLoCo is compared against DDP tuned as well as it.
    ddp_method = min(ddp_methods, key=lambda method: outcomes[method][0].loss, default=None)
    ddp = outcomes[ddp_method][0] if ddp_method else None
    rows = [row(method, result, ddp, seconds) for method, (result, seconds) in outcomes.items()]
    for entry, method in zip(rows, outcomes):
        if method.endswith("@sharded") and method.removesuffix("@sharded") in outcomes:
            entry["sharded_vs_allgather"] = outcomes[method][0].loss / outcomes[method.removesuffix("@sharded")][0].loss
    steps = args.inner_steps * args.rounds
    meta = {
        **machine(),
        "task": {"name": task.name, **task.config},
        **(llama_meta(args, task, warm) if args.task == "llama" else
           {"entropy_rate": task.entropy_rate(), "floor": task.floor()}),
        "workers": args.workers,
        "inner_steps": args.inner_steps,
        "rounds": args.rounds,
        "ddp_steps": steps,
        "warm_start": None if warm is None else {
            "steps": args.warm_steps, "method": "ddp", "lr": WARM_LR, "warmup_steps": 20,
            "run_seed": WARM_SEED, "samples": warm.samples, "eval_loss": warm.loss,
            "cpu_s": round(warm_cpu, 1),
            "note": "shared θ0 for every method; its samples are not in the rows' counts",
        },
        "inner": asdict(inner_config(args.inner_lr, args)),
        "ddp_lrs": args.ddp_lrs,
        "baseline": ddp_method,
        "outer": {"lr": args.outer_lr, "momentum": args.outer_momentum, "nesterov": True},
        "aggregator": args.aggregator,
        "ddp_bytes": "4 bytes x params per step (a ring all-reduce sends ~2x that)",
        "cpu": "2 cores shared with other jobs; cpu_s is each simulation's own CPU time",
        "jobs": args.jobs,
        "quick": args.quick,
        "exchange": args.exchange,
        "shard_values": args.shard_values,
    }
    report("diloco_vs_ddp", rows, meta)


def llama_meta(args: argparse.Namespace, task: PackedStream, warm) -> dict:
    """What the llama rows were measured on: the model, the corpus, the data each phase read."""
    corpus = llama_corpus(args)
    model = task.build_model(0)
    tokens = args.workers * args.inner_steps * args.rounds * args.batch * (args.context + 1)
    return {
        "model": {**args.llama_model, "vocab_size": corpus.index.vocab_size, "context": args.context,
                  "params": sum(p.numel() for p in model.parameters())},
        "corpus": corpus.facts,
        "data": {
            "compared_train_tokens": task.tokens, "warm_start_train_tokens": None if warm is None else
            warm_shard_count(args) * args.shard_tokens,
            "tokens_per_method": tokens, "epochs": tokens / task.tokens,
            "stream": "train shards dealt to workers by the run seed, disjoint; consecutive windows of "
                      "context+1 tokens, batch windows a step (PackedStream)",
            "eval": f"{len(task.task.eval_inputs)} windows of {args.context} targets spread over the "
                    f"{corpus.facts['heldout_shards']} held-out shards",
        },
        "eval_loss_unit": "nats/token (BPE tokens; mean cross-entropy over the held-out windows)",
        "bytes_per_token": corpus.facts["bytes"] / corpus.facts["tokens"],
    }


def row(method: str, result, ddp, cpu_seconds: float) -> dict:
    out = {
        "method": method if method.startswith("ddp@") else f"diloco-{method}",
        "eval_loss": result.loss,
        **({} if result.floor is None else {"above_floor": result.loss - result.floor}),
        "samples": result.samples,
        "bytes_per_worker": result.bytes_per_worker,
    }
    if ddp is not None:
        out["loss_vs_ddp"] = result.loss / ddp.loss
        out["bytes_reduction"] = ddp.bytes_per_worker / result.bytes_per_worker
        if method in TARGETS:  # allgather's; sharded is held to allgather's loss instead
            max_ratio, min_reduction = TARGETS[method]
            met = out["loss_vs_ddp"] <= max_ratio and out["bytes_reduction"] >= min_reduction
            out["target"] = f"≤{max_ratio}x loss, ≥{min_reduction}x fewer bytes: {'met' if met else 'MISSED'}"
    out["cpu_s"] = round(cpu_seconds, 1)
    return out


if __name__ == "__main__":
    main()
