"""Progress that a command shows while the daemon works: steps under way and checkpoint downloads.

Two views with one interface, so a command says what happens once and the view decides how it
looks: `RichView` (a terminal: spinners and bars that redraw in place) and `PlainView` (a pipe, a
file, a test: one line per change, nothing redrawn, no escape codes). `open_view` picks one.

A download is given as the daemon reports it (``DownloadProgress.to_json``: id, state,
chunks_stored of chunks_total, bytes_fetched, bytes_total, error), from ``checkpoint.progress``
or the downloads in ``node.status``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from locomesh.node.transfer.states import RUNNING_STATES

from .common import human_size, plural



class View(Protocol):
    def step(self, key: str, text: str, detail: str = "") -> None:
        """Step `key` is now at `text` (`detail`: what changes often, such as counts; a terminal only)."""

    def download(self, progress: dict[str, Any]) -> None:
        """A download's progress, as the daemon reports it."""

    def done(self, key: str, text: str) -> None:
        """Step `key` ended; `text` says how, as a line that stays."""

    def line(self, text: str) -> None:
        """A line that stays (a result), printed above whatever is drawn live."""


def download_label(progress: dict[str, Any]) -> str:
    return f"checkpoint {progress['id'][:12]}"


def download_outcome(progress: dict[str, Any]) -> str:
    """How a finished download ended, in one line."""
    label = download_label(progress)
    if progress["state"] == "done":
        size = f", {human_size(progress.get('bytes_fetched', 0))} fetched" if progress.get("bytes_fetched") else ""
        return f"{label}: done, {plural(progress['chunks_total'], 'chunk')}{size}"
    reason = f": {progress['error']}" if progress.get("error") else ""
    return f"{label}: {progress['state']}{reason}"


class PlainView:
    """One line per change of a step's text, and one per download when it starts and when it ends."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout
        self.steps: dict[str, str] = {}
        self.downloads: dict[str, str] = {}  # id -> the state last shown

    def step(self, key: str, text: str, detail: str = "") -> None:
        if self.steps.get(key) != text:  # `detail` changes too often for a line each time
            self.steps[key] = text
            self.line(text)

    def download(self, progress: dict[str, Any]) -> None:
        shown = self.downloads.get(progress["id"])
        running = progress["state"] in RUNNING_STATES
        if shown is None and running:
            self.line(f"{download_label(progress)}: downloading")
        if not running and shown != progress["state"]:
            self.line(download_outcome(progress))
        self.downloads[progress["id"]] = "running" if running else progress["state"]

    def done(self, key: str, text: str) -> None:
        self.steps.pop(key, None)
        self.line(text)

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class RichView:
    """A rich `Progress`: a spinner per step, a bar per download (chunks stored of all, bytes)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}  # step key or download id -> its rich task
        self.ended: set[str] = set()  # downloads shown to their end

    def step(self, key: str, text: str, detail: str = "") -> None:
        from rich.markup import escape  # the daemon's words are not markup

        description = escape(text) + (f" [dim]· {escape(detail)}" if detail else "")
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(description, total=None, count="")
        self.progress.update(self.tasks[key], description=description)

    def download(self, progress: dict[str, Any]) -> None:
        key = progress["id"]
        if key in self.ended:
            return
        total = progress["chunks_total"] or None  # unknown until the manifest is in
        count = f"{progress['chunks_stored']}/{total or '?'} chunks"
        if progress.get("bytes_total"):
            count += f", {human_size(progress.get('bytes_fetched', 0))} fetched of {human_size(progress['bytes_total'])}"
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(download_label(progress), total=total, count=count)
        self.progress.update(self.tasks[key], total=total, completed=progress["chunks_stored"], count=count)
        if progress["state"] not in RUNNING_STATES:
            self.ended.add(key)
            self.done(key, download_outcome(progress))

    def done(self, key: str, text: str) -> None:
        if key in self.tasks:
            self.progress.remove_task(self.tasks.pop(key))
        self.line(text)

    def line(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)


@contextmanager
def open_view(rich: bool) -> Iterator[View]:
    """A `RichView` drawn on the terminal while the block runs when `rich`, else a `PlainView`."""
    if not rich:
        yield PlainView()
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
               TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        yield RichView(progress)
