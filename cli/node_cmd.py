"""`locomesh node start` (run the daemon in the foreground) and `locomesh node stop`.

Exit statuses of `node start`: 0 after a clean shutdown; 2 for a bad
configuration, a data dir another daemon holds, an unusable key, or a listen
or RPC address something else listens on ("address in use: ADDR") (one line
on stderr, no traceback); 1 if it cannot listen for another reason (one line)
or fails while running (its log says why); 128 + N when a second signal N cut
the shutdown short.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from locomesh.node.datadir import DataDir

from .client import EXIT_ERROR, EXIT_OK, EXIT_USAGE, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_data_dir_argument, data_dir_of, fail, no_daemon

STOP_WAIT = 15.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    node = subparsers.add_parser("node", help="run or stop the node daemon")
    commands = node.add_subparsers(dest="node_command", metavar="COMMAND", required=True)

    start = commands.add_parser("start", help="run the daemon in the foreground")
    add_data_dir_argument(start)
    start.add_argument("--config", metavar="FILE", help="TOML config file (default: <data dir>/config.toml if present)")
    start.add_argument("--listen", metavar="MULTIADDR", action="append", help="address to listen on (repeatable)")
    start.add_argument(
        "--bootstrap", metavar="MULTIADDR", action="append", help="peer to connect to, with /p2p/ID (repeatable)"
    )
    start.add_argument("--rpc-port", type=int, metavar="N", help="local RPC port on 127.0.0.1 (0: any free port)")
    start.add_argument("--log-format", choices=("text", "json"), help="log lines on stderr (default: text)")
    start.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="default: info")
    start.add_argument("--attack", metavar="NAME", help="test adversary: commit the named attack's payloads instead of "
                       "its own (e.g. sign_flip_x100; a wrong name is refused with the list of attacks)")
    start.add_argument(
        "--no-upnp", action="store_true", help="do not ask the home router to forward our port (NAT-PMP, UPnP)"
    )
    start.add_argument(
        "--archive", action="store_true",
        help="keep every payload of every round of the runs this node trains in, so `run audit` can replay them; "
             "costs about (contributors x payload size) of disk per round, never freed (int8: ~1 byte per "
             "parameter per contributor)",
    )
    start.add_argument(
        "--device", metavar="SPEC",
        help="where inner steps run: auto (default: a GPU if there is one), cpu, cuda, cuda:N or mps",
    )
    start.add_argument(
        "--local-workers", type=int, metavar="N",
        help="processes training data-parallel on this node (default 0: one per GPU for auto and cuda; "
             "with cpu, N CPU processes)",
    )
    start.set_defaults(handler=start_daemon)

    stop = commands.add_parser("stop", help="ask the running daemon to shut down")
    add_data_dir_argument(stop)
    stop.set_defaults(handler=stop_daemon)


def start_daemon(args: argparse.Namespace) -> int:
    from locomesh.node.config import ConfigError, load_config, unknown_variables
    from locomesh.node.logs import configure_logging

    flags = {
        "listen": args.listen,
        "bootstrap": args.bootstrap,
        "rpc_port": args.rpc_port,
        "log_format": args.log_format,
        "log_level": args.log_level,
        "attack": args.attack,
        "port_mapping": "off" if args.no_upnp else None,
        "archive": "on" if args.archive else None,
        "device": args.device,
        "local_workers": args.local_workers,
    }
    try:
        config = load_config(data_dir=args.data_dir, config_file=args.config, flags=flags)
    except ConfigError as error:
        return fail(f"configuration: {error}", EXIT_USAGE)
    configure_logging(level=config.log_level, fmt=config.log_format)
    for warning in unknown_variables(os.environ):
        logging.getLogger("locomesh.node.config").warning("%s", warning)

    from locomesh.node.daemon import run_daemon  # the heavy import (libp2p), only now
    from locomesh.node.datadir import DataDirError, IdentityError
    from locomesh.node.runtime import AddressInUse, ListenError

    try:
        return run_daemon(config)
    except (DataDirError, IdentityError, AddressInUse) as error:  # the user's data dir or port: theirs to change
        return fail(str(error), EXIT_USAGE)
    except ListenError as error:
        return fail(str(error), EXIT_ERROR)
    except Exception:  # noqa: BLE001 - log it whole, exit non-zero
        logging.getLogger("locomesh.node").exception("the daemon failed")
        return EXIT_ERROR


def stop_daemon(args: argparse.Namespace) -> int:
    """Ask for shutdown, then wait until the daemon has released its data dir."""
    data_dir = data_dir_of(args)
    try:
        RpcClient.for_data_dir(data_dir).call("node.shutdown")
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return fail(f"the daemon refused: {error}", EXIT_ERROR)
    deadline = time.monotonic() + STOP_WAIT
    while DataDir(data_dir).daemon_running():
        if time.monotonic() > deadline:
            return fail(f"the daemon did not stop within {STOP_WAIT:g} s", EXIT_ERROR)
        time.sleep(0.05)
    print("the daemon has stopped", file=sys.stderr)
    return EXIT_OK
