"""Benchmark: netsim `train`, the compute-share figure (32 nodes, 100 Mbit/s links, 50 ms one way).

    .venv/bin/python bench/netsim_train.py [--nodes 32] [--seed 0] [--rounds 3] [--step-seconds 0.2]
        [--inner-steps 500] [--payload-kib 32]

Runs the daemon's real round protocol (CRDT commits and votes, payload exchange as checkpoints,
certificates, syncs) on N simulated nodes whose training costs `inner_steps x step_seconds` of
virtual time, and prints one row per round (when it was certified, how many payloads it
aggregated, how many nodes had to sync) with the compute share of the nodes in `meta`: modelled
training seconds over the virtual seconds from a node's first training to the last round
(target >= 0.9). The figures are virtual-time figures; wall and CPU seconds of the whole run,
on a shared machine, are in `meta`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report  # noqa: E402

from locomesh.netsim.scenarios import train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=500)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--payload-kib", type=int, default=32)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # py-libp2p logs failed dials and streams; the report counts what matters
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = train.run(
        nodes=args.nodes, seed=args.seed, rounds=args.rounds, inner_steps=args.inner_steps,
        step_seconds=args.step_seconds, payload_bytes=args.payload_kib * 1024,
        progress=lambda line: print(f"  [{time.perf_counter() - wall_start:6.1f}s wall] {line}", file=sys.stderr),
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    rounds = result["tables"][0]
    rows = [dict(zip(rounds["columns"], row)) for row in rounds["rows"]]
    summary = result["summary"]
    meta = {
        **machine(), **{key: summary[key] for key in summary if key != "seed"}, "seed": args.seed,
        "distinct final state hashes": len(set(result["hashes"].values())),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpu": "2 cores shared with other helpers' work",
    }
    report("netsim_train", rows, meta)


if __name__ == "__main__":
    main()
