"""`locomesh run browse [--task T] [--json]`: the public runs the DHT's directory lists, no run ID needed.

Calls ``run.browse`` (node/runs/directory.py): the daemon finds the runs' card keepers, reads
their cards, checks each against the run's manifest and ranks the runs, most members first, then
most rounds, then newest. Exit status: 0 with the list (empty included), 1 when the daemon answers
with an error, 3 when no daemon runs on the data dir.

The `run` command belongs to `run_cmd`; this module adds its `browse` action to it, so it must be
registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import TextTable, add_data_dir_argument, human_size, plural, show_call

BROWSE_TIMEOUT = 90.0  # the daemon's three lookup phases take up to 20 s each


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `browse` to the actions of the `run` command registered before us."""
    run_parser = subparsers.choices.get("run")
    if run_parser is None:
        raise RuntimeError("the `run browse` action must be registered after run_cmd, which owns the `run` command")
    actions = next(a for a in run_parser._actions if isinstance(a, argparse._SubParsersAction))
    browse = actions.add_parser("browse", help="list the public runs in the DHT's directory (no run ID needed)")
    browse.add_argument("--task", help="only runs of this task")
    browse.add_argument("--limit", type=int, default=50, help="list at most this many runs (default 50, at most 100)")
    add_data_dir_argument(browse)
    browse.add_argument("--json", action="store_true", help="print JSON")
    browse.set_defaults(handler=browse_runs)


def browse_runs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.task:
        params["task"] = args.task
    return show_call(args, "run.browse", format_listings, params=params, timeout=BROWSE_TIMEOUT)


def format_listings(result: dict[str, Any]) -> str:
    """The listed runs as a table, and how to join one; or why the list is empty."""
    runs = result["runs"]
    if not runs:
        found = (f"{plural(result['keepers_found'], 'card keeper')} found, "
                 f"{plural(result['records_read'], 'cards record')} read")
        return (f"no public run found in the directory ({found}). A run is listed once it was created with "
                "--public and one of its members has been online for a minute.")
    header = ("run", "name", "task", "params", "dataset", "memory", "up/round", "down/round", "round",
              "members", "rounds", "created")
    rows = [(run["short_id"], run["name"] or "-", run["task"], _count(run["params"]), run["dataset"][:16] or "built-in",
             human_size(run["memory"]), human_size(run["upload"]), human_size(run["download"]),
             f"{run['inner_steps']} steps / {run['round_deadline_s']:g} s", run["members"], run["rounds"],
             time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created"]))) for run in runs]
    table = TextTable.columns(header, rows)
    hint = f"\njoin one with: locomesh run join RUN_ID   (for example: {runs[0]['join']})"
    return TextTable(table + hint, table.header, table.rows)


def _count(number: int) -> str:
    """A parameter count as people read it: ``870``, ``1.2 M``, ``7.0 B``."""
    for scale, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if number >= scale:
            return f"{number / scale:.1f} {unit}"
    return str(number)
