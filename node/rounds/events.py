"""What the round machine (`machine`) reads and asks for: its phases, the events fed to it and the
actions it returns. Plain frozen values, no behaviour: the machine, the service that carries out
its actions (`participation`), the simulator and the tests all speak them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

PayloadId = bytes
Author = bytes


class Phase(enum.Enum):
    IDLE = "idle"  # holds the state of the certified round; not training the next one (yet)
    TRAIN = "train"  # inner steps under way
    COMMITTED = "committed"  # our payload is out; the round's agreement decides (node/agreement/)
    REPLAY = "replay"  # the round was certified with a value we did not compute: computing it
    SYNC = "sync"  # fetching the certified state


# --- inputs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """The certificate of a round: its value's ID and payload authors, and the certified state hash."""

    round: int
    value_id: bytes
    authors: tuple[Author, ...]
    state_hash: bytes


@dataclass(frozen=True)
class Observation:
    """What the run state says now. `commits` and the rest are for round `certified + 1`."""

    now: float
    certified: int  # newest certified round (0: none yet; the genesis state)
    certified_hash: bytes | None  # its state hash (None for round 0)
    commits: dict[Author, tuple[PayloadId, int]]  # round certified + 1: author -> (payload ID, size)
    may_contribute: bool = True  # our payload may be in round certified + 1's value
    rejoin: bool = False  # we are on no roster and have no join pending: join again
    sit_out: bool = False  # this node contributes to no round for now (paused, or outside its schedule)
    eligible: int = 1  # keys that may contribute to round certified + 1 (for the run's min_peers)
    decided: dict[int, Decided] = field(default_factory=dict)  # certified rounds past our state, by round


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
class Computed:
    """The state hash the aggregate of value `value_id` of round `round` gives here (None: it could
    not be computed): for the agreement's precommit, or a replay."""

    round: int
    value_id: bytes
    state_hash: bytes | None
    now: float


@dataclass(frozen=True)
class Synced:
    round: int
    state_hash: bytes | None  # None: the sync failed; it is tried again after RETRY_SECONDS
    now: float


Event = Union[Observation, Trained, Fetched, Computed, Synced]


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
class Replay:
    """Compute the certified value of `round` ourselves (we hold every payload it names): cheaper
    than downloading the state."""

    round: int
    value_id: bytes
    authors: tuple[Author, ...]


@dataclass(frozen=True)
class Adopt:
    """Take the state we computed for value `value_id` of `round` as the run's (it is the certified one)."""

    round: int
    value_id: bytes


@dataclass(frozen=True)
class StartSync:
    round: int
    state_hash: bytes


@dataclass(frozen=True)
class StopTraining:
    """Stop the inner steps of `round` (keep its fetches): the round is decided without them."""

    round: int


@dataclass(frozen=True)
class Discard:
    """Stop any work for `round` (training, fetches): the run has moved past it."""

    round: int


@dataclass(frozen=True)
class PublishJoin:
    """Join the run again from `round`: we are on no roster (we left, or were gone long)."""

    round: int


@dataclass(frozen=True)
class RoundDone:
    """Round `round` was certified and we hold its state: for progress reports."""

    round: int
    state_hash: bytes
    contributors: int  # payloads of its value (0 after a sync)
    synced: bool


Action = Union[StartTraining, PublishCommit, Fetch, Replay, Adopt, StartSync, StopTraining, Discard, PublishJoin,
               RoundDone]
