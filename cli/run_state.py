"""`locomesh run state RUN_ID`: the replicated state of a run, as the running daemon sees it.

Calls ``run.state`` (see `locomesh.node.replication.service`). Exit status as for the other `run`
actions: 0 with the answer, 1 when the daemon answers with an error (a run it does not
replicate, a malformed ID), 3 when no daemon runs on the data dir.

The `run` command itself belongs to `run_cmd`; this module adds its `state` action to it, so
it must be registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import TextTable, add_run_action, peer_name, plural, show_call


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `state` to the actions of the `run` command registered before us."""
    state = add_run_action(subparsers, "state", "show the replicated state of a run: members, round, checkpoint")
    state.set_defaults(handler=show_state)


def show_state(args: argparse.Namespace) -> int:
    return show_call(args, "run.state", format_state, params={"run_id": args.run_id})


def format_state(state: dict[str, Any]) -> str:
    """`run.state` as aligned "key  value" lines; members and banned keys by peer ID (``--json`` keeps the keys)."""
    checkpoint = state["checkpoint"]
    snapshot = state["snapshot"]
    rows = [
        ("run id", state["run_id"]),
        ("round", state["round"]),
        ("members", len(state["members"])),
        ("banned", len(state["banned"])),
        ("checkpoint", "-" if checkpoint is None else
         f"{checkpoint['id'][:16]} (round {checkpoint['round']}, {plural(checkpoint['attestations'], 'attestation')})"),
        ("snapshot", "-" if snapshot is None else f"{snapshot['state'][:16]} ({plural(snapshot['ops'], 'op')})"),
        ("ops", state["ops"]),
        ("heads", state["heads"]),
        ("pending", f"{state['pending']} (waiting for {state['wanted']})"),
    ]
    rows += [("member", peer_name(member)) for member in sorted(state["members"], key=peer_name)]
    rows += [("banned", peer_name(author)) for author in sorted(state["banned"], key=peer_name)]
    rows += [(f"hparams.{key}", value) for key, value in sorted(state["hparams"].items())]
    return TextTable.pairs(rows)
