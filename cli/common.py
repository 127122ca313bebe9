"""What the `locomesh` subcommands share: the data dir argument, one-line failures, and tables that
stay plain text for scripts and pipes but are drawn by rich on a terminal."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from locomesh.node.config import human_size, resolve_data_dir  # noqa: F401 - human_size: re-exported

from .client import DEFAULT_TIMEOUT, EXIT_ERROR, EXIT_NO_DAEMON, EXIT_OK, DaemonNotRunning, RpcCallError, RpcClient


RUN_ID_HELP = "the run's ID: the full one, or its start as `run list` and `run browse` show it"


def add_run_action(subparsers: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    """A new action `name` of the `run` command, whose module (`run_cmd`) must be registered before
    the caller's in `main._subcommand_modules()`; its parser, with RUN_ID, --data-dir and --json."""
    run_parser = subparsers.choices.get("run")
    if run_parser is None:
        raise RuntimeError(f"the `run {name}` action must be registered after run_cmd, which owns the `run` command")
    actions = next(a for a in run_parser._actions if isinstance(a, argparse._SubParsersAction))
    action = actions.add_parser(name, help=help)
    action.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
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


INVALID_PARAMS = "invalid params: "  # node/rpc/dispatch.py's prefix: JSON-RPC's, not the person's concern


def refused(error: RpcCallError) -> int:
    """Print why the daemon refused a call, as the person who typed the command needs it: the
    reason alone, without the RPC method (`run watch` calls ``run.status``) or error class."""
    reason = error.message
    if reason.startswith(INVALID_PARAMS):
        reason = reason[len(INVALID_PARAMS):]
    return fail(reason, EXIT_ERROR)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 peer``, ``2 peers``: a count and its noun, in the singular for one."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


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
        return refused(error)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        emit(as_table(result))
    return EXIT_OK


def on_terminal() -> bool:
    """Is our output a terminal (a person), not a pipe or a file (a script)? Decides whether rich draws."""
    return sys.stdout.isatty()


class TextTable(str):
    """A table: the plain text scripts, pipes and tests read (it *is* that string), which keeps its
    cells so that `emit` has rich draw it on a terminal instead, fitted to its width (`table_fit`)."""

    header: tuple[str, ...] | None  # None: "label  value" pairs
    rows: list[tuple[str, ...]]
    optional: tuple[str, ...]  # columns a narrow terminal may leave out, the least useful first
    after: str  # plain lines under the table, printed as they are on a terminal too (see `followed_by`)

    def __new__(cls, text: str, header: tuple[str, ...] | None, rows: list[tuple[str, ...]], *,
                optional: Sequence[str] = (), after: str = "") -> TextTable:
        table = super().__new__(cls, text)
        table.header, table.rows, table.optional, table.after = header, rows, tuple(optional), after
        return table

    @classmethod
    def columns(cls, header: Sequence[str], rows: Sequence[Sequence[Any]], *, optional: Sequence[str] = ()) -> TextTable:
        """A header row and rows, each column as wide as its widest cell, two spaces apart. On a
        terminal too narrow for every column, the `optional` ones are left out, the first first."""
        cells = [tuple(header), *(tuple(str(cell) for cell in row) for row in rows)]
        widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
        text = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)
        return cls(text, cells[0], cells[1:], optional=optional)

    @classmethod
    def pairs(cls, rows: Sequence[tuple[str, Any]]) -> TextTable:
        """Lines of "label  value", the values aligned."""
        width = max(len(label) for label, _ in rows)
        text = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
        return cls(text, None, [(label, str(value)) for label, value in rows])

    def followed_by(self, lines: str) -> TextTable:
        """This table with `lines` under it. On a terminal they are printed as they are, not by rich,
        which would break a long line (an address to copy) into pieces at its width."""
        after = f"{self.after}\n{lines}" if self.after else lines
        return TextTable(f"{self}\n{lines}", self.header, self.rows, optional=self.optional, after=after)

    def to_rich(self) -> Any:
        """The same cells as a rich renderable that fits the width it is drawn at (cells as `Text`:
        a "[...]" in a value is not markup)."""
        from .table_fit import FittedTable

        return FittedTable(self)


def emit(text: str) -> None:
    """Print `text`, or draw it with rich when it is a `TextTable` and our output is a terminal."""
    if isinstance(text, TextTable) and on_terminal():
        from rich.console import Console

        Console().print(text.to_rich())
        if text.after:
            print(text.after)
    else:
        print(text)


def peer_name(key_hex: str) -> str:
    """A member's public key (hex, as the RPC and the audit give it) as its peer ID, the name the
    CLI shows peers by."""
    from locomesh.protocol import peer_id_from_public_key

    return peer_id_from_public_key(bytes.fromhex(key_hex))
