"""Training together across daemons: exchange + robust aggregation time, and bytes against DDP.

Starts N real daemons on loopback (`locomesh.cli.swarm_cmd`), creates a public run of the
default task with a model of about `--params` parameters (25M by default: 100 MB of fp32), has
every daemon join, and trains `--rounds` rounds of `--inner-steps` inner steps. Each daemon
reports per round (`run.status` history):

- exchange_s: from the last counted commit seen to the new parameters computed: fetching the
  payloads still missing (multi-source checkpoint download over the data plane, every chunk
  verified) plus the outer step (decode, validate, CenteredClip, Nesterov), in exact arithmetic;
- fetch_s: from the last counted commit seen to the last payload in hand;
- aggregate_s: the outer step alone.

Rows give the median over daemons and rounds (round 1 is left out: it includes start-up). The
target is at most half the time of hivemind 1.1.12's all-reduce (no robust aggregation) for as
many peers on the same machine (its figures: docs/measurements.md).

`--exchange` runs each count once per exchange (node/exchange/): allgather, where every daemon
fetches every payload, and sharded, where committees aggregate the shards; `exchange` in a row
names what its rounds used. Bytes: each daemon's payload per round; what each daemon actually downloaded (payload bytes,
`bytes_fetched` of its round records) and uploaded (manifests and chunks its checkpoint service
answered, over the rounds measured and round 1: `bytes_served` / rounds) per round, median and
max over daemons; and what data-parallel training sends for the same samples (4 bytes x params
per step). Memory: each daemon's RSS sampled every 0.5 s while the rounds run (the median of its
samples: its steady state), and its peak RSS (VmHWM) at the end; median and max over daemons.

    .venv/bin/python bench/round_exchange.py [--nodes 4,8] [--rounds 4] [--params 25M] [--exchange allgather,sharded]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

from locomesh.cli.swarm_cmd import create_run, join_all, start_swarm, stop_swarm, train, wait_connected

# d_model 592, 6 layers, context 32 on the 64-symbol default alphabet: 25.3M parameters.
MODELS = {"25M": {"d_model": 592, "n_layer": 6, "n_head": 8, "context": 32}, "small": {}}


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """The peak (VmHWM) or current (VmRSS) resident set size of process `pid` (Linux), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {field} for process {pid}")


class RssSampler:
    """Each daemon's current RSS every `period` seconds while training runs, in a thread: the
    steady state (the median of a daemon's samples) beside the peak that VmHWM keeps."""

    def __init__(self, pids: list[int], period: float = 0.5) -> None:
        self.pids, self.period = pids, period
        self.samples: dict[int, list[float]] = {pid: [] for pid in pids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period):
            for pid in self.pids:
                with contextlib.suppress(OSError, RuntimeError):
                    self.samples[pid].append(rss_mb(pid, "VmRSS"))

    def __enter__(self) -> "RssSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def medians(self) -> list[float]:
        return [statistics.median(values) for values in self.samples.values() if values]


def measure(nodes: int, rounds: int, inner_steps: int, model: dict, exchange: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="locomesh-bench-") as scratch:
        daemons = start_swarm(Path(scratch), nodes, log=subprocess.DEVNULL)
        try:
            wait_connected(daemons, timeout=60.0)
            settings = {"inner_steps": inner_steps, "batch_size": 1, "round_deadline_s": 600, "min_peers": nodes,
                        "eval_every": 0, "exchange": exchange, **model}
            run_id = create_run(daemons[0], settings, admitted=daemons)
            join_all(daemons, run_id)
            started = time.monotonic()
            with RssSampler([daemon.pid for daemon in daemons]) as sampler:
                statuses = train(daemons, run_id, rounds, timeout=rounds * 600.0)
            wall = time.monotonic() - started
            served = [_bytes_served(daemon.rpc().call("node.status")) for daemon in daemons]
            peaks = [rss_mb(daemon.pid) for daemon in daemons]
        finally:
            stop_swarm(daemons)
    records = [r for s in statuses for r in s["history"] if r["round"] > 1 and r["exchange_seconds"] is not None]
    payload = statistics.median(r["payload_bytes"] for r in records)
    params = statuses[0]["params"]
    # None where the daemons predate the byte counts (a run of older code, back to back)
    down = [sum(r.get("bytes_fetched") or 0 for r in s["history"]) / rounds for s in statuses]
    up = [(total or 0) / rounds for total in served]
    used = sorted({(r.get("exchange") or {}).get("mode", "allgather") for r in records})
    return {
        "nodes": nodes,
        "exchange": ",".join(used),
        "params": params,
        "rounds_measured": len({r["round"] for r in records}),
        "exchange_s_median": round(statistics.median(r["exchange_seconds"] for r in records), 3),
        "exchange_s_max": round(max(r["exchange_seconds"] for r in records), 3),
        "fetch_s_median": round(statistics.median(r["fetch_seconds"] for r in records), 3),
        "aggregate_s_median": round(statistics.median(r["aggregate_seconds"] for r in records), 3),
        "round_s_median": round(statistics.median(r["seconds"] for r in records), 3),
        "payload_MB": round(payload / 1e6, 3),
        "down_MB_per_round": round(statistics.median(down) / 1e6, 2),
        "down_MB_max": round(max(down) / 1e6, 2),
        "up_MB_per_round": round(statistics.median(up) / 1e6, 2),
        "up_MB_max": round(max(up) / 1e6, 2),
        "rss_MB_median": round(statistics.median(sampler.medians())),
        "rss_MB_median_max": round(max(sampler.medians())),
        "peak_rss_MB": round(statistics.median(peaks)),
        "peak_rss_MB_max": round(max(peaks)),
        "ddp_MB_per_round": round(4 * params * inner_steps / 1e6, 3),
        "wall_s": round(wall, 1),
    }


def _bytes_served(status: dict) -> int:
    """Payload bytes a daemon uploaded: checkpoint chunks (allgather) and shards and results (sharded)."""
    return (status["checkpoints"].get("bytes_served") or 0) + (status.get("shards") or {}).get("bytes_served", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="4,8", help="comma-separated daemon counts (default 4,8)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--inner-steps", type=int, default=1)
    parser.add_argument("--params", choices=sorted(MODELS), default="25M")
    parser.add_argument("--exchange", default="allgather,sharded",
                        help="comma-separated exchanges to measure back to back (default allgather,sharded)")
    args = parser.parse_args()
    rows = [measure(int(n), args.rounds, args.inner_steps, MODELS[args.params], exchange)
            for n in args.nodes.split(",") for exchange in args.exchange.split(",")]
    report("round_exchange", rows, {"model": args.params, "inner_steps": args.inner_steps, **machine()})


if __name__ == "__main__":
    main()
