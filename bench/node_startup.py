"""How fast a daemon becomes usable, and how much memory it holds when idle.

For each of `--starts` runs: launch ``locomesh node start`` on a fresh data
dir (the first start of each also creates the identity), and time from the
launch until `node.status` answers over the RPC (the moment a client can use
the daemon). Then let it idle for `--idle` seconds and read its resident set
size from /proc. Targets: ready in 3 s or less (median), idle RSS 200 MiB or
less, and torch not imported.

    .venv/bin/python bench/node_startup.py [--starts 5] [--idle 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

from locomesh.cli.daemon_process import DaemonProcess

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc status")


def one_start(data_dir: Path, idle: float) -> dict:
    with DaemonProcess(data_dir) as daemon:
        daemon.wait_ready()
        ready_s = time.monotonic() - daemon.started_at
        time.sleep(idle)
        facts = daemon.rpc().call("node.debug")
        rss = rss_bytes(daemon.pid)
        stop_started = time.monotonic()
        code = daemon.stop()
        stop_s = time.monotonic() - stop_started
    return {
        "ready_s": ready_s,
        "idle_rss_MiB": rss / MiB,
        "stop_s": stop_s,
        "exit": code,
        "torch_imported": facts["torch_imported"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--idle", type=float, default=2.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="locomesh-bench-") as scratch:
        for index in range(args.starts):
            rows.append({"start": index, "identity": "new"} | one_start(Path(scratch) / f"node{index}", args.idle))
            rows.append({"start": index, "identity": "reused"} | one_start(Path(scratch) / f"node{index}", args.idle))
    ready = [row["ready_s"] for row in rows]
    rss = [row["idle_rss_MiB"] for row in rows]
    summary = {
        "start": "median",
        "identity": "all",
        "ready_s": statistics.median(ready),
        "idle_rss_MiB": statistics.median(rss),
        "stop_s": statistics.median(row["stop_s"] for row in rows),
        "exit": max(row["exit"] for row in rows),
        "torch_imported": any(row["torch_imported"] for row in rows),
    }
    meta = machine() | {
        "starts": len(rows),
        "idle_s": args.idle,
        "target_ready_s": 3.0,
        "target_idle_rss_MiB": 200,
        "max_ready_s": max(ready),
        "max_idle_rss_MiB": max(rss),
    }
    report("node_startup", rows + [summary], meta)


if __name__ == "__main__":
    main()
