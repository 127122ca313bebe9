"""Benchmark: netsim `dht`, lookups in the real Kademlia DHT while a fifth of the nodes churn.

    .venv/bin/python bench/netsim_dht.py [--nodes 1000] [--seed 1] [--churn 0.2] [--lookups 1000]

Target (issue 7): with 1,000 nodes and 20% churn, at least 99% of 1,000
lookups succeed. Prints one row per run: success rate (all, values,
providers), lookup latency percentiles in virtual seconds, Kademlia requests
per lookup, churn events, and the machine figures (wall and CPU seconds, peak
RSS). Every node is a full py-libp2p host (Noise, Yamux, Identify) over the
simulated network, so wall time grows with the number of connections.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report

from locomesh.netsim.scenarios import dht


def run_once(nodes: int, seed: int, churn: float, lookups: int) -> dict:
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = dht.run(
        nodes=nodes, seed=seed, churn=churn, lookups=lookups,
        progress=lambda line: print(f"  [{nodes}] {line}", file=sys.stderr, flush=True),
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    summary = result["summary"]
    overall = next(row for row in result["tables"][0]["rows"] if row[0] == "all")

    def kind_rate(kind: str) -> float | None:
        rows = [row for row in result["tables"][0]["rows"] if row[0] == kind]
        total = sum(row[2] for row in rows)
        return round(sum(row[3] for row in rows) / total, 4) if total else None

    return {
        "nodes": nodes,
        "churn": churn,
        "lookups": summary["lookups"],
        "success": summary["lookup success rate"],
        "target_met": (summary["lookup success rate"] or 0) >= 0.99,
        "value_success": kind_rate("value"),
        "provider_success": kind_rate("providers"),
        "p50_s": overall[5], "p90_s": overall[6], "p99_s": overall[7],
        "requests_mean": overall[9],
        "crashes": summary["crashes"], "restarts": summary["restarts"],
        "new_joins": summary["new nodes joined during lookups"],
        "virtual_s": summary["virtual seconds"],
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "peak_rss_MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--churn", type=float, default=0.2)
    parser.add_argument("--lookups", type=int, default=0, help="0: as many as nodes")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    rows = [run_once(nodes, args.seed, args.churn, args.lookups) for nodes in args.nodes]
    report("netsim_dht", rows, {**machine(), "seed": args.seed, "target": ">= 99% of 1,000 lookups at 1,000 nodes, 20% churn"})


if __name__ == "__main__":
    main()
