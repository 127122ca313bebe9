"""What the Tendermint machine (tendermint.py) is told, and what it asks its driver to do.

Events carry what the node learnt (the replica's log, a value it found, a validity check or a
state hash it computed); actions are the messages to sign and the questions for the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from locomesh.crdt import Value

from .log import Log


# --- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observe:
    """The round's messages as the replica holds them now (log.py), and the time."""

    log: Log
    now: float


@dataclass(frozen=True)
class ValueReady:
    """getValue(): the value the node would propose in `attempt` (None: it has none to propose)."""

    attempt: int
    value: Value | None


@dataclass(frozen=True)
class Checked:
    """valid(v), as the node found it for the value `value_id`."""

    value_id: bytes
    ok: bool


@dataclass(frozen=True)
class Hashed:
    """The hash of the state the aggregate of value `value_id` gives (None: it cannot be computed)."""

    value_id: bytes
    state: bytes | None


Event = Union[Observe, ValueReady, Checked, Hashed]


# --- actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedValue:
    attempt: int


@dataclass(frozen=True)
class Check:
    value: Value


@dataclass(frozen=True)
class Hash:
    value: Value


@dataclass(frozen=True)
class Propose:
    attempt: int
    value: Value
    valid_round: int  # -1: none


@dataclass(frozen=True)
class Prevote:
    attempt: int
    value_id: bytes  # NIL for nil


@dataclass(frozen=True)
class Precommit:
    attempt: int
    value_id: bytes  # NIL for nil
    state: bytes  # NIL with a nil value


Action = Union[NeedValue, Check, Hash, Propose, Prevote, Precommit]
