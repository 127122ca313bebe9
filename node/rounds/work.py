"""What one peer keeps about the rounds of a run it takes part in (`participation`).

- `RoundWork` (node/exchange/work.py): the round being worked on, what the exchange fills;
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

from locomesh.node.exchange.work import RoundWork
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
