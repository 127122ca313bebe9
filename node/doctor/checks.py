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


def takes_part(checks: list[Check]) -> bool:
    """Can the node take part? Only a failed check stops it: a warning says what works less well
    (through relays, slower), so every check that stops the node must fail, not warn."""
    return not any(check.status == FAIL for check in checks)


def verdict(checks: list[Check]) -> str:
    """The last line of ``locomesh doctor``, in agreement with the checks above it."""
    failed = [check.name for check in checks if check.status == FAIL]
    if failed:
        return f"this node cannot take part: {len(failed)} problem(s) to fix ({', '.join(failed)})"
    warned = [check.name for check in checks if check.status == WARN]
    if warned:
        return f"this node can take part, with {len(warned)} warning(s) ({', '.join(warned)}): see their fixes"
    return "this node can take part"
