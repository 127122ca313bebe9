"""`locomesh run audit RUN_ID [--from R] [--to R]`: replay a run's certified rounds and check them.

Reads the node's data dir directly (the run's manifest, its op log, the checkpoint store), read
only, so it works whether or not the daemon runs (`locomesh.node.rounds.audit` says why that is
safe). One line per round: ok (the payloads of the certified value give the certified state),
MISMATCH (they do not: the precommitters of that value and state are named; that is evidence
against them), or missing (payloads, with their authors, or states this node does not hold: an
archive node, `node start --archive`, keeps them all). With `--fetch` the running daemon
downloads what was missing from peers (`checkpoint.fetch`), and the audit runs again.

Exit status: 0 when no round mismatched (missing rounds included: nothing was proved), 1 when one
did, or when the audit cannot start (a run this node does not know), 2 for bad arguments.

The `run` command itself belongs to `run_cmd`; this module adds its `audit` action, so it must be
registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from locomesh.node.transfer.states import RUNNING_STATES

from .client import DEFAULT_TIMEOUT, EXIT_ERROR, EXIT_OK, EXIT_USAGE, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_run_action, data_dir_of, fail, no_daemon, on_terminal, peer_name, plural
from .progress import open_view

# With --fetch: at most this many audits, each followed by the downloads of what it lacked (a state
# fetched lets the replay go on to rounds whose payloads it then finds missing), and at most this
# many downloads a pass.
FETCH_PASSES = 3
MAX_FETCHES = 256
POLL_SECONDS = 0.2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `audit` to the actions of the `run` command registered before us."""
    audit = add_run_action(subparsers, "audit", "replay a run's certified rounds from this node's record and check them")
    audit.add_argument("--from", dest="first", type=int, default=1, metavar="R", help="first round to check (default 1)")
    audit.add_argument("--to", dest="last", type=int, metavar="R", help="last round to check (default: the newest certified)")
    audit.add_argument("--fetch", action="store_true",
                       help="ask this node's running daemon to download what the audit lacks (payloads, states) "
                            "from peers, then audit again")
    audit.add_argument("--provider", action="append", default=[], metavar="MULTIADDR",
                       help="with --fetch: a peer to download from (multiaddr ending in /p2p/ID; default: the DHT's providers)")
    audit.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                       help="with --fetch: how long to wait for the downloads of one pass (default 300)")
    audit.set_defaults(handler=audit_run)


def audit_run(args: argparse.Namespace) -> int:
    from locomesh.node.rounds.audit import MISMATCH, AuditError, audit_data_dir  # torch: only now
    from locomesh.protocol import ProtocolError
    from locomesh.node.runs.store import RunStore
    from locomesh.protocol.runs import format_run_id, parse_run_id

    try:  # a short ID (`run list` prints those) names one of the runs the data dir keeps
        run_id = parse_run_id(args.run_id, [run.run_id for run in RunStore(data_dir_of(args)).load()])
    except ProtocolError as error:
        return fail(f"bad run ID: {error.reason}", EXIT_USAGE)
    if args.first < 1 or (args.last is not None and args.last < args.first):
        return fail("--from must be at least 1, and --to at least --from", EXIT_USAGE)
    fetched: dict[str, str] = {}  # checkpoint ID (hex) -> how its download ended
    passes = FETCH_PASSES if args.fetch else 0
    try:
        for attempt in range(passes + 1):
            state, reports = audit_data_dir(data_dir_of(args), run_id, first=args.first, last=args.last)
            wanted = sorted({m.hex() for r in reports for m in r.missing} - set(fetched))[:MAX_FETCHES]
            if attempt == passes or not wanted:
                break
            with open_view(rich=True) if on_terminal() and not args.json else nullcontext() as view:
                fetched.update(fetch_checkpoints(args, wanted, show=None if view is None else view.download))
    except AuditError as error:
        return fail(str(error), EXIT_ERROR)
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return fail(f"fetching failed: {error.message}", EXIT_ERROR)
    counts = {verdict: sum(r.verdict == verdict for r in reports) for verdict in ("ok", "mismatch", "missing")}
    result = {"run_id": format_run_id(run_id), "certified": state.round, **counts,
              "rounds": [report.to_json() for report in reports]}
    if args.fetch:
        result["fetched"] = fetched
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_audit(result))
    return EXIT_ERROR if counts[MISMATCH] else EXIT_OK


def fetch_checkpoints(args: argparse.Namespace, ids: list[str],
                      show: Callable[[dict[str, Any]], None] | None = None) -> dict[str, str]:
    """Have the daemon download the checkpoints `ids` (hex) from `args.provider` or the DHT's
    providers (`checkpoint.fetch`: every chunk verified against its manifest); how each ended
    ("done", "failed: ...", or "unfinished" after `args.wait` seconds). `show(progress)` is given
    each download's progress at every look (a terminal's progress bars)."""
    client = RpcClient.for_data_dir(data_dir_of(args), timeout=DEFAULT_TIMEOUT)
    for checkpoint_id in ids:
        client.call("checkpoint.fetch", {"id": checkpoint_id, "providers": args.provider})
    deadline = time.monotonic() + args.wait
    ended: dict[str, str] = {}
    while True:
        for checkpoint_id in ids:
            if checkpoint_id not in ended:
                progress = client.call("checkpoint.progress", {"id": checkpoint_id})
                if show is not None:
                    show(progress)
                if progress["state"] not in RUNNING_STATES:
                    ended[checkpoint_id] = "done" if progress["state"] == "done" else f"{progress['state']}: {progress['error']}"
        if len(ended) == len(ids) or time.monotonic() >= deadline:
            return {checkpoint_id: ended.get(checkpoint_id, "unfinished") for checkpoint_id in ids}
        time.sleep(POLL_SECONDS)


def format_audit(result: dict[str, Any]) -> str:
    """The audit as one line per round and a summary line."""
    lines = [_line(report) for report in result["rounds"]]
    lines.append(f"run {result['run_id']}: {plural(len(result['rounds']), 'round')} audited of {result['certified']} certified: "
                 f"{result['ok']} ok, {result['mismatch']} mismatch, {result['missing']} missing")
    return "\n".join(lines)


def _line(report: dict[str, Any]) -> str:
    head = f"round {report['round']:>4}: "
    if report["verdict"] == "ok":
        return head + f"ok (value {report['value'][:16]}, {plural(len(report['authors']), 'payload')})"
    if report["verdict"] == "mismatch":
        signers = ", ".join(peer_name(voter) for voter in report["voters"])
        return head + (f"MISMATCH: certified state {report['certified'][:16]} of value {report['value'][:16]} does not "
                       f"follow from its payloads ({report['note']}); precommitted by {signers}")
    what = f"{plural(len(report['missing']), 'checkpoint')} not in the store: {', '.join(m[:16] for m in report['missing'])}"
    if report["missing_authors"]:
        what += f" (the payloads of {', '.join(peer_name(author) for author in report['missing_authors'])})"
    return head + "missing: " + "; ".join(part for part in (what if report["missing"] else "", report["note"]) if part)
