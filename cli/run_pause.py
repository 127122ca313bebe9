"""`locomesh run pause|resume RUN_ID`: sit a run's rounds out for a while, and take part again.

A paused node stops contributing after the round under way and keeps the run's state current by
syncing each certified round, so `resume` costs no checkpoint download: it trains from the next
round (``run.pause``, ``run.resume``: `locomesh.node.rounds.pauses`). A pause outlives a restart
of the daemon. Exit status: 0 done, 1 the daemon refused (a run not joined), 3 no daemon.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_run_action, show_call


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `pause` and `resume` to the actions of the `run` command registered before us."""
    pause = add_run_action(subparsers, "pause", "stop contributing to a run after the round under way; keep its state current")
    pause.set_defaults(handler=pause_run)
    resume = add_run_action(subparsers, "resume", "contribute to a paused run again, from the next round")
    resume.set_defaults(handler=resume_run)


def pause_run(args: argparse.Namespace) -> int:
    return show_call(args, "run.pause", paused_line, params={"run_id": args.run_id})


def resume_run(args: argparse.Namespace) -> int:
    return show_call(args, "run.resume", resumed_line, params={"run_id": args.run_id})


def paused_line(result: dict[str, Any]) -> str:
    return (f"run {result['run_id']} paused: no contribution after round {result['after_round']}; the node keeps "
            f"its state current, and `locomesh run resume {result['run_id'][:16]}` takes part again")


def resumed_line(result: dict[str, Any]) -> str:
    return (f"run {result['run_id']} resumed at round {result['round']}: this node contributes again from the "
            "next round it can join")
