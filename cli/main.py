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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="locomesh", description="Train one model together over the internet.")
    parser.add_argument("--version", action="version", version=f"locomesh {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _subcommand_modules():
        module.add_parser(subparsers)
    return parser


def _subcommand_modules() -> list:
    # Subcommand modules are added here as they are written.
    from . import data_cmd, node_cmd, report_cmd, run_audit, run_cmd, run_state, sim, status_cmd, swarm_cmd, ui_cmd, watch_cmd

    return [node_cmd, status_cmd, swarm_cmd, run_cmd, run_state, run_audit, watch_cmd, report_cmd, data_cmd, sim, ui_cmd]


def main(argv: list[str] | None = None) -> int:
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
