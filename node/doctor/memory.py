"""Will a run fit in this node's memory? Its footprint against ``memory_limit`` and what is available.

A join runs `check_memory` before it builds anything large (node/rounds/service.py), and
``locomesh doctor RUN_ID`` shows the same verdict. The footprint is the run's task's own
(`locomesh.training.footprint`); the available memory is the operating system's figure (what can
be allocated without swapping: psutil's ``available``), read at the moment of the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from locomesh.node.config import human_size

NOT_ENOUGH_MEMORY = -32011  # the RPC error of a join this node has not the memory for


@dataclass(frozen=True)
class MemoryVerdict:
    """`needed` bytes against the node's `limit` (0: none) and the `available` memory."""

    needed: int
    limit: int
    available: int

    @property
    def fits(self) -> bool:
        return self.needed <= self.available and (self.limit == 0 or self.needed <= self.limit)

    def problem(self) -> str:
        """What was found, in one line: how much is needed against what there is."""
        need = human_size(self.needed)
        if self.limit and self.needed > self.limit:
            return f"this run needs about {need} of memory here, more than the node's memory_limit of {human_size(self.limit)}"
        if self.needed > self.available:
            return f"this run needs about {need} of memory here and only {human_size(self.available)} is available"
        limit = f", memory_limit {human_size(self.limit)}" if self.limit else ""
        return f"this run needs about {need} of memory here; {human_size(self.available)} available{limit}"

    def fix(self) -> str:
        """What to do about it ("" when it fits)."""
        if self.limit and self.needed > self.limit:
            return ("raise memory_limit (locomesh node start --memory-limit SIZE, or memory_limit in config.toml), "
                    "or join a run with a smaller model")
        if self.needed > self.available:
            return "close other programs, or use a machine with more memory"
        return ""

    def message(self) -> str:
        return f"{self.problem()}: {self.fix()}" if self.fix() else self.problem()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def available_memory() -> int:
    """Bytes the machine can give a new allocation now without swapping."""
    return int(psutil.virtual_memory().available)


def check_memory(body: Mapping[str, Any], contributors: int, limit: int) -> MemoryVerdict:
    """The memory verdict for the run of genesis manifest body `body` with `contributors` peers
    (blocking: builds the task on the meta device). `ParticipantError` for a run this node cannot
    train at all."""
    from locomesh.training.footprint import run_footprint  # light: torch loads when it runs

    return verdict_for(run_footprint(body, contributors=contributors), limit)


def verdict_for(footprint: Any, limit: int) -> MemoryVerdict:
    """`footprint` (a `training.footprint.Footprint`) against `limit` and the memory available now."""
    return MemoryVerdict(footprint.memory_needed, limit, available_memory())
