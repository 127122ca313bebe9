"""`locomesh run create|list|info`: make a run, list the runs this node knows, find a run by ID.

All three talk to the running daemon (``run.create``, ``run.list``,
``run.info``; see `locomesh.node.run_registry_service`). Exit status: 0 with
the answer, 1 when the daemon answers with an error (a run not found, a bad
setting), 2 for bad arguments, 3 when no daemon runs on the data dir.

``--set key=value`` values are typed the way a person means them: ``true`` /
``false``, integers, decimals, and everything else a string.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .client import EXIT_ERROR, EXIT_OK, EXIT_USAGE, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_data_dir_argument, data_dir_of, fail, no_daemon

# Looking a run up in the DHT can take a while on a large network; creating one publishes it.
RPC_TIMEOUT = 60.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="create, list and look up training runs")
    commands = parser.add_subparsers(dest="run_command", metavar="ACTION", required=True)

    create = commands.add_parser("create", help="create a run and print its ID")
    create.add_argument("--task", required=True, help="the task's name")
    create.add_argument("--name", default="", help="a label for people (not unique)")
    create.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="settings", help="a task setting (repeat)"
    )
    create.add_argument("--seed", type=int, help="the model's init seed (default: random)")
    create.add_argument("--public", action="store_true", help="publish the run in the DHT so anyone can find it by ID")
    create.set_defaults(handler=create_run)

    listing = commands.add_parser("list", help="list the runs this node created, joined or looked up")
    listing.set_defaults(handler=list_runs)

    info = commands.add_parser("info", help="show a run, found in the DHT if this node does not know it")
    info.add_argument("run_id", metavar="RUN_ID", help="the run's full ID")
    info.set_defaults(handler=show_run)

    for sub in (create, listing, info):
        add_data_dir_argument(sub)
        sub.add_argument("--json", action="store_true", help="print JSON")


def parse_setting(text: str) -> tuple[str, Any]:
    """``"key=value"`` as (key, typed value); `ValueError` without a ``=`` or a key."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set wants KEY=VALUE, not {text!r}")
    return key.strip(), _typed(raw)


def _typed(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


class _Failed(Exception):
    """The call failed and the reason was printed; `status` is the exit status."""

    def __init__(self, status: int) -> None:
        self.status = status


def _exits(handler):
    """Turn `_Failed` from `handler` into its exit status."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except _Failed as failed:
            return failed.status

    return run


@_exits
def create_run(args: argparse.Namespace) -> int:
    try:
        settings = dict(parse_setting(text) for text in args.settings)
    except ValueError as error:
        return fail(str(error), EXIT_USAGE)
    params = {"task": args.task, "settings": settings, "public": args.public, "name": args.name, "seed": args.seed}
    result = _call(args, "run.create", params)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(result["run_id"])
    return EXIT_OK


@_exits
def list_runs(args: argparse.Namespace) -> int:
    result = _call(args, "run.list", {})
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_runs(result))
    return EXIT_OK


@_exits
def show_run(args: argparse.Namespace) -> int:
    result = _call(args, "run.info", {"run_id": args.run_id})
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_run(result))
    return EXIT_OK


def _call(args: argparse.Namespace, method: str, params: dict[str, Any]) -> Any:
    """The method's result; on failure prints why and raises `_Failed`."""
    try:
        return RpcClient.for_data_dir(data_dir_of(args), timeout=RPC_TIMEOUT).call(method, params)
    except DaemonNotRunning as error:
        raise _Failed(no_daemon(error)) from None
    except RpcCallError as error:
        raise _Failed(fail(f"{method} failed: {error.message}", EXIT_ERROR)) from None


def format_runs(runs: list[dict[str, Any]]) -> str:
    """`run.list` as a table with a header row."""
    if not runs:
        return "no runs known (create one with: locomesh run create --task NAME)"
    header = ("RUN", "TASK", "NAME", "ORIGIN", "PUBLIC", "CREATED")
    rows = [
        (run["short_id"], run["task"], run["name"] or "-", run["origin"], "yes" if run["public"] else "no", _when(run["created"]))
        for run in runs
    ]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows])


def format_run(run: dict[str, Any]) -> str:
    """`run.info` as aligned "key  value" lines."""
    manifest = run["manifest"]
    rows = [
        ("run id", run["run_id"]),
        ("name", run["name"] or "-"),
        ("task", run["task"]),
        ("creator", run["creator"]),
        ("created", _when(run["created"])),
        ("public", "yes" if run["public"] else "no"),
        ("admission", manifest["admission"]),
        ("seed", manifest["seed"]),
        ("found", f"{run['source']} ({run['origin']})"),
    ]
    rows += [(f"task.{key}", value) for key, value in sorted(manifest["task_config"].items())]
    rows += [(f"hparams.{key}", value) for key, value in sorted(manifest["hparams"].items())]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _when(created: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
