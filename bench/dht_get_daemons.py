"""DHT get latency on 16 separate daemons on loopback, asked over their RPC.

    .venv/bin/python bench/dht_get_daemons.py [--nodes 16] [--gets 240] [--seed 0]

Starts `--nodes` real `locomesh node start` processes (as `locomesh swarm` does: one
bootstrap node, every other node bootstrapping off it, one torch thread each), waits
until all are connected and have routing tables, and has every daemon create one
public run (`run.create`, which publishes its manifest in the DHT). Then, `--gets`
times, a random daemon is asked for a random other daemon's run with
``run.info {"refresh": true}``: the daemon sets aside what it holds (its run store
and its own DHT copy), runs `lookup_values` through the DHT and re-validates the
manifest it gets. Rows:

* ``run.info, refresh (DHT get)``: the whole call as a user sees it;
* ``run.info, local``: a daemon asked for its own run, answered from its run
  store: the RPC's own cost (HTTP on loopback, JSON), to subtract from the first row.

Unlike `bench/dht_get.py` (all hosts in one process), asker and answerer are
different processes, as they are in a real swarm; 16 daemons share this
machine's cores.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

from locomesh.cli.swarm_cmd import DEFAULT_TASK, start_swarm, stop_swarm, wait_connected

from _report import machine, report  # bench/ is on sys.path when this file runs as a script
from dht_get import _summary

SETTLE_SECONDS = 4.0  # the daemons' staggered first routing-table refreshes


def main(nodes: int, gets: int, seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="locomesh-dhtget-") as scratch:
        daemons = start_swarm(Path(scratch), nodes, log=subprocess.DEVNULL)
        try:
            wait_connected(daemons, timeout=60.0)
            time.sleep(SETTLE_SECONDS)
            runs = [_create_run(daemon, index) for index, daemon in enumerate(daemons)]
            time.sleep(1.0)  # the last puts settle
            refreshed = _measure(daemons, runs, gets, rng, refresh=True)
            local = _measure(daemons, runs, gets, rng, refresh=False)
            statuses = [daemon.rpc().call("node.status") for daemon in daemons]
            codes = stop_swarm(daemons)
        except BaseException:
            for daemon in daemons:
                daemon.stop()
            raise
    rows = [{"variant": "run.info, refresh (DHT get)", **refreshed}, {"variant": "run.info, local (RPC only)", **local}]
    meta = {
        "nodes": nodes,
        "gets": gets,
        "seed": seed,
        "routing_table_sizes": sorted(status["dht_routing_table"] for status in statuses),
        "peers_connected": sorted(status["peers_connected"] for status in statuses),
        "exit_codes": codes,
        "separate_processes": True,
        "load_1m": os.getloadavg()[0],
        **machine(),
    }
    report("dht_get_daemons", rows, meta)


def _create_run(daemon, index: int) -> str:
    params = {"task": DEFAULT_TASK, "public": True, "name": f"dht-bench-{index}", "seed": index}
    created = daemon.rpc(timeout=60.0).call("run.create", params)
    if not created.get("published"):
        raise RuntimeError(f"daemon {index} could not publish its run")
    return created["run_id"]


def _measure(daemons, runs: list[str], gets: int, rng: random.Random, *, refresh: bool) -> dict:
    """`gets` calls of run.info on a random daemon, for another daemon's run through the DHT
    (`refresh`) or for its own run, from its store; latencies in ms."""
    clients = [daemon.rpc(timeout=30.0) for daemon in daemons]
    latencies, misses = [], 0
    for _ in range(gets):
        asker, owner = rng.sample(range(len(daemons)), 2)
        owner = owner if refresh else asker
        started = time.perf_counter()
        info = clients[asker].call("run.info", {"run_id": runs[owner], "refresh": refresh})
        latencies.append((time.perf_counter() - started) * 1000)
        misses += info["run_id"] != runs[owner] or info.get("source") != ("dht" if refresh else "local")
    return {**_summary(latencies), "misses": misses}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gets", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    main(arguments.nodes, arguments.gets, arguments.seed)
