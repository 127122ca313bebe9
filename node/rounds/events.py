"""What the round machine (`machine`) reads and asks for: its phases, the events fed to it
and the actions it returns. Plain frozen values, no behaviour: the machine, the service that
carries out its actions (`participation`), the simulator and the tests all speak them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

PayloadId = bytes
Author = bytes


class Phase(enum.Enum):
    IDLE = "idle"  # holds the state of the certified round; not (yet) eligible for the next one
    TRAIN = "train"  # inner steps under way
    COLLECT = "collect"  # committed; waiting for the cutoff and the others' payloads
    PROPOSE = "propose"  # cut off; waiting for the round's proposal and the payloads it names
    REPLAY = "replay"  # our round was certified without us: fetching the rest of a proposal to rebuild it
    AGGREGATE = "aggregate"  # outer step under way
    VOTED = "voted"  # waiting for the round's certificate
    SYNC = "sync"  # fetching the certified state


# --- inputs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What the run state says now. `commits`, `electorate` and the rest are for round `certified + 1`."""

    now: float
    certified: int  # newest certified round (0: none yet; the genesis state)
    certified_hash: bytes | None  # its state hash (None for round 0)
    electorate: frozenset[Author]  # who votes and proposes in round certified + 1 (its current attempt)
    commits: dict[Author, tuple[PayloadId, int]]  # round certified + 1: author -> (payload ID, size)
    proposals: dict[Author, tuple[Author, ...]] = field(default_factory=dict)  # round certified + 1
    certified_proposals: dict[Author, tuple[Author, ...]] = field(default_factory=dict)  # round certified
    unreachable: frozenset[Author] = frozenset()  # committed authors we hold no connection to right now
    unconfirmed: frozenset[Author] = frozenset()  # committed authors our own set must leave out for now (sharded)
    lapsed: bool = False  # we are a member left out of the contributors for want of activity: join again
    contributors: frozenset[Author] | None = None  # who may commit (None: the electorate)
    attempt: int = 0  # the current attempt of round certified + 1 (crdt/electorate.py)
    seed: bytes = b""  # randomness no key could know when it was made: the certified hash, or the run ID
    member: bool = True  # our newest join/leave is a join (a leave while sitting out turns it off)
    sit_out: bool = False  # this node contributes to no round for now (paused, or outside its schedule)
    standing: frozenset[Author] = frozenset()  # who holds a standing vote in the current attempt
    split_votes: dict[Author, int] = field(default_factory=dict)  # proposer -> votes naming it in the latest split attempt

    @property
    def able(self) -> frozenset[Author]:
        """Who may commit in round certified + 1."""
        return self.electorate if self.contributors is None else self.contributors


@dataclass(frozen=True)
class Trained:
    round: int
    payload_id: PayloadId
    size: int
    seconds: float
    now: float


@dataclass(frozen=True)
class Fetched:
    round: int
    author: Author
    ok: bool  # False: no provider delivered it before the service gave up
    now: float


@dataclass(frozen=True)
class Aggregated:
    round: int
    state_hash: bytes | None  # None: nothing valid to aggregate (every payload was rejected)
    now: float


@dataclass(frozen=True)
class Withheld:
    """Sharded exchange: nobody serves `author`'s part of the set being aggregated, so it cannot
    be aggregated (as a payload of the followed set that failed its fetches in allgather)."""

    round: int
    author: Author
    now: float


@dataclass(frozen=True)
class Synced:
    round: int
    state_hash: bytes | None  # None: the sync failed; it is tried again after RETRY_SECONDS
    now: float


Event = Union[Observation, Trained, Fetched, Aggregated, Withheld, Synced]


# --- outputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartTraining:
    round: int


@dataclass(frozen=True)
class PublishCommit:
    round: int
    payload_id: PayloadId
    size: int


@dataclass(frozen=True)
class Fetch:
    round: int
    author: Author
    payload_id: PayloadId
    size: int


@dataclass(frozen=True)
class PublishProposal:
    round: int
    authors: tuple[Author, ...]


@dataclass(frozen=True)
class StartAggregate:
    round: int
    authors: tuple[Author, ...]  # whose payloads to aggregate (ours included), sorted
    last_commit: float = 0.0  # when the last of their commits was seen (for the exchange timing)
    replay: bool = False  # a round certified without us, aggregated to adopt its state


@dataclass(frozen=True)
class PublishVote:
    round: int
    state_hash: bytes
    proposer: Author | None = None  # whose proposal we aggregated
    attempt: int = 0  # the attempt we vote in (a vote stands until its attempt splits)


@dataclass(frozen=True)
class PublishTimeout:
    """Attempt `attempt` of round `round` passed the run's round deadline on our clock, uncertified."""

    round: int
    attempt: int


@dataclass(frozen=True)
class StartSync:
    round: int
    state_hash: bytes


@dataclass(frozen=True)
class StopTraining:
    """Stop the inner steps of `round` (keep its fetches): the round is being replayed."""

    round: int


@dataclass(frozen=True)
class Discard:
    """Stop any work for `round` (training, fetches): the run has moved past it."""

    round: int


@dataclass(frozen=True)
class PublishJoin:
    """Join the run again, from `round`: our membership lapsed (we only synced for a while), or we
    sat rounds out and take part again."""

    round: int


@dataclass(frozen=True)
class PublishLeave:
    """Leave the contributors after certified round `round` to sit rounds out: nobody waits for our
    payload or our vote meanwhile; we keep syncing, and `PublishJoin` when we take part again."""

    round: int


@dataclass(frozen=True)
class RoundDone:
    """Round `round` was certified with our hash (or adopted by a sync): for progress reports."""

    round: int
    state_hash: bytes
    contributors: int  # payloads we aggregated (0 after a sync)
    synced: bool


Action = Union[
    StartTraining, PublishCommit, Fetch, PublishProposal, StartAggregate, PublishVote, PublishTimeout, StartSync,
    StopTraining, Discard, PublishJoin, PublishLeave, RoundDone,
]
