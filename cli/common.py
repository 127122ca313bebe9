"""What the `locomesh` subcommands share: the data dir argument and one-line failures."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from locomesh.node.config import resolve_data_dir

from .client import EXIT_NO_DAEMON


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
