"""One finding of ``locomesh doctor``: what was checked, how it went, and what to do about it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"  # fail: the node cannot take part until it is fixed


@dataclass(frozen=True)
class Check:
    """`detail` says what was found, in plain words; `fix` what to do (empty when nothing needs doing)."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)
