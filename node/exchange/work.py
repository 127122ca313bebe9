"""What one peer has for the round being trained and exchanged (`RoundWork`): our payload, the
others' payloads as they arrive, the states the round's candidate values give, timings, and the
cancel scopes of its fetches and tasks. node/rounds/participation.py keeps one per round; the
exchange (seam.py and its implementations) reads and fills it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio


class RoundClock(Protocol):
    """What the exchange reads of the round's timing (node/rounds/machine.py's `RoundMachine` is
    one): the run's deadline settings, the round under way (its number, when its first commit was
    seen) and when a proposer cuts its set."""

    timing: Any  # round_deadline, min_collect
    current: Any  # number, first_seen

    def window(self) -> float: ...

    def cutoff(self) -> float: ...


@dataclass
class RoundWork:
    """What this peer has for the round being trained."""

    round: int
    started: float
    payload_id: bytes = b""
    payload_size: int = 0
    train_loss: float | None = None
    train_seconds: float | None = None
    committed: bool = False
    training: bool = False  # our inner steps of the round started (a voter that only fetches has work too)
    payloads: dict[bytes, bytes | memoryview] = field(default_factory=dict)  # author -> payload bytes
    bytes_fetched: int = 0  # payload bytes downloaded (whether or not their payload came whole)
    arrived: dict[bytes, float] = field(default_factory=dict)  # author -> when its payload was in hand
    exchange_seconds: float | None = None
    fetch_seconds: float | None = None
    aggregate_seconds: float | None = None
    trained_ahead: bool = False
    exchange: Any = None  # the round's `ExchangeChoice` (node/exchange/mode.py)
    # With contribution scoring on: θ before the round's outer step, and the set aggregated on it.
    scoring_base: Any = None
    aggregated: tuple[bytes, ...] = ()
    refused: str | None = None  # why our own outer step refused our payload, if it did (outcome.py)
    # The state before the round's first outer step: every value the agreement asks about is
    # aggregated from it; and the states those values gave: value ID -> (state hash, snapshot).
    before: Any = None
    results: dict[bytes, tuple[bytes | None, Any]] = field(default_factory=dict)
    holds: bytes | None = None  # the value whose state the participant holds now (None: `before`)
    adopted: bytes | None = None  # the certified value, once its state is ours: θ moves no more this round
    # One value at a time: its shards and its outer step are computed from `before` (θ_r, round r).
    aggregating: trio.Lock = field(default_factory=trio.Lock)
    fetching: dict[bytes, trio.Event] = field(default_factory=dict)  # author -> set when its fetch under way ends
    fetched_ok: set[bytes] = field(default_factory=set)  # authors whose payload (or checked shard) is here
    fetch_failures: dict[bytes, int] = field(default_factory=dict)  # author -> fetches of its payload that failed
    fetches: list[trio.CancelScope] = field(default_factory=list)
    tasks: list[trio.CancelScope] = field(default_factory=list)  # training, aggregation
    # Set to stop the inner steps at the next step: a cancelled thread cannot be interrupted, and
    # the compute lock it holds would keep a replay (or a sync's load) waiting for all H steps.
    stop_training: threading.Event = field(default_factory=threading.Event)

    @property
    def sharded(self) -> bool:
        """Does the round use sharded exchange (node/exchange/)?"""
        return self.exchange is not None and self.exchange.mode == "sharded"

    def cancel(self, *, fetches_only: bool = False, training_only: bool = False) -> None:
        """Cancel the fetches, or the tasks (training; aggregation only once it runs), or both."""
        if not fetches_only:
            self.stop_training.set()
        for scope in [*(() if training_only else self.fetches), *(() if fetches_only else self.tasks)]:
            scope.cancel()
