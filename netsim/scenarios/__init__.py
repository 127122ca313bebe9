"""Scenarios: each is a module with ``run(*, nodes, seed, progress, **options) -> report dict``."""

from __future__ import annotations

from collections.abc import Callable

from . import connectivity

SCENARIOS: dict[str, Callable[..., dict]] = {
    "connectivity": connectivity.run,
}
