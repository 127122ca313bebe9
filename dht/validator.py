"""py-libp2p's `Validator` interface over our pure record rules (`locomesh.dht.records`).

libp2p dispatches on the key's first path segment, so one validator serves
the whole ``/locomesh/`` namespace and hands each key to the rule for its
second segment. Any other second segment is refused: a namespace we do not
know the rules of must not become free storage for strangers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from libp2p.records.validator import Validator

from locomesh.protocol import Envelope, ProtocolError

from . import records

Clock = Callable[[], float]


def validate(key: str, value: bytes, *, now: float) -> Envelope:
    """The envelope in `value` if it is valid under `key` at `now`, else `ProtocolError`."""
    if key.startswith(records.RUN_PREFIX):
        return records.validate_run_record(key, value)
    if key.startswith(records.PEER_PREFIX):
        return records.validate_peer_record(key, value, now=now)
    if key.startswith(records.CARDS_PREFIX):
        return records.validate_cards_record(key, value, now=now)
    raise ProtocolError("wrong-namespace", f"{key[:80]!r} is in no locomesh record namespace")


def select(key: str, values: list[bytes], *, now: float) -> int:
    """The index of the best of `values` for `key` (deterministic: every node picks the same)."""
    if key.startswith(records.PEER_PREFIX):
        return records.select_peer_record(key, values, now=now)
    if key.startswith(records.CARDS_PREFIX):
        return records.select_cards_record(key, values, now=now)
    return records.select_run_record(values)


class LocomeshValidator(Validator):
    """Registered on every node under namespace ``locomesh``; `clock` gives Unix seconds."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock

    def validate(self, key: str, value: bytes) -> None:
        validate(key, value, now=self._clock())

    def select(self, key: str, values: list[bytes]) -> int:
        return select(key, values, now=self._clock())
