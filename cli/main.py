"""The `locomesh` command: one subcommand per module in this package.

Each subcommand module exposes `add_parser(subparsers)`, which registers its
parser and sets `handler`, a function taking the parsed arguments and returning
the exit code. Heavy imports (libp2p, torch) happen inside handlers, so
`locomesh --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from locomesh.node import version

from .client import EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="locomesh", description="Train one model together over the internet.")
    parser.add_argument("--version", action="version", version=f"locomesh {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _subcommand_modules():
        module.add_parser(subparsers)
    return parser


def _subcommand_modules() -> list:
    # Subcommand modules are added here as they are written.
    from . import (
        data_cmd, doctor_cmd, node_cmd, report_cmd, run_audit, run_browse, run_cmd, run_pause, run_state, sim, status_cmd,
        swarm_cmd, ui_cmd, watch_cmd,
    )

    return [
        node_cmd, status_cmd, doctor_cmd, swarm_cmd, run_cmd, run_state, run_browse, run_pause, run_audit, watch_cmd,
        report_cmd, data_cmd, sim, ui_cmd,
    ]


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        # Ctrl-C, whenever it comes (while the subcommands load too): one line, no traceback, and the
        # status shells give SIGINT. A daemon already asked to do something (a join) goes on.
        print("locomesh: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader of our output went away (`locomesh peers | head -1`): not an error worth a traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

if __name__ == "__main__":
    sys.exit(main())
