"""`locomesh swarm`: the main job. A local swarm of daemons trains the default task together.

It starts `--nodes` daemons (default 4) as child processes on loopback, each with its own
temporary data dir; every node after the first bootstraps off the first. Node 0 creates a public
run on the default task; every node joins it by ID (the others find it through the DHT). The
swarm trains `--rounds` DiLoCo rounds while this command prints one line per certified round
(eval loss against the task's entropy floor, payload bytes, peers, time). It ends with a summary:
the loss from start to end, the bytes each peer sent against what data-parallel training would
have sent for the same samples, and whether every node holds the same parameters hash. Then it
stops every daemon over RPC and checks that each exits 0.

The steps are separate functions (`start_swarm`, `wait_connected`, `stop_swarm`, `train`) that
the tests and benchmarks reuse.
"""

from __future__ import annotations

import argparse
import os
import signal
from concurrent.futures import ThreadPoolExecutor
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from .client import EXIT_ERROR, EXIT_OK, DaemonNotRunning, RpcCallError
from .common import fail, plural
from .daemon_process import DaemonError, DaemonProcess

CONNECT_TIMEOUT = 20.0
POLL_SECONDS = 0.5
RUN_NOT_FOUND = -32004  # locomesh.node.runs.registry.RUN_NOT_FOUND (no daemon imports here)
DEFAULT_TASK = "synthetic-lm"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("swarm", help="start a local swarm of daemons and train the default task together")
    parser.add_argument("--nodes", type=int, default=4, choices=range(1, 9), metavar="N", help="daemons (1-8, default 4)")
    parser.add_argument("--rounds", type=int, default=6, metavar="R", help="rounds to train (default 6)")
    parser.add_argument("--inner-steps", type=int, default=40, metavar="H", help="inner steps per round (default 40)")
    parser.add_argument("--deadline", type=float, default=120.0, metavar="S", help="round deadline in seconds (default 120)")
    parser.add_argument("--delayed-updates", action="store_true",
                        help="one-round-delayed outer updates: each round trains while the last one is exchanged")
    parser.add_argument("--verbose", action="store_true", help="show the daemons' logs on stderr")
    parser.set_defaults(handler=run_swarm)


def run_swarm(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.inner_steps < 1:
        return fail("swarm: --rounds and --inner-steps must be at least 1", 2)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="locomesh-swarm-") as scratch:
        daemons: list[DaemonProcess] = []
        try:
            daemons = start_swarm(Path(scratch), args.nodes, log=None if args.verbose else subprocess.DEVNULL)
            wait_connected(daemons)
            print(f"{len(daemons)} daemons up and connected on loopback", flush=True)
            settings = {"inner_steps": args.inner_steps, "round_deadline_s": args.deadline, "min_peers": len(daemons),
                        "delayed_updates": args.delayed_updates}
            run_id = create_run(daemons[0], settings, admitted=daemons)
            print(f"run {run_id} created on node 0 (public, task {DEFAULT_TASK}); every node joins it by ID", flush=True)
            join_all(daemons, run_id)
            statuses = train(daemons, run_id, args.rounds, timeout=args.rounds * args.deadline, report=print_round)
            print_summary(statuses, args.rounds, time.monotonic() - started)
            same = len(hashes_at(statuses, common_round(statuses, args.rounds))) == 1
            codes = stop_swarm(daemons)
        except (DaemonError, DaemonNotRunning, RpcCallError, OSError) as error:
            for daemon in daemons:
                daemon.stop()
            return fail(f"swarm: {error}", EXIT_ERROR)
    if any(code != 0 for code in codes):
        return fail(f"swarm: daemons exited with {codes}", EXIT_ERROR)
    if not same:
        return fail("swarm: the nodes ended with different parameters", EXIT_ERROR)
    print(f"{plural(len(daemons), 'daemon')} trained {plural(args.rounds, 'round')} together and stopped cleanly",
          file=sys.stderr)
    return EXIT_OK


def start_swarm(
    root: Path, count: int, *, log: Any = None, extra_args: dict[int, list[str]] | None = None
) -> list[DaemonProcess]:
    """Start `count` daemons under `root`; the others bootstrap off the first. Returns once all answer RPC.

    `extra_args` maps a node's index to more `node start` flags (a test adversary's `--attack`)."""
    extra_args = extra_args or {}
    # Several daemons share this machine's cores: one torch thread each, or their OpenMP threads
    # spin against each other and a round of inner steps takes many times longer (docs/measurements.md).
    # They dial one another on loopback: a node's dial-backs and punches go there only when allowed.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOCOMESH_PRIVATE_ADDRESSES": "on"}
    first = DaemonProcess(root / "node0", log=log, extra_args=extra_args.get(0, ()), env=env).start()
    status = first.wait_ready()
    daemons = [first]
    bootstrap = status["listen_addrs"][:1]
    for index in range(1, count):
        daemons.append(
            DaemonProcess(
                root / f"node{index}", bootstrap=bootstrap, log=log, extra_args=extra_args.get(index, ()), env=env
            ).start()
        )
    for daemon in daemons[1:]:
        daemon.wait_ready()
    return daemons


def wait_connected(daemons: list[DaemonProcess], timeout: float = CONNECT_TIMEOUT) -> None:
    """Wait until every daemon is connected to at least the first (the first: to all others), and
    every daemon's DHT routing table holds a peer (so that a run published now can be found)."""
    deadline = time.monotonic() + timeout
    wanted = len(daemons) - 1
    while not _connected(daemons, wanted):
        if time.monotonic() > deadline:
            raise DaemonError(f"the nodes did not connect within {timeout:g} s")
        time.sleep(0.1)


def _connected(daemons: list[DaemonProcess], wanted: int) -> bool:
    if daemons[0].rpc().call("node.status")["peers_connected"] < wanted:
        return False
    return wanted == 0 or all(daemon.rpc().call("node.status")["dht_routing_table"] >= 1 for daemon in daemons)


def create_run(creator: DaemonProcess, settings: dict[str, Any], *, seed: int = 1,
               admitted: Sequence[DaemonProcess] = ()) -> str:
    """A new public run of the default task on `creator`, with the daemons `admitted` (a say from
    their join: the swarm is one team); its ID."""
    peers = [daemon.rpc().call("node.status")["peer_id"] for daemon in admitted if daemon is not creator]
    params = {"task": DEFAULT_TASK, "settings": settings, "public": True, "name": "swarm", "seed": seed,
              "admitted": peers}
    return creator.rpc(timeout=60.0).call("run.create", params)["run_id"]


def join_all(daemons: list[DaemonProcess], run_id: str) -> None:
    """The creator joins `run_id`, then the others all at once (each finds it in the DHT)."""
    join(daemons[0], run_id)
    with ThreadPoolExecutor(max(1, len(daemons) - 1)) as pool:
        list(pool.map(lambda daemon: join(daemon, run_id), daemons[1:]))


def join(daemon: DaemonProcess, run_id: str, attempts: int = 3) -> dict:
    """`run.join` on `daemon`, asked again if the DHT did not find the run yet (it was just published)."""
    for attempt in range(attempts):
        try:
            return daemon.rpc(timeout=60.0).call("run.join", {"run_id": run_id})
        except RpcCallError as error:
            if error.code != RUN_NOT_FOUND or attempt == attempts - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def train(daemons: list[DaemonProcess], run_id: str, rounds: int, *, timeout: float, report: Any = None) -> list[dict]:
    """Wait until every daemon is done with round `rounds` (trained or synced past it); their `run.status`.

    `report(round, statuses)` is called once per round, when every daemon is done with it."""
    deadline = time.monotonic() + timeout
    reported = 0
    statuses: list[dict] = [{"history": []} for _ in daemons]
    while True:
        statuses = [_status(daemon, run_id, last) for daemon, last in zip(daemons, statuses)]
        for daemon, status in zip(daemons, statuses):
            if status.get("phase") == "failed":  # it will not train on: waiting out the timeout would hide why
                raise DaemonError(f"daemon {daemon.data_dir.name} stopped training: {status.get('error')}")
        done = min(max((record["round"] for record in status["history"]), default=0) for status in statuses)
        while reported < min(done, rounds):
            reported += 1
            if report is not None:
                report(reported, statuses)
        if reported >= rounds:
            return statuses
        if time.monotonic() > deadline:
            raise DaemonError(f"the swarm finished {reported} of {rounds} rounds within {timeout:g} s")
        time.sleep(POLL_SECONDS)


def _status(daemon: DaemonProcess, run_id: str, last: dict) -> dict:
    """The daemon's `run.status`, or `last` if its RPC is too slow to answer now (a machine that
    hosts the whole swarm can be that busy during an outer step); `DaemonError` if it died."""
    try:
        return daemon.rpc().call("run.status", {"run_id": run_id})
    except DaemonNotRunning:
        if daemon.process is not None and daemon.process.poll() is not None:
            raise DaemonError(f"daemon {daemon.data_dir.name} exited with status {daemon.process.returncode}") from None
        return last


def stop_swarm(daemons: list[DaemonProcess]) -> list[int]:
    """Ask each daemon to shut down over RPC and return their exit statuses (0 is clean). One whose
    RPC does not answer gets SIGTERM (the same clean shutdown); one that still hangs, SIGKILL."""
    for daemon in daemons:
        try:
            daemon.rpc().call("node.shutdown")
        except (DaemonNotRunning, RpcCallError):
            daemon.signal(signal.SIGTERM)
    return [_wait_or_kill(daemon) for daemon in daemons]


def _wait_or_kill(daemon: DaemonProcess) -> int:
    try:
        return daemon.wait()
    except DaemonError:
        return daemon.stop()


# --- progress and summary ------------------------------------------------------------------------


def _record(status: dict, round_number: int) -> dict | None:
    return next((record for record in status["history"] if record["round"] == round_number), None)


def common_round(statuses: list[dict], rounds: int) -> int:
    """The newest round up to `rounds` that every node has a record of (a node that fell behind
    syncs to the newest certified round and has no record of the rounds it skipped)."""
    common = set.intersection(*({record["round"] for record in status["history"]} for status in statuses))
    return max((number for number in common if number <= rounds), default=0)


def hashes_at(statuses: list[dict], round_number: int) -> set[str]:
    """The state hashes the nodes hold for round `round_number` (the swarm keeps training past it,
    so their current states may already differ by a round)."""
    return {record["state_hash"] for status in statuses if (record := _record(status, round_number))}


def print_round(round_number: int, statuses: list[dict]) -> None:
    records = [record for status in statuses if (record := _record(status, round_number)) is not None]
    if not records:
        return
    first = records[0]
    payload = max(record["payload_bytes"] for record in records)
    seconds = max(record["seconds"] for record in records)
    gap = "" if first["floor"] is None else f" (floor {first['floor']:.3f}, +{first['eval_loss'] - first['floor']:.3f})"
    print(
        f"round {round_number:>3}  eval loss {first['eval_loss']:.4f}{gap}  "
        f"payload {payload / 1024:.0f} KiB/peer  contributors {max(r['contributors'] for r in records)}  "
        f"peers {statuses[0]['peers']}  {seconds:.1f} s",
        flush=True,
    )


def print_summary(statuses: list[dict], rounds: int, seconds: float) -> None:
    """Rounds 1..`rounds` (the daemons may be a round further by now)."""
    history = [record for record in statuses[0]["history"] if record["round"] <= rounds]
    first, last = history[0], history[-1]
    peers = len(statuses)
    sent = max(sum(r["payload_bytes"] for r in status["history"] if r["round"] <= rounds) for status in statuses)
    upload = sent * (peers - 1)  # in the allgather every other peer fetches each payload once
    ddp = statuses[0]["params"] * 4 * statuses[0]["inner_steps"] * len(history)
    hashes = hashes_at(statuses, common_round(statuses, rounds))
    print()
    print(f"summary: {plural(len(history), 'round')} by {plural(peers, 'daemon')} in {seconds:.1f} s")
    print(f"  eval loss      {first['eval_loss']:.4f} after round {first['round']} -> "
          f"{last['eval_loss']:.4f} after round {last['round']}"
          + ("" if last["floor"] is None else f" (entropy floor {last['floor']:.4f})"))
    print(f"  bytes per peer {upload / 1e6:.2f} MB uploaded at most ({sent / 1e6:.2f} MB of payloads), "
          f"data-parallel would send {ddp / 1e6:.1f} MB of fp32 gradients ({ddp / max(upload, 1):.0f}x more)")
    same = f"the same hash on every node: {next(iter(hashes))[:16]}" if len(hashes) == 1 else f"{len(hashes)} different hashes"
    print(f"  parameters     {same}")
