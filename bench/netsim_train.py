"""Benchmark: netsim `train`, the compute-share figure (32 nodes, 100 Mbit/s links, 50 ms one way).

    .venv/bin/python bench/netsim_train.py [--nodes 8 16 32] [--seed 0] [--rounds 3] [--step-seconds 0.2]
        [--inner-steps 500] [--payload-bytes N] [--delayed-updates]

Runs the daemon's real round protocol (CRDT commits and votes, payload exchange as checkpoints,
certificates, syncs) on N simulated nodes whose training costs `inner_steps x step_seconds` of
virtual time (100 s per round by default), and prints one row per swarm size: the compute share
of the nodes (modelled training seconds over the virtual seconds from a node's first training to
the last round; target >= 0.9), the round time (rounds after the first, which also holds the
joins), how many rounds every node finished, whether all nodes hold one state hash, and the wall
and CPU seconds the simulation took on this (shared) machine. `--delayed-updates` runs the
swarm with one-round-delayed outer updates (round r+1 trains while round r is exchanged; target
>= 0.95).

The payload defaults to the size of a real one: the default task's model, int8-encoded (a
seeded Gaussian pseudo-gradient through `training.codec`; zstd makes the size depend a little on
the values).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report

from locomesh.netsim.scenarios import train


def default_payload_bytes(seed: int = 0) -> tuple[int, int]:
    """(parameters of the default task's model, bytes of its int8 payload)."""
    import numpy as np  # torch is imported only when the size is not given

    from locomesh.training import codec
    from locomesh.training.tasks import get_task

    numel = sum(parameter.numel() for parameter in get_task().build_model(seed).parameters())
    pseudo_gradient = (np.random.default_rng(seed).standard_normal(numel) * 1e-3).astype(np.float32)
    return numel, len(codec.encode(pseudo_gradient, "int8"))


def measure(nodes: int, args: argparse.Namespace, payload_bytes: int) -> dict:
    """One run of the scenario at `nodes` nodes, summarised as a row."""
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = train.run(
        nodes=nodes, seed=args.seed, rounds=args.rounds, inner_steps=args.inner_steps,
        step_seconds=args.step_seconds, payload_bytes=payload_bytes, delayed_updates=args.delayed_updates,
        progress=lambda line: print(f"  [{nodes} nodes, {time.perf_counter() - wall_start:6.1f}s wall] {line}",
                                    file=sys.stderr),
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    table = result["tables"][0]
    rounds = [dict(zip(table["columns"], row)) for row in table["rows"]]
    round_times = [r["round time s"] for r in rounds if r["round time s"] is not None]
    summary = result["summary"]
    return {
        "nodes": nodes,
        "delayed updates": args.delayed_updates,
        "compute share min": summary["compute share min"],
        "compute share p50": summary["compute share p50"],
        "round time s (p50)": statistics.median(round_times) if round_times else None,
        "compute s per round": args.inner_steps * args.step_seconds,
        "rounds done by all": sum(1 for r in rounds if r["nodes done"] == nodes),
        "splits (synced)": sum(r["splits (synced)"] for r in rounds),
        "distinct hashes": len(set(result["hashes"].values())),
        "virtual s": summary["virtual seconds"],
        "wall s": round(wall, 1),
        "cpu s": round(cpu, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[32])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=500)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--payload-bytes", type=int, default=None, help="default: the default task's int8 payload")
    parser.add_argument("--delayed-updates", action="store_true", help="one-round-delayed outer updates")
    args = parser.parse_args()
    if args.payload_bytes is None:
        params, payload_bytes = default_payload_bytes(args.seed)
        stands_for = f"the default task's model ({params} parameters), int8"
    else:
        payload_bytes, stands_for = args.payload_bytes, f"a model of about {args.payload_bytes} parameters, int8"
    logging.disable(logging.CRITICAL)  # py-libp2p logs failed dials and streams; the report counts what matters
    rows = [measure(nodes, args, payload_bytes) for nodes in args.nodes]
    meta = {
        **machine(), "seed": args.seed, "rounds": args.rounds,
        "link": "100 Mbit/s up and down, 50 ms one way",
        "payload bytes": payload_bytes, "payload stands for": stands_for,
        "compute per round": f"{args.inner_steps} inner steps x {args.step_seconds:g} s",
        "target": "compute share >= 0.95" if args.delayed_updates else "compute share >= 0.9",
        "cpu": "2 cores shared with other helpers' work: wall and cpu seconds are of this machine at that time",
    }
    report("netsim_train", rows, meta)


if __name__ == "__main__":
    main()
