"""`locomesh run watch RUN_ID`: a run's rounds as they finish; and `run join` followed to its first round.

Both poll the running daemon (``run.status``; the join also ``run.join`` and, for the downloads it
starts, ``node.status``) and never change what it does: stopping them (Ctrl-C) stops the
watching, not the training.

`run watch` prints the rounds this node already finished, then each new one as it finishes: a
line each (`run_view.round_line`) in a pipe or a file, one JSON object a line with ``--json``
(the history records of ``run.status``, unchanged), and on a terminal a live table of the recent
rounds under a line saying what the round under way waits for. It ends with ``--until ROUND``
once that round is done (exit 0; a round done before this node's record of the run begins is said
so, as nothing would show it), when the daemon stops training the run (phase failed or
banned: exit 1, with why), when ``--timeout`` passes (exit 0, or 1 if ``--until`` was not
reached), or on Ctrl-C (exit 130).

`run join --follow` exits 0 once this node's first round is done, 1 if the daemon stopped training
first or ``--timeout`` passed first (the daemon goes on joining and training), 130 on Ctrl-C.

The `run` command belongs to `run_cmd`; this module adds its `watch` action, so it must be
registered after `run_cmd` in `main._subcommand_modules()`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from locomesh.node.transfer.states import RUNNING_STATES

from .client import DEFAULT_TIMEOUT, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_run_action, data_dir_of, fail, no_daemon, on_terminal, plural, refused
from .progress import View, open_view
from .run_view import format_status, joined_text, phase_text, round_line, round_table, stuck_lines

POLL_SECONDS = 1.0
FOLLOW_POLL_SECONDS = 0.5
LIVE_ROUNDS = 20  # rounds the live table shows (the newest)
STOPPED = ("failed", "banned", "left")  # phases in which the daemon trains the run no more


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `watch` to the actions of the `run` command registered before us."""
    watch = add_run_action(subparsers, "watch", "show a run's rounds as they finish (Ctrl-C stops watching, not training)")
    watch.add_argument("--until", type=int, metavar="ROUND", help="stop once this round is done")
    watch.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after this long (default: never)")
    watch.add_argument("--interval", type=float, default=POLL_SECONDS, metavar="SECONDS",
                       help=f"how often to ask the daemon (default {POLL_SECONDS:g})")
    watch.set_defaults(handler=watch_run)


def watch_run(args: argparse.Namespace) -> int:
    try:
        client = RpcClient.for_data_dir(data_dir_of(args), timeout=DEFAULT_TIMEOUT)
        if args.json or not on_terminal():
            return _watch_lines(args, client)
        return _watch_live(args, client)
    except KeyboardInterrupt:  # only the watching stops
        return EXIT_INTERRUPTED
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return refused(error)


def statuses(client: RpcClient, run_id: str, interval: float, timeout: float | None) -> Iterator[dict[str, Any]]:
    """``run.status`` of `run_id`, every `interval` seconds, until `timeout` seconds passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        yield client.call("run.status", {"run_id": run_id})
        if deadline is not None and time.monotonic() + interval > deadline:
            return
        time.sleep(interval)


def new_records(status: dict[str, Any], shown: int, until: int | None = None) -> list[dict[str, Any]]:
    """The history records of rounds after round `shown` (up to round `until`), oldest first."""
    last = until if until is not None else float("inf")
    return sorted((record for record in status["history"] if shown < record["round"] <= last),
                  key=lambda record: record["round"])


def _watch_lines(args: argparse.Namespace, client: RpcClient) -> int:
    """A line (or a JSON object) per finished round, printed as it arrives."""
    show: Callable[[dict[str, Any]], str] = (lambda record: json.dumps(record, sort_keys=True)) if args.json else round_line
    shown = 0
    for status in statuses(client, args.run_id, args.interval, args.timeout):
        for record in new_records(status, shown, args.until):
            print(show(record), flush=True)
            shown = record["round"]
        ended = _ended(args, status, shown)
        if ended is not None:
            return ended
    return _timed_out(args, shown)


def _watch_live(args: argparse.Namespace, client: RpcClient) -> int:
    """A live table of the newest rounds and a line on the round under way (and why it is stuck, once
    it is), redrawn in place."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    records: list[dict[str, Any]] = []
    with Live(Text("asking the daemon..."), auto_refresh=False) as live:
        for status in statuses(client, args.run_id, args.interval, args.timeout):
            records = (records + new_records(status, records[-1]["round"] if records else 0, args.until))[-LIVE_ROUNDS:]
            what, detail = phase_text(status) if status["phase"] not in STOPPED else (status["phase"], "")
            header = Text(" · ".join(part for part in (
                f"run {status['run_id'][:16]}…: {plural(status.get('members', 0), 'member')}, "
                f"{plural(status.get('peers', 0), 'peer')} connected", what, detail) if part))
            stuck = [Text(line) for line in stuck_lines(status.get("waiting"))] if status["phase"] not in STOPPED else []
            live.update(Group(header, *stuck, round_table(records).to_rich()), refresh=True)
            ended = _ended(args, status, records[-1]["round"] if records else 0)
            if ended is not None:
                return ended
    return _timed_out(args, records[-1]["round"] if records else 0)


def _ended(args: argparse.Namespace, status: dict[str, Any], shown: int) -> int | None:
    """The exit status if watching ends here (round `args.until` done, or training stopped); else None.
    `shown`: the newest round printed. A node that synced past round `args.until` has no record of
    it, and is done with it too."""
    newest = max((record["round"] for record in status["history"]), default=0)
    if args.until is not None and newest >= args.until:
        return EXIT_OK if shown >= args.until else _done_unrecorded(args.until, status["history"])
    if status["phase"] in STOPPED:
        return fail(f"run {status['run_id']}: training stopped: {_stop_reason(status)}", EXIT_ERROR)
    return None


def _done_unrecorded(until: int, history: list[dict[str, Any]]) -> int:
    """Exit 0, saying why nothing (or not round `until`) was shown: the round is done, but this node
    keeps no record of it (it joined after it, missed it, or it is older than the rounds kept)."""
    rounds = sorted(record["round"] for record in history)
    return fail(f"round {until} is already done; this node has no record of it to show (its record of the run "
                f"holds rounds {rounds[0]} to {rounds[-1]})", EXIT_OK)


def _stop_reason(status: dict[str, Any]) -> str:
    """Why the daemon trains a run no more: it left, failed or was banned."""
    if status["phase"] == "left":
        return f"this node left it after round {status.get('left_after')}"
    return f"{status['phase']}: {status.get('error') or status.get('ban_reason')}"


def _timed_out(args: argparse.Namespace, shown: int) -> int:
    if args.until is None:
        return EXIT_OK
    return fail(f"round {args.until} was not done within {args.timeout:g} s (the newest: {shown})", EXIT_ERROR)


# --- run status, followed ------------------------------------------------------------------------


def follow_status(client: RpcClient, run_id: str, *, interval: float, json_lines: bool = False, rich: bool = False) -> int:
    """`run status --follow`: the status (`run_view.format_status`), then each round as it finishes
    and, when it changes, what the round under way waits for (and why it is stuck, once it is),
    asking every `interval` seconds until Ctrl-C (exit 0). With `json_lines` each round's record as
    one JSON line instead; with `rich` the live view of `run watch`. Exit 0 also once the node left
    the run, 1 if the daemon stopped training it; `RpcCallError` and `DaemonNotRunning` (a call over
    the client's timeout) pass through."""
    try:
        if rich:
            return _watch_live(argparse.Namespace(run_id=run_id, interval=interval, timeout=None, until=None), client)
        return _follow_lines(client, run_id, interval, json_lines)
    except KeyboardInterrupt:  # the way to stop following: not an error
        return EXIT_OK


def _follow_lines(client: RpcClient, run_id: str, interval: float, json_lines: bool) -> int:
    shown: int | None = None
    now = ""
    stuck = False
    for status in statuses(client, run_id, interval, None):
        if shown is None and not json_lines:
            print(format_status(status), flush=True)
            now, stuck = _now_line(status), bool(stuck_lines(status.get("waiting")))
        else:
            for record in new_records(status, shown or 0):
                print(json.dumps(record, sort_keys=True) if json_lines else f"  {round_line(record)}", flush=True)
        shown = max((record["round"] for record in status["history"]), default=shown or 0)
        if status["phase"] == "left":
            if not json_lines and now:  # it was training when we began: say it stopped
                print(f"  not training (left after round {status.get('left_after')})", flush=True)
            return EXIT_OK
        if status["phase"] in STOPPED:
            return fail(f"run {status['run_id']}: training stopped: {_stop_reason(status)}", EXIT_ERROR)
        if not json_lines and _now_line(status) != now:
            now = _now_line(status)
            print(f"  now: {now}", flush=True)
        lines = stuck_lines(status.get("waiting"))
        if not json_lines and bool(lines) != stuck:  # said once as it gets stuck (its seconds change every poll)
            stuck = bool(lines)
            for line in lines:
                print(line, flush=True)
    return EXIT_OK


def _now_line(status: dict[str, Any]) -> str:
    """What the round under way does and waits for, as `format_status`'s "now:" line has it."""
    if status["phase"] in STOPPED:
        return ""
    return "; ".join(part for part in phase_text(status) if part)


# --- run join, followed --------------------------------------------------------------------------


def follow_join(client: RpcClient, run_id: str, *, timeout: float, rich: bool, poll: float = FOLLOW_POLL_SECONDS) -> int:
    """Join `run_id` and show it (on a terminal drawn by rich, else as plain lines): finding the run
    and its participants, the downloads the join starts (a dataset, initial weights), then the
    state sync and this node's first round, until that round is done or `timeout` seconds passed.
    The exit status (0 done, 1 stopped or timed out, 130 Ctrl-C); `RpcCallError` (the join
    refused) and `DaemonNotRunning` pass through."""
    deadline = time.monotonic() + timeout
    with open_view(rich) as view:
        try:
            joined = _join_showing_downloads(client, run_id, view, poll, deadline)
        except KeyboardInterrupt:  # the daemon goes on joining: the call reached it
            return fail(f"stopped watching the join; see where it is with: locomesh run status {run_id}", EXIT_INTERRUPTED)
        view.done("join", joined_text(joined))
        try:
            outcome = _first_round(client, run_id, joined["joins_at"], view, poll, deadline)
        except KeyboardInterrupt:  # the join is done; only the watching stops
            return fail(f"stopped watching; the node goes on training: locomesh run status {run_id} --follow",
                        EXIT_INTERRUPTED)
    if outcome == "timeout":
        return fail(f"joined, but round {joined['joins_at']} was not done within {timeout:g} s; "
                    f"follow it with: locomesh run watch {run_id}", EXIT_ERROR)
    return EXIT_OK if outcome == "done" else fail(outcome, EXIT_ERROR)


def _join_showing_downloads(client: RpcClient, run_id: str, view: View, poll: float, deadline: float) -> dict[str, Any]:
    """``run.join``'s result, called in a thread while the downloads it starts are shown."""
    earlier = {download["id"]: download["state"] for download in _downloads(client)}
    call = _Call(RpcClient(client.port, client.cookie, timeout=max(client.timeout, deadline - time.monotonic())),
                 "run.join", {"run_id": run_id})
    view.step("join", "finding the run and meeting its participants")
    while not call.finished.wait(poll):
        _show_downloads(client, view, earlier)
    _show_downloads(client, view, earlier)  # the ends of the ones that finished since the last look
    return call.result()


def _downloads(client: RpcClient) -> list[dict[str, Any]]:
    checkpoints = client.call("node.status").get("checkpoints")
    return checkpoints.get("downloads", []) if isinstance(checkpoints, dict) else []


def _show_downloads(client: RpcClient, view: View, earlier: dict[str, str]) -> None:
    """Show the downloads that began after `earlier` was taken (checkpoint ID -> state then)."""
    for download in _downloads(client):
        if download["id"] not in earlier or earlier[download["id"]] in RUNNING_STATES:
            view.download(download)


def _first_round(client: RpcClient, run_id: str, first: int, view: View, poll: float, deadline: float) -> str:
    """Show the phases until this node is done with round `first` or a later one (trained or
    synced): "done"; "timeout" if `deadline` passed first; why, if the daemon stopped training."""
    while time.monotonic() < deadline:
        status = client.call("run.status", {"run_id": run_id})
        record = next(iter(new_records(status, first - 1)), None)
        if record is not None:
            view.done("round", round_line(record))
            return "done"
        if status["phase"] in STOPPED:
            view.done("round", f"round {status['round'] + 1}: training stopped" if "round" in status else "training stopped")
            return f"training stopped: {_stop_reason(status)}"
        view.step("round", *phase_text(status))
        time.sleep(poll)
    return "timeout"


class _Call:
    """One RPC call in a daemon thread (Ctrl-C must not wait for a join that can take minutes)."""

    def __init__(self, client: RpcClient, method: str, params: dict[str, Any]) -> None:
        self.finished = threading.Event()
        self._outcome: tuple[bool, Any] = (False, None)
        threading.Thread(target=self._run, args=(client, method, params), daemon=True).start()

    def _run(self, client: RpcClient, method: str, params: dict[str, Any]) -> None:
        try:
            self._outcome = (True, client.call(method, params))
        except Exception as error:  # noqa: BLE001 - handed to the caller, who raises it
            self._outcome = (False, error)
        finally:
            self.finished.set()

    def result(self) -> Any:
        ok, value = self._outcome
        if not ok:
            raise value
        return value
