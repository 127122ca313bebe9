"""Benchmark: netsim `nat`, pair connectivity by NAT type with the daemon's real NAT traversal.

    .venv/bin/python bench/netsim_nat.py [--nodes 30] [--seed 1] [--pairs-per-type-pair 4] [--upgrade-wait 60]

Runs the scenario (public relays in a ring; nodes of every NAT type running
the reachability check, relay v2 reservations and DCUtR over the simulated
transport; pairs connect as the daemon does) and prints one row per NAT-type
pair: how many pairs ended direct, hole-punched, relayed or not at all, and
the median virtual seconds to the direct connection. `meta` has the issue's
figures with their targets: the share of NATed pairs connected (target 100%),
the share upgraded to direct where the NAT model allows it (target >= 90%),
time to the first connection; and the wall and CPU seconds of the run.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report  # noqa: E402

from locomesh.netsim.scenarios import nat  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pairs-per-type-pair", type=int, default=4)
    parser.add_argument("--upgrade-wait", type=float, default=60.0)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # py-libp2p logs every failed punch; the report counts outcomes
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = nat.run(
        nodes=args.nodes, seed=args.seed, progress=lambda line: print(f"  {line}", file=sys.stderr),
        pairs_per_type_pair=args.pairs_per_type_pair, upgrade_wait=args.upgrade_wait,
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    pairs = result["tables"][0]
    rows = [dict(zip(pairs["columns"], row)) for row in pairs["rows"]]
    summary = result["summary"]
    connected, direct = summary["NATed pairs connected (share)"], summary["direct where the NATs allow it (share)"]
    meta = {
        **machine(), "seed": args.seed, "nodes": args.nodes, "relays": summary["relays"],
        "pairs": summary["pairs tried"], "outcomes": summary["outcomes"],
        "natted_pairs_connected": connected, "natted_target_met": connected == 1.0,
        "direct_where_allowed": direct, "direct_target_met": direct is not None and direct >= 0.9,
        "first_connection_p50_s": summary["time to first connection p50 (s)"],
        "first_connection_p90_s": summary["time to first connection p90 (s)"],
        "first_connection_max_s": summary["time to first connection max (s)"],
        "virtual_s": summary["virtual seconds"], "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "targets": "NATed pairs connected 100%; direct where the NAT types allow it >= 90%",
    }
    report("netsim_nat", rows, meta)


if __name__ == "__main__":
    main()
