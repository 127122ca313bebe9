"""Benchmark: the `connectivity` scenario at scale (real py-libp2p hosts over the simulated network).

    .venv/bin/python bench/netsim_connectivity.py [--nodes 1000] [--seed 1]

Prints, per run: wall seconds, CPU seconds of this process (the steadier
number on a shared machine), peak RSS (`ru_maxrss`), virtual seconds
simulated, virtual seconds per wall second, connections attempted, and the
gossip delivery ratio; one JSON line, then a markdown table.

Where the time goes (profiled at 30-50 nodes with a trio instrument): almost
all of it is py-libp2p's per-connection work (Yamux frame handling,
multistream negotiation, Identify on every new connection, Noise
handshakes, the swarm's dial and retry machinery), not the simulator; at
1000 nodes a run makes ~5,000 connections and ~15,000 connection attempts.
A lighter mode was considered and not built: the only large saving is to
skip py-libp2p (services over bare framed `SimStream`s, no Noise, Yamux or
Identify), which would stop exercising the real node code that the
simulator exists to test; fewer connections per node (`degree`) is the
honest knob, and it changes what is measured.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report  # noqa: E402

from locomesh.netsim.scenarios import connectivity  # noqa: E402


def run_once(nodes: int, seed: int) -> dict:
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = connectivity.run(nodes=nodes, seed=seed, progress=lambda line: print(f"  [{nodes}] {line}", file=sys.stderr))
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    virtual = result["summary"]["virtual seconds"]
    gossip = {row[0]: row[1] for row in result["tables"][2]["rows"]}
    return {
        "nodes": nodes,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "virtual_s": virtual,
        "virtual_per_wall_s": round(virtual / wall, 3),
        "virtual_per_cpu_s": round(virtual / cpu, 3),
        "connection_attempts": result["summary"]["connection attempts (all, incl. libp2p's own)"],
        "mesh_components": result["summary"]["flood mesh components"],
        "delivery_ratio": gossip["delivery ratio"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # py-libp2p logs every failed dial at INFO/WARNING
    rows = [run_once(nodes, args.seed) for nodes in args.nodes]
    report("netsim_connectivity", rows, {**machine(), "seed": args.seed, "target_wall_s_at_1000": 120})


if __name__ == "__main__":
    main()
