"""Benchmark: the `connectivity` scenario at scale (real py-libp2p hosts over the simulated network).

    .venv/bin/python bench/netsim_connectivity.py [--nodes 100 200 500 1000] [--seed 1]

Each size runs in a fresh child process (so that its peak memory is its
own). Prints, per run: wall seconds, CPU seconds of the run (the steadier
number on a shared machine), peak RSS (`ru_maxrss` of the child) and the RSS
it had before the run (imports: py-libp2p, and torch, which the scenario
registry imports for the `checkpoint` scenario), virtual seconds simulated,
virtual seconds per wall second and per CPU second, connections attempted,
and the gossip delivery ratio; one JSON line, then a markdown table.

Where the time goes (cProfile and a trio instrument): trio's scheduler and
cancel scopes (py-libp2p yields often: every lock, every frame), then
py-libp2p's per-connection and per-frame work (Yamux frame handling,
multistream negotiation, Identify on every new connection, Noise, and
multiaddr/base58 parsing scattered through it), a few percent the simulator,
and at 1,000 nodes the garbage collector (`netsim.collector` pauses it and
collects by growth). What each speed-up (`netsim.libp2p_chores`,
`netsim.wakeups`, `netsim.collector`, memoised parsing in `netsim.transport`
and `netsim.pex`) saved, and the figures of the last runs: docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report

from locomesh.netsim.scenarios import connectivity


def rss_now_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def run_once(nodes: int, seed: int) -> dict:
    rss_before = rss_now_mib()
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = connectivity.run(nodes=nodes, seed=seed, progress=lambda line: print(f"  [{nodes}] {line}", file=sys.stderr))
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    virtual = result["summary"]["virtual seconds"]
    gossip = {row[0]: row[1] for row in result["tables"][2]["rows"]}
    return {
        "nodes": nodes,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "rss_before_MiB": round(rss_before, 1),
        "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "virtual_s": virtual,
        "virtual_per_wall_s": round(virtual / wall, 3),
        "virtual_per_cpu_s": round(virtual / cpu, 3),
        "connection_attempts": result["summary"]["connection attempts (all, incl. libp2p's own)"],
        "mesh_components": result["summary"]["flood mesh components"],
        "largest_component": result["summary"]["largest flood mesh component"],
        "isolated_nodes": result["summary"]["nodes without flood neighbours"],
        "isolated_by_nat": result["summary"]["nodes without flood neighbours, by NAT type"],
        "delivery_ratio": gossip["delivery ratio"],
    }


def run_in_child(nodes: int, seed: int) -> dict:
    """`run_once` in a fresh interpreter; its progress goes to our stderr, its row comes back as JSON."""
    command = [sys.executable, __file__, "--one", str(nodes), "--seed", str(seed)]
    finished = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size, print its row
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # py-libp2p logs every failed dial at INFO/WARNING
    if args.one is not None:
        print(json.dumps(run_once(args.one, args.seed)))
        return
    load_before = os.getloadavg()[0]  # the machine is shared: wall time says more when this is low
    rows = [run_in_child(nodes, args.seed) for nodes in args.nodes]
    meta = {**machine(), "seed": args.seed, "target_wall_s_at_1000": 120, "load_average_before": load_before}
    report("netsim_connectivity", rows, meta)


if __name__ == "__main__":
    main()
