"""What one peer keeps about the rounds of a run it takes part in (`participation`).

- `RoundWork`: the round being worked on: our payload, the others' payloads as they arrive,
  timings, and the cancel scopes of its fetches and tasks;
- `TrainingAhead`: with one-round-delayed outer updates, the inner steps of the next round,
  started before the round machine starts that round;
- `RoundRecord`: one finished round, as `run.status` shows it, with what became of our part in
  it (`outcome`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from locomesh.node.rounds.events import RoundDone
from locomesh.node.rounds.outcome import Outcome


@dataclass
class RoundRecord:
    """One finished round, for `run.status` and the swarm's progress lines."""

    round: int
    state_hash: str
    synced: bool
    contributors: int
    train_loss: float | None
    eval_loss: float | None
    floor: float | None
    payload_bytes: int
    bytes_fetched: int | None  # payload bytes we downloaded for the round (None: synced)
    seconds: float  # from the start of our training to the round's certificate
    train_seconds: float | None  # the inner steps of the payload we committed, if we did (synced rounds too)
    exchange_seconds: float | None  # last counted commit seen -> aggregate computed (fetch + aggregation)
    fetch_seconds: float | None  # last counted commit seen -> the last payload aggregated in hand
    aggregate_seconds: float | None  # the outer step alone (decode, validate, aggregate, Nesterov)
    finished_at: float
    trained_ahead: bool = False  # our payload was trained while the round before was exchanged (delayed updates)
    exchange: dict[str, Any] | None = None  # which exchange the round used, and why (`ExchangeChoice.to_json`)
    # What became of our part (outcome.py): "synced" only says how the state came, not whether our
    # payload counted. None in records kept before outcomes were.
    outcome: str | None = None
    outcome_why: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def of(cls, done: RoundDone, work: RoundWork | None, evaluation: dict[str, Any], now: float,
           outcome: Outcome | None = None) -> RoundRecord:
        """The record of round `done`, with what `work` (the round we last worked on) says about it."""
        this_round = work if work is not None and work.round == done.round else None
        mine = None if done.synced else this_round  # we computed the round's state ourselves
        ours = this_round if this_round is not None and this_round.committed else None  # our payload went out
        return cls(
            round=done.round, state_hash=done.state_hash.hex(), synced=done.synced, contributors=done.contributors,
            train_loss=None if ours is None else ours.train_loss,  # a round overtaken by its certificate was still trained
            eval_loss=evaluation["loss"], floor=evaluation["floor"],
            payload_bytes=0 if mine is None else mine.payload_size,
            bytes_fetched=None if mine is None else mine.bytes_fetched,
            seconds=0.0 if mine is None else now - mine.started,
            train_seconds=None if ours is None else ours.train_seconds,
            exchange_seconds=None if mine is None else mine.exchange_seconds,
            fetch_seconds=None if mine is None else mine.fetch_seconds,
            aggregate_seconds=None if mine is None else mine.aggregate_seconds, finished_at=time.time(),
            trained_ahead=mine is not None and mine.trained_ahead,
            exchange=None if this_round is None or this_round.exchange is None else this_round.exchange.to_json(),
            outcome=None if outcome is None else outcome.kind, outcome_why=None if outcome is None else outcome.why,
        )


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
    # The state before the round's first outer step: a vote that died with a split attempt is cast
    # again for another set, aggregated from this state.
    before: Any = None
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


@dataclass
class TrainingAhead:
    """Inner steps of a round, started before the machine starts that round (delayed updates)."""

    round: int
    exchange: str = "allgather"  # the exchange its payload is encoded for
    stop: threading.Event = field(default_factory=threading.Event)
    done: trio.Event = field(default_factory=trio.Event)
    contribution: Any = None  # set once training finished (None if it was cancelled)
    scopes: list[trio.CancelScope] = field(default_factory=list)

    def cancel(self) -> None:
        self.stop.set()
        for scope in self.scopes:
            scope.cancel()
