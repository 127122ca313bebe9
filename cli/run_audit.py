"""`locomesh run audit RUN_ID [--from R] [--to R]`: replay a run's certified rounds and check them.

Reads the node's data dir directly (the run's manifest, its op log, the checkpoint store), read
only, so it works whether or not the daemon runs (`locomesh.node.rounds.audit` says why that is
safe). One line per round: ok, MISMATCH (the certificate does not follow from its contributions:
its signers are named; that is evidence against them), or missing (payloads or states this node
does not hold: an archive node, `node start --archive`, keeps them all). Payloads are not fetched
from peers.

Exit status: 0 when no round mismatched (missing rounds included: nothing was proved), 1 when one
did, or when the audit cannot start (a run this node does not know), 2 for bad arguments.

The `run` command itself belongs to `run_cmd`; this module adds its `audit` action, so it must be
registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .client import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .common import add_run_action, data_dir_of, fail


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `audit` to the actions of the `run` command registered before us."""
    audit = add_run_action(subparsers, "audit", "replay a run's certified rounds from this node's record and check them")
    audit.add_argument("--from", dest="first", type=int, default=1, metavar="R", help="first round to check (default 1)")
    audit.add_argument("--to", dest="last", type=int, metavar="R", help="last round to check (default: the newest certified)")
    audit.set_defaults(handler=audit_run)


def audit_run(args: argparse.Namespace) -> int:
    from locomesh.node.rounds.audit import MISMATCH, AuditError, audit_data_dir  # torch: only now
    from locomesh.protocol import ProtocolError
    from locomesh.protocol.runs import format_run_id, parse_run_id

    try:
        run_id = parse_run_id(args.run_id)
    except ProtocolError as error:
        return fail(f"bad run ID: {error.reason}", EXIT_USAGE)
    if args.first < 1 or (args.last is not None and args.last < args.first):
        return fail("--from must be at least 1, and --to at least --from", EXIT_USAGE)
    try:
        state, reports = audit_data_dir(data_dir_of(args), run_id, first=args.first, last=args.last)
    except AuditError as error:
        return fail(str(error), EXIT_ERROR)
    counts = {verdict: sum(r.verdict == verdict for r in reports) for verdict in ("ok", "mismatch", "missing")}
    result = {"run_id": format_run_id(run_id), "certified": state.round, **counts,
              "rounds": [report.to_json() for report in reports]}
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_audit(result))
    return EXIT_ERROR if counts[MISMATCH] else EXIT_OK


def format_audit(result: dict[str, Any]) -> str:
    """The audit as one line per round and a summary line."""
    lines = [_line(report) for report in result["rounds"]]
    lines.append(f"run {result['run_id']}: {len(result['rounds'])} rounds audited of {result['certified']} certified: "
                 f"{result['ok']} ok, {result['mismatch']} mismatch, {result['missing']} missing")
    return "\n".join(lines)


def _line(report: dict[str, Any]) -> str:
    head = f"round {report['round']:>4}: "
    if report["verdict"] == "ok":
        return head + f"ok (the set proposed by {_peer(report['proposer'])})"
    if report["verdict"] == "mismatch":
        signers = ", ".join(_peer(voter) for voter in report["voters"])
        return head + (f"MISMATCH: certified hash {report['certified'][:16]} does not follow from the round's "
                       f"contributions ({report['note']}); signed by {signers}")
    what = f"{len(report['missing'])} checkpoints not in the store: {', '.join(m[:16] for m in report['missing'])}"
    return head + "missing: " + "; ".join(part for part in (what if report["missing"] else "", report["note"]) if part)


def _peer(key_hex: str) -> str:
    from locomesh.protocol import peer_id_from_public_key

    return peer_id_from_public_key(bytes.fromhex(key_hex))
