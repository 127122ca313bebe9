"""A run's finished rounds, kept in the data dir: `run status` still shows them after `run leave`
and after a restart.

    <data dir>/rounds/<run id>.jsonl   one `RoundRecord` a line, oldest first
    <data dir>/rounds/<run id>.left    the last round this node counted in, once it left the run

The records are this node's own view of its rounds, not the run's state (that is the CRDT), so a
record lost in a crash costs nothing: appends are not fsynced. The file is bounded: once it holds
twice the rounds kept, it is rewritten atomically with the newest ones; a load reads at most
`MAX_FILE_BYTES` from its end and skips any line that is not a record (a torn last line, an edit).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections import deque
from collections.abc import Iterable
from pathlib import Path

from locomesh.node.files import Marks, atomic_write
from locomesh.node.rounds.work import RoundRecord
from locomesh.protocol.runs import format_run_id

logger = logging.getLogger(__name__)

FOLDER = "rounds"
RECORDS_SUFFIX = ".jsonl"
LEFT_SUFFIX = ".left"
MAX_LINE_BYTES = 4096  # a record is a few hundred bytes; a longer line is not one of ours
MAX_FILE_BYTES = 4 * 1024 * 1024
_FIELDS = frozenset(field.name for field in dataclasses.fields(RoundRecord))


class RoundHistory(deque):
    """The newest `maxlen` finished rounds of one run; with a `path`, each one appended is also
    written to that file, and `load` gives back what an earlier process wrote there."""

    def __init__(self, records: Iterable[RoundRecord] = (), *, maxlen: int, path: Path | None = None) -> None:
        super().__init__(records, maxlen=maxlen)
        self.path = path
        self._lines = len(self)  # records in the file: past twice `maxlen`, it is rewritten with the newest

    @classmethod
    def load(cls, data_dir: str | os.PathLike | None, run_id: bytes, *, maxlen: int) -> RoundHistory:
        """The history kept for `run_id` under `data_dir`, compacted to its newest `maxlen`
        records; in memory only when `data_dir` is None (a node without a data dir)."""
        if data_dir is None:
            return cls(maxlen=maxlen)
        path = _folder(data_dir) / (format_run_id(run_id) + RECORDS_SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        records = _read_records(path)
        history = cls(records, maxlen=maxlen, path=path)
        history._lines = len(records)
        if len(records) > maxlen or not _ends_with_newline(path):  # a torn last line would swallow the next
            history._rewrite()
        return history

    def append(self, record: RoundRecord) -> None:
        """Keep `record` (the oldest drops out past `maxlen`) and add it to the file."""
        super().append(record)
        if self.path is None:
            return
        try:
            if self._lines >= 2 * (self.maxlen or 1):
                self._rewrite()
            else:
                with open(self.path, "a", encoding="utf-8", opener=_private) as file:
                    file.write(_line(record))
                self._lines += 1
        except OSError as error:  # a full disk must not stop training: the history is only a view
            logger.warning("could not keep round %d's record in %s: %s", record.round, self.path, error)

    def _rewrite(self) -> None:
        """Replace the file with the records held now (atomically); nothing to do for an empty history."""
        if self.path is None or (not self and not self.path.exists()):
            return
        atomic_write(self.path, "".join(_line(record) for record in self).encode("utf-8"), mode=0o600)
        self._lines = len(self)


def read_history(data_dir: str | os.PathLike, run_id: bytes, maxlen: int) -> RoundHistory:
    """The newest `maxlen` records kept for `run_id`, read only (appending to it writes nothing)."""
    return RoundHistory(_read_records(_folder(data_dir) / (format_run_id(run_id) + RECORDS_SUFFIX)), maxlen=maxlen)


def mark_left(data_dir: str | os.PathLike | None, run_id: bytes, last_round: int) -> None:
    """Remember that this node left `run_id` after `last_round` (a restart does not take it up again)."""
    if data_dir is not None:
        _left_marks(data_dir).put(format_run_id(run_id), b"%d\n" % last_round)


def clear_left(data_dir: str | os.PathLike | None, run_id: bytes) -> None:
    """Forget `mark_left` for `run_id` (this node joined it again)."""
    if data_dir is not None:
        _left_marks(data_dir).remove(format_run_id(run_id))


def left_after(data_dir: str | os.PathLike | None, run_id: bytes) -> int | None:
    """The last round this node counted in before it left `run_id`, or None if it did not leave it."""
    if data_dir is None:
        return None
    try:
        mark = _left_marks(data_dir).get(format_run_id(run_id))
        return None if mark is None else int(mark.decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        logger.warning("unreadable leave mark of run %s: %s", format_run_id(run_id)[:16], error)
        return 0


def _left_marks(data_dir: str | os.PathLike) -> Marks:
    return Marks(_folder(data_dir), LEFT_SUFFIX)


def _private(path: str, flags: int) -> int:
    """`open`'s opener for a file only its owner reads, like the rest of the data dir."""
    return os.open(path, flags, 0o600)


def _folder(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / FOLDER


def _ends_with_newline(path: Path) -> bool:
    """Whether `path` is missing, empty, or ends with a whole line."""
    try:
        with open(path, "rb") as file:
            if file.seek(0, os.SEEK_END) == 0:
                return True
            file.seek(-1, os.SEEK_END)
            return file.read(1) == b"\n"
    except FileNotFoundError:
        return True


def _line(record: RoundRecord) -> str:
    return json.dumps(record.to_json(), sort_keys=True, separators=(",", ":")) + "\n"


def _read_records(path: Path) -> list[RoundRecord]:
    """The records in `path` (at most `MAX_FILE_BYTES` from its end), oldest first; none if it is missing."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - MAX_FILE_BYTES))
            data = file.read(MAX_FILE_BYTES)
    except FileNotFoundError:
        return []
    except OSError as error:
        logger.warning("could not read the round history %s: %s", path, error)
        return []
    lines = data.split(b"\n")
    if size > MAX_FILE_BYTES:
        lines = lines[1:]  # the first is cut
    return [record for line in lines if (record := _record(line)) is not None]


def _record(line: bytes) -> RoundRecord | None:
    """The record on `line`, or None if it is not one (blank, torn, too long, edited)."""
    if not line.strip() or len(line) > MAX_LINE_BYTES:
        return None
    try:
        fields = json.loads(line)
        # Fields a later version added are dropped, so that going back a version keeps the history.
        record = RoundRecord(**{k: v for k, v in fields.items() if k in _FIELDS}) if isinstance(fields, dict) else None
    except (ValueError, TypeError):
        return None
    if record is None or not isinstance(record.round, int) or isinstance(record.round, bool):
        return None
    return record
