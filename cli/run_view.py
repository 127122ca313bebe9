"""How a run's rounds read in the terminal: one line or one table row per finished round (a
``run.status`` history record, node/rounds/work.py `RoundRecord`), and what a round under way is
doing. `run status`, `run watch` and `run join` all show rounds through these, so a round looks
the same wherever it appears."""

from __future__ import annotations

from typing import Any

from .common import TextTable, human_size

ROUND_COLUMNS = ("ROUND", "EVAL LOSS", "FLOOR", "TRAIN LOSS", "PAYLOADS", "SENT", "FETCHED", "TRAIN S", "EXCHANGE S",
                 "ROUND S")

# Round machine phases (node/rounds/events.py `Phase`) in a user's words.
PHASE_WORDS = {
    "idle": "waiting to start", "train": "training (inner steps)", "collect": "exchanging payloads",
    "propose": "agreeing on the round's set", "replay": "fetching the agreed payloads", "aggregate": "outer step",
    "voted": "waiting for the certificate", "sync": "syncing the run's state",
}


def round_line(record: dict[str, Any]) -> str:
    """One finished round: eval loss (and the floor), train loss, payloads aggregated or synced,
    bytes sent and fetched, seconds."""
    parts = [f"eval loss {_loss(record['eval_loss'])}" + ("" if record["floor"] is None else f" (floor {record['floor']:.4f})")]
    if record.get("train_loss") is not None:
        parts.append(f"train loss {record['train_loss']:.4f}")
    parts.append("synced" if record["synced"] else f"{record['contributors']} payloads")
    if record.get("payload_bytes"):
        parts.append(f"{_size(record['payload_bytes'])} sent")
    if record.get("bytes_fetched"):
        parts.append(f"{_size(record['bytes_fetched'])} fetched")
    parts.append(f"{record['seconds']:.1f} s")
    return f"round {record['round']:>4}: " + ", ".join(parts)


def round_table(records: list[dict[str, Any]]) -> TextTable:
    """Finished rounds as a table, one row each (`ROUND_COLUMNS`)."""
    return TextTable.columns(ROUND_COLUMNS, [_cells(record) for record in records])


def _cells(record: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(record["round"]), _loss(record["eval_loss"]), _loss(record["floor"]), _loss(record.get("train_loss")),
        "synced" if record["synced"] else str(record["contributors"]), _size(record.get("payload_bytes")),
        _size(record.get("bytes_fetched")), _seconds(record.get("train_seconds")),
        _seconds(record.get("exchange_seconds")), _seconds(record["seconds"]),
    )


def phase_text(status: dict[str, Any]) -> tuple[str, str]:
    """What the round under way does (``run.status``), as (what, waiting for whom): the first part
    changes with the phase, the second with every commit or vote that arrives."""
    phase = status["phase"]
    if phase == "sync":
        return f"syncing the run's state (certified round {status['certified']})", ""
    waiting = status.get("waiting") or {}
    detail = f"waiting for {waiting['for']}" if waiting.get("for") else ""
    return f"round {status['round'] + 1}: {PHASE_WORDS.get(phase, phase)}", detail


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _size(count: int | None) -> str:
    """A byte count as `human_size` writes it; "-" for none or 0 (a synced round sends nothing)."""
    return "-" if not count else human_size(count)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
