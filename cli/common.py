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
    cells so that `emit` has rich draw it on a terminal instead."""

    header: tuple[str, ...] | None  # None: "label  value" pairs
    rows: list[tuple[str, ...]]

    def __new__(cls, text: str, header: tuple[str, ...] | None, rows: list[tuple[str, ...]]) -> TextTable:
        table = super().__new__(cls, text)
        table.header, table.rows = header, rows
        return table

    @classmethod
    def columns(cls, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> TextTable:
        """A header row and rows, each column as wide as its widest cell, two spaces apart."""
        cells = [tuple(header), *(tuple(str(cell) for cell in row) for row in rows)]
        widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
        text = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)
        return cls(text, cells[0], cells[1:])

    @classmethod
    def pairs(cls, rows: Sequence[tuple[str, Any]]) -> TextTable:
        """Lines of "label  value", the values aligned."""
        width = max(len(label) for label, _ in rows)
        text = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
        return cls(text, None, [(label, str(value)) for label, value in rows])

    def to_rich(self) -> Any:
        """The same cells as a `rich.table.Table` (cells as `Text`: a "[...]" in a value is not markup)."""
        from rich import box
        from rich.table import Table
        from rich.text import Text

        if self.header is None:
            table = Table.grid(padding=(0, 2))
            table.add_column(style="bold cyan")
            table.add_column()
        else:
            table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
            for column, name in enumerate(self.header):
                numbers = all(_number(row[column]) for row in self.rows) and bool(self.rows)
                table.add_column(name, justify="right" if numbers else "left")  # digits line up
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))
        return table


def _number(cell: str) -> bool:
    """Does the cell read as a number ("-" for none, a unit after it: "94 KiB")?"""
    if cell == "-":
        return True
    try:
        float(cell.split(" ")[0])
    except ValueError:
        return False
    return True


def emit(text: str) -> None:
    """Print `text`, or draw it with rich when it is a `TextTable` and our output is a terminal."""
    if isinstance(text, TextTable) and on_terminal():
        from rich.console import Console

        Console().print(text.to_rich())
    else:
        print(text)


def peer_name(key_hex: str) -> str:
    """A member's public key (hex, as the RPC and the audit give it) as its peer ID, the name the
    CLI shows peers by."""
    from locomesh.protocol import peer_id_from_public_key

    return peer_id_from_public_key(bytes.fromhex(key_hex))
