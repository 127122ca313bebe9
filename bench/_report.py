"""How every benchmark prints its results: one line of JSON, then the same rows as a markdown table.

    report("codec_throughput", rows=[{"mode": "int8", "encode_MBps": 812.3}, ...], meta={"numel": 2**24})

The JSON line is ``{"bench": name, "meta": meta, "rows": rows}`` (machine-readable,
one line so logs can be grepped); the table has one column per key, in the order
keys first appear across the rows.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any


def report(name: str, rows: list[dict[str, Any]], meta: dict[str, Any], *, file=None) -> None:
    """Print `rows` of benchmark `name` as one JSON line and a markdown table (to stdout by default)."""
    out = file or sys.stdout
    print(json.dumps({"bench": name, "meta": meta, "rows": rows}, default=str), file=out)
    print(file=out)
    print(markdown_table(rows), file=out)
    out.flush()


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table; floats keep 4 significant digits, missing cells are blank."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(column, "")) for column in columns) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """Facts about where a benchmark ran, for its `meta`."""
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}


def best_of(function: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Run `function` `repeats` times: (best wall seconds, best CPU seconds of this process, last result).

    On a shared machine the CPU time of a single-threaded benchmark is the steadier number:
    other processes stretch wall time but not the time this one spent on a core.
    """
    wall = cpu = float("inf")
    result = None
    for _ in range(max(1, repeats)):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        result = function()
        cpu = min(cpu, time.process_time() - cpu_start)
        wall = min(wall, time.perf_counter() - wall_start)
    return wall, cpu, result


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")
