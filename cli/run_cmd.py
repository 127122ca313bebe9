"""`locomesh run create|list|info|join|leave|status|export`: make, find, join, follow training runs
and take their models out.

All talk to the running daemon (``run.create``, ``run.list``, ``run.info``: see
`locomesh.node.runs.registry`; ``run.join``, ``run.leave``, ``run.status``, ``run.export``: see
`locomesh.node.rounds.service`). Exit status: 0 with
the answer, 1 when the daemon answers with an error (a run not found, a bad
setting: `run create` checks every setting and the task as a joiner would,
and signs nothing they refuse), 2 for bad arguments, 3 when no daemon runs on
the data dir.

``--set key=value`` values are typed the way a person means them: ``true`` /
``false``, integers, decimals, and everything else a string. `run create` prints the run's ID
alone on stdout and, on stderr, the next step: creating a run does not make this node train in it;
`run join` does.

A RUN_ID may be the start of one (the 16 characters `run list` and `run browse` print): the daemon
resolves it among the runs it knows and those its browses listed, and `run join` / `run info`
look one it does not know up in the directory of public runs. A refusal prints the daemon's
reason alone (`common.refused`).

On a terminal, `run join` follows the join to this node's first round (`watch_cmd.follow_join`:
downloads, the sync, the round's phases); piped, or with ``--json``, it prints its one line as it
always did. `run status` shows a run this node left too (its rounds are kept in the data dir);
with ``--follow`` it goes on printing rounds as they finish until Ctrl-C (exit 0; exit 1 if the
daemon stops training the run, 3 if it stops answering). Tables are `TextTable`s: plain text for
scripts, drawn by rich on a terminal. The
`state`, `audit`, `watch` and `report` actions live in their own modules (run_state, run_audit,
watch_cmd, report_cmd).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any

from .client import EXIT_OK, EXIT_USAGE, DaemonNotRunning, RpcCallError, RpcClient
from .common import RUN_ID_HELP, TextTable, add_data_dir_argument, data_dir_of, emit, fail, no_daemon, on_terminal, refused
from .run_browse import BROWSE_TIMEOUT
from .run_view import format_status, joined_text, show_status

# Looking a run up in the DHT can take a while on a large network; creating one publishes it.
RPC_TIMEOUT = 60.0
# `run join` and `run info` may first look a short ID up in the directory of public runs, as `run browse` does.
LOOKUP_TIMEOUT = RPC_TIMEOUT + BROWSE_TIMEOUT
LOOKUPS = ("run.join", "run.info")
FOLLOW_TIMEOUT = 900.0  # `run join --follow`: a sync and a whole round of a large model take minutes
STATUS_POLL_SECONDS = 2.0  # `run status --follow`
STATUS_RPC_TIMEOUT = 10.0  # `run status --follow`: each call; a daemon that long silent counts as gone


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="create, list and look up training runs")
    commands = parser.add_subparsers(dest="run_command", metavar="ACTION", required=True)

    create = commands.add_parser("create", help="create a run and print its ID")
    create.add_argument("--task", required=True, help="the task's name")
    create.add_argument("--name", default="", help="a label for people (not unique)")
    create.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
        help="a hyperparameter (inner_steps, outer_lr, codec, aggregator, round_deadline_s, ...) or a task setting (repeat)",
    )
    create.add_argument("--seed", type=int, help="the model's init seed (default: random)")
    create.add_argument(
        "--init", metavar="PATH",
        help="start from these weights (llama task): a transformers checkpoint directory or a .safetensors file",
    )
    create.add_argument("--public", action="store_true", help="publish the run in the DHT so anyone can find it by ID")
    create.add_argument(
        "--admission", choices=("open", "creator", "electorate"), default="open",
        help="who may join: anyone (fresh keys earn a say by counted work), keys this node admits, or keys two "
             "thirds of the run's voters admit (default open)",
    )
    create.add_argument(
        "--admit", action="append", default=[], metavar="PEER_ID", dest="admitted",
        help="a peer with a say from its join on, e.g. a member of your own team (repeat)",
    )
    create.set_defaults(handler=create_run)

    admit = commands.add_parser("admit", help="admit peers into a run: a say from their join (admission creator, "
                                              "or this node's vote in admission electorate)")
    admit.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    admit.add_argument("peer_ids", nargs="+", metavar="PEER_ID", help="the peers, as `locomesh status` prints them")
    admit.set_defaults(handler=admit_peers)

    listing = commands.add_parser("list", help="list the runs this node created, joined or looked up")
    listing.set_defaults(handler=list_runs)

    info = commands.add_parser("info", help="show a run, found in the DHT if this node does not know it")
    info.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    info.add_argument("--refresh", action="store_true", help="ask the DHT even if this node knows the run")
    info.set_defaults(handler=show_run)

    join = commands.add_parser("join", help="train in a run: find it, sync its state, take part from the next round")
    leave = commands.add_parser("leave", help="stop training in a run (it votes until its leave takes effect)")
    status = commands.add_parser("status", help="this node's part in a run: phase, rounds, losses")
    export = commands.add_parser("export", help="write a run's certified model as a directory transformers loads")
    for sub, handler in ((join, join_run), (leave, leave_run), (status, run_status), (export, export_run)):
        sub.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
        sub.set_defaults(handler=handler)
    export.add_argument("directory", metavar="DIR", help="where the files go (created if need be)")

    for sub in (create, listing, info, join, leave, status, export, admit):
        add_data_dir_argument(sub)
        sub.add_argument("--json", action="store_true", help="print JSON")
    join.add_argument("--follow", action=argparse.BooleanOptionalAction, default=None,
                      help="show the join (finding the run, downloads, syncing its state) and wait for this node's "
                           "first round (default: on a terminal, without --json)")
    join.add_argument("--timeout", type=float, default=FOLLOW_TIMEOUT, metavar="SECONDS",
                      help=f"with --follow: stop waiting for the first round after this long (default {FOLLOW_TIMEOUT:g})")
    status.add_argument("--follow", action="store_true",
                        help="then print each round as it finishes and what the round under way waits for, until "
                             "Ctrl-C (with --json: each round's record, one a line)")
    status.add_argument("--interval", type=float, default=STATUS_POLL_SECONDS, metavar="SECONDS",
                        help=f"with --follow: how often to ask the daemon (default {STATUS_POLL_SECONDS:g})")


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
    params = {"task": args.task, "settings": settings, "public": args.public, "name": args.name, "seed": args.seed,
              "admission": args.admission, "admitted": args.admitted}
    if args.init is not None:
        params["init"] = os.path.abspath(args.init)  # the daemon reads it: its working directory is not ours
    result = _call(args, "run.create", params)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(result["run_id"])  # alone on stdout: scripts take it with `$(locomesh run create ...)`
        print(next_step(args, result), file=sys.stderr)
    return EXIT_OK


@_exits
def admit_peers(args: argparse.Namespace) -> int:
    result = _call(args, "run.admit", {"run_id": args.run_id, "peer_ids": args.peer_ids})
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"admitted {len(result['admitted'])} peer(s) into run {result['run_id']}: each has a say once a round "
              "admits its join")
    return EXIT_OK


def next_step(args: argparse.Namespace, result: dict[str, Any]) -> str:
    """What to do after `run create`: creating a run does not make this node train in it."""
    command = ["locomesh", "run", "join", result["run_id"]]
    if args.data_dir is not None:  # the join must reach the same daemon
        command += ["--data-dir", args.data_dir]
    found = " (others find it with: locomesh run browse)" if result.get("public") else ""
    earned = ("; joiners earn a say by counted work, one new voter every few rounds at first: admit your own team "
              "with --admit PEER_ID or `locomesh run admit`") if args.admission == "open" and not args.admitted else ""
    return f"run created; this node does not train in it until it joins: {shlex.join(command)}{found}{earned}"


@_exits
def list_runs(args: argparse.Namespace) -> int:
    return _show(args, "run.list", {}, format_runs)


@_exits
def show_run(args: argparse.Namespace) -> int:
    return _show(args, "run.info", {"run_id": args.run_id, "refresh": args.refresh}, format_run)


@_exits
def join_run(args: argparse.Namespace) -> int:
    """Join; with `--follow` (the default on a terminal, never with `--json`) show the join and this
    node's first round as they happen (`watch_cmd.follow_join`)."""
    follow = args.follow if args.follow is not None else on_terminal() and not args.json
    if not follow or args.json:
        return _show(args, "run.join", {"run_id": args.run_id}, joined_text)
    from .watch_cmd import follow_join

    return _guarded(lambda: follow_join(_client(args), args.run_id, timeout=args.timeout, rich=on_terminal()))


@_exits
def leave_run(args: argparse.Namespace) -> int:
    return _show(args, "run.leave", {"run_id": args.run_id}, lambda result: f"left after round {result['last_round']}")


@_exits
def run_status(args: argparse.Namespace) -> int:
    """The run's status once; with `--follow`, then its rounds as they finish (`watch_cmd.follow_status`)."""
    if args.follow:
        if not args.interval > 0:
            return fail("--interval must be a positive number of seconds", EXIT_USAGE)
        from .watch_cmd import follow_status

        client = _guarded(lambda: RpcClient.for_data_dir(data_dir_of(args), timeout=STATUS_RPC_TIMEOUT))
        return _guarded(lambda: follow_status(client, args.run_id, interval=args.interval, json_lines=args.json,
                                              rich=on_terminal() and not args.json))
    if args.json or not on_terminal():
        return _show(args, "run.status", {"run_id": args.run_id}, format_status)
    show_status(_call(args, "run.status", {"run_id": args.run_id}))
    return EXIT_OK


@_exits
def export_run(args: argparse.Namespace) -> int:
    params = {"run_id": args.run_id, "directory": os.path.abspath(args.directory)}
    return _show(args, "run.export", params,
                 lambda result: f"round {result['round']}'s model written to {result['directory']}: "
                                f"{', '.join(result['files'])}")


def _show(args: argparse.Namespace, method: str, params: dict[str, Any], formatter: Any) -> int:
    """Call `method` and print its result as JSON (`--json`) or through `formatter`."""
    result = _call(args, method, params)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        emit(formatter(result))
    return EXIT_OK


def _call(args: argparse.Namespace, method: str, params: dict[str, Any]) -> Any:
    """The method's result; on failure prints why and raises `_Failed`."""
    timeout = LOOKUP_TIMEOUT if method in LOOKUPS else RPC_TIMEOUT
    return _guarded(lambda: _client(args, timeout).call(method, params))


def _client(args: argparse.Namespace, timeout: float = RPC_TIMEOUT) -> RpcClient:
    return RpcClient.for_data_dir(data_dir_of(args), timeout=timeout)


def _guarded(work: Any) -> Any:
    """`work()`'s result; a daemon that is gone or answers an error is printed and raises `_Failed`."""
    try:
        return work()
    except DaemonNotRunning as error:
        raise _Failed(no_daemon(error)) from None
    except RpcCallError as error:
        raise _Failed(refused(error)) from None


def format_runs(runs: list[dict[str, Any]]) -> str:
    """`run.list` as a table with a header row."""
    if not runs:
        return "no runs known (create one with: locomesh run create --task NAME)"
    header = ("RUN", "TASK", "NAME", "ORIGIN", "PUBLIC", "CREATED")
    rows = [
        (run["short_id"], run["task"], run["name"] or "-", run["origin"], "yes" if run["public"] else "no", _when(run["created"]))
        for run in runs
    ]
    return TextTable.columns(header, rows)


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
    return TextTable.pairs(rows)


def _when(created: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
