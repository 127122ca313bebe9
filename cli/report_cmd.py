"""`locomesh run report RUN_ID --out DIR`: plots and a markdown summary of this node's record of a run.

Asks the running daemon for ``run.status`` (or reads one saved with ``run status RUN_ID --json``:
``--from FILE``) and writes into DIR:

- ``status.json``: the status the report was made from (``--from DIR/status.json`` redraws it);
- ``loss_by_round.png``, ``loss_by_bytes.png``, ``round_timeline.png``, ``contributions.png``
  (`plots`), each where the record has its data;
- ``summary.md``: the loss from start to end against the task's floor, the rounds, the bytes
  sent and fetched, the contributions per member, and the plots linked.

The record is this node's: the rounds it finished while it took part (the daemon keeps the newest
100), the payload bytes it sent and fetched, and the contributions of the newest certified rounds.
Exit status: 0 with the report written, 1 when the daemon answers with an error or a file cannot
be read or written, 2 for a file that is not a status of this run, 3 when no daemon runs.

The `run` command belongs to `run_cmd`; this module adds its `report` action, so it must be
registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .client import EXIT_ERROR, EXIT_OK, EXIT_USAGE, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_run_action, data_dir_of, fail, no_daemon, peer_name, plural, refused
from .plots import RoundPoint, Series, draw, markdown_section
from .run_view import score_text

RPC_TIMEOUT = 30.0
WAITING = "waiting on peers (commits, cutoff, votes)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `report` to the actions of the `run` command registered before us."""
    report = add_run_action(subparsers, "report", "write plots (PNG) and a markdown summary of this node's record of a run")
    report.add_argument("--out", required=True, metavar="DIR", help="where the files go (created if need be)")
    report.add_argument("--from", dest="source", metavar="FILE",
                        help="a status saved with `locomesh run status RUN_ID --json`, instead of asking the daemon")
    report.set_defaults(handler=report_run)


def report_run(args: argparse.Namespace) -> int:
    try:
        status = _load(args.source) if args.source else _ask(args)
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return refused(error)
    except (OSError, ValueError) as error:
        return fail(f"cannot read {args.source}: {error}", EXIT_ERROR)
    if not isinstance(status, dict) or not names_run(args.run_id, status.get("run_id")) or \
            not isinstance(status.get("history"), list):
        return fail(f"{args.source} is not the `run status --json` of run {args.run_id}", EXIT_USAGE)
    try:
        result = write_report(status, Path(args.out))
    except OSError as error:
        return fail(f"cannot write the report to {args.out}: {error}", EXIT_ERROR)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print("\n".join([*(f"wrote {name}" for name in result["files"]),
                         *(f"not drawn: {name}: {why}" for name, why in result["skipped"].items())]))
    return EXIT_OK


def names_run(text: str, run_id: Any) -> bool:
    """Does `text`, a run ID as the CLI takes it (full, 64 hex digits, or a short prefix: `run list`
    and `run browse` print those), name the run whose full ID is `run_id`?"""
    from locomesh.protocol import ProtocolError
    from locomesh.protocol.runs import parse_run_id

    try:
        run = parse_run_id(run_id)
        return parse_run_id(text, [run]) == run
    except (ProtocolError, AttributeError):  # AttributeError: a `run_id` that is no string
        return False


def _ask(args: argparse.Namespace) -> dict[str, Any]:
    return RpcClient.for_data_dir(data_dir_of(args), timeout=RPC_TIMEOUT).call("run.status", {"run_id": args.run_id})


def _load(path: str) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_report(status: dict[str, Any], directory: Path) -> dict[str, Any]:
    """Write the report of `status` (a ``run.status`` result) into `directory`: the status itself,
    the plots it has data for and the summary. What was written (paths) and which plots were not, and why."""
    from locomesh.node.files import atomic_write

    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / "status.json", (json.dumps(status, indent=2, sort_keys=True) + "\n").encode())
    series = series_from_status(status)
    written, skipped = draw(series, directory)
    summary = summary_markdown(status, series) + "\n" + "\n".join(markdown_section(written, skipped, directory)) + "\n"
    atomic_write(directory / "summary.md", summary.encode())
    files = [directory / "status.json", *written.values(), directory / "summary.md"]
    return {"directory": str(directory), "files": [str(path) for path in files], "skipped": skipped}


def series_from_status(status: dict[str, Any]) -> Series:
    """A ``run.status`` result as a plot `Series`: its history records as rounds on a wall-clock
    axis from the start of the first round this node computed; members by the end of their peer ID."""
    from locomesh.crdt.scores import CONTRIBUTION_HISTORY  # the window the daemon counts contributions over

    records = sorted(status["history"], key=lambda record: record["round"])
    starts = [record["finished_at"] - record["seconds"] for record in records if _spans(record)]
    origin = min(starts, default=0.0)
    rounds = tuple(
        RoundPoint(round=record["round"], eval_loss=record["eval_loss"], train_loss=record.get("train_loss"),
                   floor=record["floor"], bytes_sent=record.get("payload_bytes") or 0,
                   start=record["finished_at"] - record["seconds"] - origin if _spans(record) else None,
                   spans=_spans(record))
        for record in records
    )
    return Series(
        title=f"run {status['run_id'][:12]}", rounds=rounds,
        time_axis="seconds since this node began its first round here", initial_loss=status.get("initial_eval_loss"),
        bytes_axis="MiB of payloads this node published (cumulative)",
        contributions={_member(key): count for key, count in (status.get("contributions") or {}).items()},
        contribution_rounds=min(status["certified"], CONTRIBUTION_HISTORY),
        scores={_member(key): scores["mean"] for key, scores in (status.get("scores") or {}).items()
                if scores["mean"] is not None},  # not known yet: no bar, and "—" in the table
        no_loss="no round this node finished has an eval loss",
    )


def _spans(record: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """What a round this node computed spent its time on: its own training (none when it was trained
    during the round before: delayed updates), waiting on the others, fetching their payloads, the
    outer step. The waits before and after the exchange (the others' commits, then the votes) are
    one span: the record times the exchange, not when it began. None for a round only synced."""
    if record["synced"] or not record["seconds"]:
        return ()
    spans: list[tuple[str, float]] = []
    if record.get("train_seconds") and not record.get("trained_ahead"):
        spans.append(("training", record["train_seconds"]))
    exchange, fetch = record.get("exchange_seconds"), record.get("fetch_seconds")
    timed = sum(seconds for _, seconds in spans) + (exchange or 0.0)
    spans.append((WAITING, max(0.0, record["seconds"] - timed)))
    if exchange is not None and fetch is not None:
        spans += [("fetching payloads", fetch), ("outer step", max(0.0, exchange - fetch))]
    elif exchange is not None:
        spans.append(("exchange", exchange))
    return tuple(spans)


def _member(key_hex: str) -> str:
    """A member as the end of its peer ID: all peer IDs of Ed25519 keys begin alike (12D3KooW)."""
    return "…" + peer_name(key_hex)[-8:]


def summary_markdown(status: dict[str, Any], series: Series) -> str:
    """The summary's text (no plots): loss from start to end against the floor, rounds, bytes, contributions."""
    records = sorted(status["history"], key=lambda record: record["round"])
    lines = [f"# Run {status['run_id']}", "",
             f"This node's record: {status['phase']} now, holding the state of round {status['round']} "
             f"(certified: {status['certified']}), {plural(status['members'], 'member')}.", ""]
    lines += [f"- **{label}**: {text}" for label, text in _facts(status, records)]
    if series.contributions:
        lines += ["", "## Contributions", "",
                  f"Certified rounds (of the newest {series.contribution_rounds}) whose certified set held the member's "
                  "payload, and its mean contribution score where the run measures scores.", "",
                  "| member | rounds | mean score |", "|---|---|---|"]
        lines += [f"| {member} | {count} | {score_text(series.scores.get(member))} |"
                  for member, count in sorted(series.contributions.items())]
    return "\n".join(lines) + "\n"


def _facts(status: dict[str, Any], records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    if not records:
        return [("rounds", "none finished here yet")]
    synced = sum(1 for record in records if record["synced"])
    sent = sum(record.get("payload_bytes") or 0 for record in records)
    fetched = sum(record.get("bytes_fetched") or 0 for record in records)
    return [
        ("rounds", f"{len(records)} finished here, {records[0]['round']} to {records[-1]['round']} "
                   f"({len(records) - synced} computed, {synced} synced)"),
        ("eval loss", _loss_text(status, records)),
        ("bytes", f"{sent / 2**20:.2f} MiB of payloads published, {fetched / 2**20:.2f} MiB of others' fetched"),
    ]


def _loss_text(status: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """``3.2100 at the start (...) → 2.1000 after round 6 (floor 1.9500: 0.1500 above it)``."""
    measured = [record for record in records if record["eval_loss"] is not None]
    if not measured:
        return "not measured"
    last = measured[-1]
    initial = status.get("initial_eval_loss")
    start = (f"{initial:.4f} at the start (the run's initial weights)" if initial is not None
             else f"{measured[0]['eval_loss']:.4f} after round {measured[0]['round']}")
    floor = "" if last["floor"] is None else f" (floor {last['floor']:.4f}: {last['eval_loss'] - last['floor']:.4f} above it)"
    return f"{start} → {last['eval_loss']:.4f} after round {last['round']}{floor}"


