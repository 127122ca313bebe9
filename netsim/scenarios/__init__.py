"""Scenarios: each is a module with ``run(*, nodes, seed, progress, **options) -> report dict``."""

from __future__ import annotations

from collections.abc import Callable

from . import checkpoint, connectivity, dht, nat, train

SCENARIOS: dict[str, Callable[..., dict]] = {
    "connectivity": connectivity.run,
    "dht": dht.run,
    "checkpoint": checkpoint.run,
    "train": train.run,
    "nat": nat.run,
}
