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
    # A test adversary (tests and CONTRIBUTING.md): commits the named attack's payloads instead of its
    # own (`training.adversary`). Not for volunteers, so not in the help.
    start.add_argument("--attack", metavar="NAME", help=argparse.SUPPRESS)
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
    start.add_argument(
        "--memory-limit", type=_size, metavar="SIZE",
        help="memory the node may use for training, e.g. 8GiB: a join of a run that needs more is refused "
             "(default 0: no limit beyond the memory available)",
    )
    _add_limit_arguments(start)
    start.set_defaults(handler=start_daemon)

    stop = commands.add_parser("stop", help="ask the running daemon to shut down")
    add_data_dir_argument(stop)
    stop.set_defaults(handler=stop_daemon)


def _size(text: str) -> int:
    """`--memory-limit`'s value in bytes (`locomesh.node.config.parse_size`)."""
    from locomesh.node.config import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_limit_arguments(start: argparse.ArgumentParser) -> None:
    """The flags of the node's resource limits: rate caps, training threads, when it trains."""
    start.add_argument("--upload-limit", metavar="RATE",
                       help="cap on everything the node sends, e.g. 10MB/s, 512KiB/s or 8Mbit/s (default 0: none)")
    start.add_argument("--download-limit", metavar="RATE",
                       help="cap on everything the node receives, as --upload-limit (default 0: none)")
    start.add_argument("--train-threads", type=int, metavar="N",
                       help="CPU threads for the inner steps (default 0: torch's default)")
    start.add_argument("--schedule", metavar="HH:MM-HH:MM", action="append",
                       help="train only within this local-time window, e.g. 22:00-07:00 (repeatable; "
                            "default: any time); outside it the node sits rounds out and stays a member")
    start.add_argument("--only-when-idle", action="store_true",
                       help="train only while other processes leave the CPU mostly idle")
    start.add_argument("--only-on-ac-power", action="store_true",
                       help="train only on mains power, where the platform tells")


def _limit_flags(args: argparse.Namespace) -> dict[str, object]:
    return {
        "upload_limit": args.upload_limit,
        "download_limit": args.download_limit,
        "train_threads": args.train_threads,
        "schedule": args.schedule,
        "only_when_idle": "on" if args.only_when_idle else None,
        "only_on_ac_power": "on" if args.only_on_ac_power else None,
    }


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
        "memory_limit": args.memory_limit,
        **_limit_flags(args),
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
    except Exception:  # log it whole, exit non-zero
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
