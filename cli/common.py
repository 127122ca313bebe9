"""What the `locomesh` subcommands share: the data dir argument and one-line failures."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locomesh.node.config import resolve_data_dir

from .client import DEFAULT_TIMEOUT, EXIT_ERROR, EXIT_NO_DAEMON, EXIT_OK, DaemonNotRunning, RpcCallError, RpcClient


def add_run_action(subparsers: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    """A new action `name` of the `run` command, whose module (`run_cmd`) must be registered before
    the caller's in `main._subcommand_modules()`; its parser, with RUN_ID, --data-dir and --json."""
    run_parser = subparsers.choices.get("run")
    if run_parser is None:
        raise RuntimeError(f"the `run {name}` action must be registered after run_cmd, which owns the `run` command")
    actions = next(a for a in run_parser._actions if isinstance(a, argparse._SubParsersAction))
    action = actions.add_parser(name, help=help)
    action.add_argument("run_id", metavar="RUN_ID", help="the run's full ID")
    add_data_dir_argument(action)
    action.add_argument("--json", action="store_true", help="print JSON")
    return action


def add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the node's data dir (default: $LOCOMESH_DATA_DIR, else the platform's user data dir)",
    )


def data_dir_of(args: argparse.Namespace) -> Path:
    return resolve_data_dir(args.data_dir, os.environ)


def fail(message: str, status: int) -> int:
    """Print `message` as one line on stderr and return `status` (the exit status)."""
    print(f"locomesh: {message}", file=sys.stderr)
    return status


def no_daemon(error: Exception) -> int:
    return fail(f"{error} (start one with: locomesh node start)", EXIT_NO_DAEMON)


def show_call(
    args: argparse.Namespace,
    method: str,
    as_table: Callable[[Any], str],
    *,
    params: dict[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Call `method` on the daemon of `args`' data dir; print the result as JSON (`--json`) or a table."""
    try:
        result = RpcClient.for_data_dir(data_dir_of(args), timeout=timeout).call(method, params)
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return fail(f"{method} failed: {error.message}", EXIT_ERROR)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else as_table(result))
    return EXIT_OK


def peer_name(key_hex: str) -> str:
    """A member's public key (hex, as the RPC and the audit give it) as its peer ID, the name the
    CLI shows peers by."""
    from locomesh.protocol import peer_id_from_public_key

    return peer_id_from_public_key(bytes.fromhex(key_hex))
