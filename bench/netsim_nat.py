"""Benchmark: netsim `nat`, pair connectivity by NAT kind with the daemon's real NAT traversal.

    .venv/bin/python bench/netsim_nat.py [--nodes 30] [--seed 1] [--seeds 8] [--topology homes|cgnat]
        [--pairs-per-type-pair 4] [--upgrade-wait 60] [--relays-killed 1]

Runs the scenario (public relays in a ring; nodes of every kind of the
topology running the reachability check, relay v2 reservations and hole
punching over the simulated transport; pairs connect as the daemon does; then
a relay dies and returns 30 s later) for `--seeds` seeds from `--seed` on,
and prints one row per pair of kinds: how many pairs ended direct,
hole-punched, relayed or not at all, what the NAT model says, and the time
from the first connection to the direct one. `meta` has issue #25's figures
with their targets: among pairs the model says can go direct, the share that
did (target 100%), the p90 time from the first connection to direct (target
30 s), and how many relayed links the relay's death cut and how many came
back; and the wall and CPU seconds of the run.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report

from locomesh.netsim.scenarios import nat
from locomesh.netsim.scenarios.nat_report import TARGET_DIRECT_SHARE, TARGET_TO_DIRECT_P90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--topology", default="homes", choices=["homes", "cgnat"])
    parser.add_argument("--pairs-per-type-pair", type=int, default=4)
    parser.add_argument("--upgrade-wait", type=float, default=60.0)
    parser.add_argument("--relays-killed", type=int, default=1)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # py-libp2p logs every failed punch; the report counts outcomes
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = nat.run(
        nodes=args.nodes, seed=args.seed, progress=lambda line: print(f"  {line}", file=sys.stderr),
        seeds=args.seeds, topology=args.topology, pairs_per_type_pair=args.pairs_per_type_pair,
        upgrade_wait=args.upgrade_wait, relays_killed=args.relays_killed,
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    pairs = result["tables"][0]
    rows = [dict(zip(pairs["columns"], row)) for row in pairs["rows"]]
    summary = result["summary"]
    direct = summary["direct where the model allows it (share)"]
    p90 = summary["hole-punched: first connection to direct p90 (s)"]
    meta = {
        **machine(), "seeds": summary["seeds"], "topology": args.topology, "nodes": args.nodes,
        "relays": summary["relays"], "pairs": summary["pairs tried"], "outcomes": summary["outcomes"],
        "natted_pairs_connected": summary["NATed pairs connected (share)"],
        "direct_where_model_allows": direct,
        "direct_target_met": direct is None or direct >= TARGET_DIRECT_SHARE,
        "to_direct_p50_s": summary["hole-punched: first connection to direct p50 (s)"],
        "to_direct_p90_s": p90, "to_direct_target_met": p90 is None or p90 <= TARGET_TO_DIRECT_P90,
        "first_connection_p90_s": summary["time to first connection p90 (s)"],
        "relayed_links_back_of_cut": summary["relayed links cut by the relay's death, back (of cut)"],
        "relayed_links_back_p90_s": summary["relayed links back: time from the kill p90 (s)"],
        "verdict": summary["verdict"], "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "targets": f"direct where the NAT model allows it {TARGET_DIRECT_SHARE:.0%}; first connection to direct "
                   f"p90 <= {TARGET_TO_DIRECT_P90:.0f} s",
    }
    report("netsim_nat", rows, meta)


if __name__ == "__main__":
    main()
