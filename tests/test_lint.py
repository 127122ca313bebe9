"""The repository passes `ruff check` under pyproject.toml's [tool.ruff] (pyflakes, pycodestyle's
errors and warnings, justified blind excepts, no unused `noqa`).

ruff is a test dependency (the `test` extra), so a missing ruff fails here rather than skipping:
`cli/dev test` reinstalls the extra when pyproject.toml changes. The check takes well under a
second; `--no-cache` keeps it from writing .ruff_cache into the repository.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent


def test_ruff_check_passes() -> None:
    try:
        from ruff import find_ruff_bin
    except ImportError:
        raise AssertionError("ruff is not installed: pip install -e '.[test]' (cli/dev test does)") from None
    result = subprocess.run(
        [find_ruff_bin(), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=TOP, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix`):\n{result.stdout}{result.stderr}"
