"""`locomesh swarm`: start a small local swarm of daemons, show it, and stop it.

Today (before training exists) it is an honest smoke test of the node: it
starts `--nodes` daemons (default 3) as child processes, each with its own
temporary data dir, on loopback; every node after the first bootstraps off
the first; it waits until each RPC answers and every node sees the others,
prints each status table and the first node's peers, asks every daemon to
shut down over RPC, checks that each exits 0, and exits 0 itself.

The steps are separate functions (`start_swarm`, `wait_connected`,
`stop_swarm`) so that the training swarm of a later issue can put "create a
run, join it, train N rounds, compare checkpoints" between start and stop.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .client import EXIT_ERROR, EXIT_OK
from .common import fail
from .daemon_process import DaemonError, DaemonProcess
from .status_cmd import format_peers, format_status

CONNECT_TIMEOUT = 20.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("swarm", help="start a small local swarm of daemons, show it, stop it")
    parser.add_argument(
        "--nodes", type=int, default=3, choices=range(1, 9), metavar="N", help="daemons to start (1-8, default 3)"
    )
    parser.add_argument("--verbose", action="store_true", help="show the daemons' logs on stderr")
    parser.set_defaults(handler=run_swarm)


def run_swarm(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="locomesh-swarm-") as scratch:
        daemons: list[DaemonProcess] = []
        try:
            daemons = start_swarm(Path(scratch), args.nodes, log=None if args.verbose else subprocess.DEVNULL)
            wait_connected(daemons)
            for index, daemon in enumerate(daemons):
                print(f"== node {index} ({daemon.data_dir.name}) ==")
                print(format_status(daemon.rpc().call("node.status")))
                print()
            print("== peers of node 0 ==")
            print(format_peers(daemons[0].rpc().call("node.peers")))
            codes = stop_swarm(daemons)
        except (DaemonError, OSError) as error:
            for daemon in daemons:
                daemon.stop()
            return fail(f"swarm: {error}", EXIT_ERROR)
    if any(code != 0 for code in codes):
        return fail(f"swarm: daemons exited with {codes}", EXIT_ERROR)
    print(f"\n{len(daemons)} node(s) started, connected, and stopped cleanly", file=sys.stderr)
    return EXIT_OK


def start_swarm(root: Path, count: int, *, log: Any = None) -> list[DaemonProcess]:
    """Start `count` daemons under `root`; the others bootstrap off the first. Returns once all answer RPC."""
    first = DaemonProcess(root / "node0", log=log).start()
    status = first.wait_ready()
    daemons = [first]
    bootstrap = status["listen_addrs"][:1]
    for index in range(1, count):
        daemons.append(DaemonProcess(root / f"node{index}", bootstrap=bootstrap, log=log).start())
    for daemon in daemons[1:]:
        daemon.wait_ready()
    return daemons


def wait_connected(daemons: list[DaemonProcess], timeout: float = CONNECT_TIMEOUT) -> None:
    """Wait until every daemon is connected to at least the first (the first: to all others)."""
    deadline = time.monotonic() + timeout
    wanted = len(daemons) - 1
    while daemons[0].rpc().call("node.status")["peers_connected"] < wanted:
        if time.monotonic() > deadline:
            raise DaemonError(f"the nodes did not connect within {timeout:g} s")
        time.sleep(0.1)


def stop_swarm(daemons: list[DaemonProcess]) -> list[int]:
    """Ask each daemon to shut down over RPC and return their exit statuses (0 is clean)."""
    for daemon in daemons:
        daemon.rpc().call("node.shutdown")
    return [daemon.wait() for daemon in daemons]
