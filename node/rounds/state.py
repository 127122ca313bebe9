"""What the round machine holds: the run's deadline settings (`Timing`) and its record of the round
under way (`RoundState`). Plain data; the rules that change it are in `machine`."""

from __future__ import annotations

from dataclasses import dataclass, field

from locomesh.node.rounds.events import Author

MIN_COLLECT_SECONDS = 2.0


@dataclass
class Timing:
    """Deadline settings; `round_deadline` comes from the run's hyperparameters."""

    round_deadline: float = 600.0
    min_collect: float = MIN_COLLECT_SECONDS
    min_peers: int = 1  # a round starts only once this many peers are eligible for it


@dataclass
class RoundState:
    """The round machine's record of the round under way (`RoundMachine.current`)."""

    number: int
    started: float
    seed: bytes = b""  # what the round's proposer and steward orders are drawn from
    attempt: int = 0  # the attempt of this round we saw last (crdt/electorate.py)
    attempt_started: float = 0.0  # when we saw it begin (attempt 0: when the round started here)
    timed_out: set[int] = field(default_factory=set)  # attempts we said passed the deadline
    committed_at: float | None = None  # when our own commit went out
    arrivals: dict[Author, float] = field(default_factory=dict)  # others' commits: when first seen
    fetched: set[Author] = field(default_factory=set)
    failed: set[Author] = field(default_factory=set)
    failures: dict[Author, int] = field(default_factory=dict)  # failed fetches of each author's payload
    refetches: dict[Author, int] = field(default_factory=dict)  # failed fetches after our cut (they set refetch_at)
    refetch_at: dict[Author, float] = field(default_factory=dict)  # not asked for again before then
    closed_at: float = 0.0  # when our own cut happened
    counted: frozenset[Author] = frozenset()  # the others' commits seen by our cut
    counted_ours: bool = False  # whether our own commit was in by our cut
    chosen: tuple[Author, ...] | None = None  # the proposal we follow
    following: Author | None = None  # its proposer
    abandoned: set[Author] = field(default_factory=set)  # proposers whose set could not be fetched
    last_commit: float = 0.0
    voted_attempt: int | None = None  # the attempt our vote went out in
    replay: bool = False  # aggregating a round certified without us, to adopt its state (no vote)

    @property
    def first_seen(self) -> float | None:
        times = [*self.arrivals.values(), *([] if self.committed_at is None else [self.committed_at])]
        return min(times, default=None)
