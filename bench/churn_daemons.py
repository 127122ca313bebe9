"""Churn between real daemons on loopback (issue #33): rounds go on while members die and come back.

Starts N daemons (`locomesh.cli.swarm_cmd`), creates a run of the default task (the run's own
600 s round deadline) and has every daemon join. Then, every `--every` seconds on average, one
daemon other than the creator, drawn from `--seed`, is hit by one of: kill -9 and a restart on its
data dir at once (same identity), kill -9 and a restart after a pause, a clean `run leave` and a
`run join` again a little later. The creator's `run.status` is read every second; at the end:

- rounds certified over the run, and the longest gap between two certificates (seconds);
- honest members banned (every daemon is honest);
- from each restart (or join again) to the end of the first round that member then computed
  itself (its own `run.status` history), median and max.

    .venv/bin/python bench/churn_daemons.py [--nodes 6] [--minutes 20] [--every 90] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

from locomesh.cli.client import RpcCallError
from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.swarm_cmd import create_run, join, start_swarm, wait_connected


def _status(daemon: DaemonProcess, run_id: str) -> dict | None:
    try:
        return daemon.rpc().call("run.status", {"run_id": run_id})
    except (RpcCallError, OSError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=90.0, help="mean seconds between churn events")
    parser.add_argument("--inner-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="locomesh-churn-") as root:
        rows, meta = churn(Path(root), args, rng)
    report("churn_daemons", rows, {**meta, **machine()})


def churn(root: Path, args: argparse.Namespace, rng: random.Random) -> tuple[list[dict], dict]:
    log = open(root / "daemons.log", "wb")
    daemons = start_swarm(root, args.nodes, log=log)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    certified: dict[int, float] = {}
    events: list[dict] = []
    try:
        wait_connected(daemons)
        creator = daemons[0]
        bootstrap = creator.rpc().call("node.status")["listen_addrs"][:1]
        run_id = create_run(creator, {"inner_steps": args.inner_steps}, admitted=daemons)
        for daemon in daemons:
            join(daemon, run_id)
        keys = {i: d.rpc().call("node.status")["peer_id"] for i, d in enumerate(daemons)}
        started = time.monotonic()
        end = started + args.minutes * 60
        next_event = started + rng.expovariate(1 / args.every)
        last = None
        while time.monotonic() < end:
            last = _status(creator, run_id) or last
            if last is not None and last["certified"] not in certified:
                certified[last["certified"]] = time.monotonic()
            if time.monotonic() >= next_event:
                index = rng.randrange(1, len(daemons))
                kind = rng.choice(["restart", "restart later", "leave and join"])
                events.append({"at": time.monotonic() - started, "kind": kind, "node": index,
                               "peer": keys[index], "back": None})
                daemons[index] = _hit(daemons[index], kind, run_id, bootstrap, log, env, rng)
                events[-1]["back"], events[-1]["back_wall"] = time.monotonic() - started, time.time()
                next_event = time.monotonic() + rng.expovariate(1 / args.every)
            time.sleep(1.0)
        final = [_status(daemon, run_id) for daemon in daemons]
    finally:
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
        log.close()
    rounds = sorted(certified)
    gaps = [certified[b] - certified[a] for a, b in zip(rounds, rounds[1:])]
    waits = _waits(events, final)
    rows = [{
        "nodes": args.nodes, "minutes": args.minutes, "events": len(events),
        "rounds certified": len(rounds), "median gap s": round(statistics.median(gaps), 1) if gaps else None,
        "longest gap s": round(max(gaps), 1) if gaps else None,
        "honest banned": sum(1 for s in final if s and s["banned"]),
        "back to contribution median s": round(statistics.median(waits), 1) if waits else None,
        "back to contribution max s": round(max(waits), 1) if waits else None,
    }]
    return rows, {"seed": args.seed, "every_s": args.every, "inner_steps": args.inner_steps,
                  "events": [{"at": round(e["at"], 1), "kind": e["kind"], "node": e["node"], "back": round(e["back"] or 0, 1)}
                             for e in events]}


def _hit(daemon: DaemonProcess, kind: str, run_id: str, bootstrap: list[str], log, env, rng) -> DaemonProcess:
    if kind == "leave and join":
        daemon.rpc().call("run.leave", {"run_id": run_id})
        time.sleep(rng.uniform(10, 40))
        for _ in range(10):
            try:
                join(daemon, run_id)
                break
            except Exception:  # noqa: BLE001 - the run refused the join for now: try again, as a volunteer would
                time.sleep(5)
        return daemon
    daemon.process.send_signal(signal.SIGKILL)
    daemon.wait()
    if kind == "restart later":
        time.sleep(rng.uniform(20, 60))
    restarted = DaemonProcess(daemon.data_dir, bootstrap=bootstrap, log=log, env=env).start()
    restarted.wait_ready()
    return restarted


def _waits(events: list[dict], final: list[dict | None]) -> list[float]:
    """From each member's return (restart or join again) to the end of the first round it then
    computed itself (its own `run.status` history: not synced), in wall-clock seconds."""
    waits = []
    for event in events:
        status = final[event["node"]]
        done = [] if status is None else [r["finished_at"] for r in status["history"]
                                         if not r["synced"] and (r.get("finished_at") or 0) > event["back_wall"]]
        if done:
            waits.append(min(done) - event["back_wall"])
    return waits


if __name__ == "__main__":
    main()
