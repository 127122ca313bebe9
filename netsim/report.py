"""Reports: a scenario returns a plain dict; this writes it as JSON and as markdown.

A report is ``{"scenario", "summary": {...}, "tables": [{"title", "columns",
"rows", "note"?}, ...]}``. Everything in it must come from the simulation
(virtual times, counts), never from the machine that ran it (wall time,
memory), so that the same seed gives the same bytes; the CLI and the
benchmark print machine figures separately.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from locomesh.node.files import atomic_write


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"title": title, "columns": list(columns), "rows": [list(row) for row in rows]}
    if note:
        entry["note"] = note
    return entry


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def to_markdown(report: dict[str, Any], appendix: Sequence[str] = ()) -> str:
    """The report as markdown: its summary, each table, then the `appendix` lines (the CLI's plots)."""
    lines = [f"# netsim: {report['scenario']}", ""]
    lines += [f"- **{key}**: {_cell(value)}" for key, value in report["summary"].items()]
    for entry in report["tables"]:
        lines += ["", f"## {entry['title']}", ""]
        if entry.get("note"):
            lines += [entry["note"], ""]
        lines.append("| " + " | ".join(entry["columns"]) + " |")
        lines.append("|" + "---|" * len(entry["columns"]))
        lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in entry["rows"]]
    if appendix:
        lines += ["", *appendix]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], path: str | Path, appendix: Sequence[str] = ()) -> list[Path]:
    """Write `path` as JSON and the same name with ``.md`` as markdown (`appendix` lines at its end);
    returns both paths."""
    json_path = Path(path)
    md_path = json_path.with_suffix(".md")
    atomic_write(json_path, to_json(report).encode())
    atomic_write(md_path, to_markdown(report, appendix).encode())
    return [json_path, md_path]


def table_rows(report: dict[str, Any], title: str) -> list[dict[str, Any]] | None:
    """The rows of the report's table `title`, each as {column: value}; None if it has no such table."""
    entry = next((entry for entry in report["tables"] if entry["title"] == title), None)
    return None if entry is None else [dict(zip(entry["columns"], row)) for row in entry["rows"]]


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    return str(value)
