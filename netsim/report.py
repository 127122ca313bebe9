"""Reports: a scenario returns a plain dict; this writes it as JSON and as markdown.

A report is ``{"scenario", "overview", "verdict", "summary": {...}, "tables": [{"title",
"columns", "rows", "note"?}, ...], "glossary": {term: meaning}}``:

- ``overview``: two or three plain sentences, what was simulated and what came out;
- ``verdict``: ``{"result": "PASS" | "FAIL", "criteria": [{"criterion", "measured", "passed"}]}``
  (`verdict`), PASS when every criterion passed; `verdict_line` states it in one line;
- ``glossary``: every term of the report a newcomer would not know (`glossary` adds the ones
  all scenarios share).

Both renderings start with the overview and the verdict. Everything in a report must come from
the simulation (virtual times, counts), never from the machine that ran it (wall time, memory),
so that the same seed gives the same bytes; the CLI and the benchmark print machine figures
separately.
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


def criterion(what: str, measured: Any, passed: bool) -> dict[str, Any]:
    """One thing a verdict judges: `what` says the requirement in plain words (with its threshold),
    `measured` what the simulation gave."""
    return {"criterion": what, "measured": measured, "passed": bool(passed)}


def verdict(criteria: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """PASS when every one of `criteria` (`criterion`) passed, else FAIL."""
    passed = all(entry["passed"] for entry in criteria)
    return {"result": "PASS" if passed else "FAIL", "criteria": list(criteria)}


def verdict_line(judged: dict[str, Any], *, markdown: bool = False) -> str:
    """The verdict in one line: PASS or FAIL, then each criterion with what was measured (`markdown`:
    the result in bold)."""
    parts = [f"{entry['criterion']} (measured {_cell(entry['measured'])}): {'pass' if entry['passed'] else 'FAIL'}"
             for entry in judged["criteria"]]
    result = f"**Verdict: {judged['result']}**" if markdown else judged["result"]
    return f"{result}, judged by: " + "; ".join(parts)


def passed(report: dict[str, Any]) -> bool:
    """Whether the report's verdict is PASS (a report without a verdict judged nothing: it passes)."""
    return "verdict" not in report or report["verdict"]["result"] == "PASS"


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``"1 node"``, ``"3 nodes"``: `count` with the noun's right form (`plural` when adding "s" is wrong)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


COMMON_TERMS = {
    "seed": "the number the simulation's random choices start from: the same seed gives the same report",
    "virtual seconds": "time on the simulation's own clock, not how long the computer took to run it "
                       "(a 10-minute simulated run may take seconds, or hours)",
    "p50, p90, p99": "percentiles: p90 is the value that 90% of the measurements are at or below; "
                     "p50 is the median",
    "errors counted by nodes": "failures the node code counted by kind (a dial that timed out, a stream reset...); "
                               "in a network full of NATs many dials fail by design, so counts are not faults by "
                               "themselves",
}


def glossary(terms: dict[str, str],
             common: Sequence[str] = ("seed", "virtual seconds", "p50, p90, p99")) -> dict[str, str]:
    """A report's glossary: the `common` terms (`COMMON_TERMS`) the report uses, then its own `terms`."""
    return {**{name: COMMON_TERMS[name] for name in common}, **terms}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of `values`; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


LEADING_KEYS = ("scenario", "overview", "verdict")


def to_json(report: dict[str, Any]) -> str:
    """The report as JSON: the scenario, overview and verdict first, then the rest, keys sorted."""
    leading = {key: report[key] for key in LEADING_KEYS if key in report}
    ordered = {**leading, **{key: report[key] for key in sorted(report) if key not in leading}}
    return json.dumps(_keys_sorted(ordered, top=True), indent=2) + "\n"


def _keys_sorted(value: Any, *, top: bool = False) -> Any:
    """`value` with every dict below the top level in key order (the top level keeps its order)."""
    if isinstance(value, dict):
        keys = value if top else sorted(value)
        return {key: _keys_sorted(value[key]) for key in keys}
    if isinstance(value, list):
        return [_keys_sorted(item) for item in value]
    return value


def to_markdown(report: dict[str, Any], appendix: Sequence[str] = ()) -> str:
    """The report as markdown: its overview and verdict, its summary, each table, its glossary, then
    the `appendix` lines (the CLI's plots)."""
    lines = [f"# netsim: {report['scenario']}", ""]
    if "overview" in report:
        lines += [report["overview"], ""]
    if "verdict" in report:
        lines += [verdict_line(report["verdict"], markdown=True), ""]
    lines += [f"- **{key}**: {_cell(value)}" for key, value in report["summary"].items()]
    for entry in report["tables"]:
        lines += ["", f"## {entry['title']}", ""]
        if entry.get("note"):
            lines += [entry["note"], ""]
        lines.append("| " + " | ".join(entry["columns"]) + " |")
        lines.append("|" + "---|" * len(entry["columns"]))
        lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in entry["rows"]]
    if report.get("glossary"):
        lines += ["", "## Glossary", ""]
        lines += [f"- **{term}**: {meaning}" for term, meaning in report["glossary"].items()]
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
