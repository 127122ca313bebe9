"""Benchmark: netsim `checkpoint`, the multi-source figure (k providers, each behind a limited uplink).

    .venv/bin/python bench/netsim_checkpoint.py [--nodes 20] [--seed 1] [--probe-mib 64] [--uplink-mbit 100]

Runs the scenario (a seeder and joiners that find providers in the DHT, then
k = 1..4 providers of one checkpoint, each with `--uplink-mbit` up) and prints
one row per k: the virtual seconds from the first chunk request to the last
chunk stored, the rate, and the speedup over one provider (target: at least
0.8 k). The rates are virtual-time figures (the real node code over the
simulated links), so they do not depend on this machine's load; the wall
and CPU seconds of the whole run are in `meta`. The checkpoint data plane
(a raw TCP side channel) does not exist in netsim: every byte goes over
libp2p (Noise + Yamux) streams.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import machine, report

from locomesh.netsim.scenarios import checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--probe-mib", type=int, default=64)
    parser.add_argument("--uplink-mbit", type=float, default=100.0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = checkpoint.run(
        nodes=args.nodes, seed=args.seed, progress=lambda line: print(f"  {line}", file=sys.stderr),
        probe_size=args.probe_mib * 1024 * 1024, probe_chunk_size=1024 * 1024, uplink=args.uplink_mbit * checkpoint.MEGABIT,
    )
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    probe = result["tables"][1]
    rows = [
        {"k": row[0], "virtual_s": row[1], "MB_per_s": row[2], "speedup": row[3], "speedup_per_k": row[4],
         "target_met": row[4] >= 0.8, "chunks_per_provider": row[5]}
        for row in probe["rows"]
    ]
    summary = result["summary"]
    meta = {
        **machine(), "seed": args.seed, "nodes": args.nodes, "probe_MiB": args.probe_mib, "uplink_Mbit_s": args.uplink_mbit,
        "swarm_joiners_done": f"{summary['joiners done']}/{summary['joiners']}",
        "swarm_download_p50_s": summary["download time p50 s"],
        "seeder_share_of_chunks": summary["share of chunks served by the seeder"],
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "target": "speedup >= 0.8 k for k <= 4",
    }
    report("netsim_checkpoint", rows, meta)


if __name__ == "__main__":
    main()
