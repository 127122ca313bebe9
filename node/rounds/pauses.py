"""Pausing a run: the service's side of `run.pause` / `run.resume`, and where it is remembered.

A paused participation goes on: it keeps the run's state current (every certified round is adopted
or synced) and keeps voting, but after the round under way it trains none (no round waits for a
payload: a proposer takes what it holds by its cut). Resuming trains again from the next round,
from the state it already holds: no checkpoint download.

A pause outlives a restart: it is a marker file per run,

    <data dir>/runs/paused/<run id>

written atomically and removed on resume.
"""

from __future__ import annotations

import os
from pathlib import Path

from locomesh.protocol.runs import format_run_id

from locomesh.node.files import Marks


class PausedRuns:
    """The runs this node's owner paused, kept in the data dir."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self._marks = Marks(Path(data_dir) / "runs" / "paused")

    def __contains__(self, run_id: bytes) -> bool:
        return self._marks.get(format_run_id(run_id)) is not None

    def pause(self, run_id: bytes) -> None:
        self._marks.put(format_run_id(run_id))

    def resume(self, run_id: bytes) -> None:
        self._marks.remove(format_run_id(run_id))
