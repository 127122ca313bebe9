"""A test adversary: a participant that trains like everyone else, then commits an attack.

`AttackingParticipant` wraps an honest `Participant` and changes two things: what `train` commits
(the named attack of `attacks.py` in place of the honest payload) and what `aggregate` remembers
(the others' Δs of the round, which a real peer sees only once they are committed, so the attack
lags them by a round). Everything else is the honest participant's, so the node cannot tell the
two apart and the honest code carries no attack path. The node builds one only when started with
a test adversary's `attack` setting (`node/config.py`), through its participant factory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .attacks import Attack, AttackView, get_attack
from .codec import Encoder, decode, non_finite_payload
from .outer import OuterResult
from .participant import Contribution, Participant
from .run_settings import ParticipantError


class AttackingParticipant:
    """`honest`, committing `attack`'s payload each round (allgather exchange only)."""

    def __init__(self, honest: Participant, attack: Attack) -> None:
        self.honest = honest
        self.attack = attack
        self.others_last_round: list[np.ndarray] = []

    @classmethod
    def for_run(cls, genesis_body: Mapping[str, Any], key: bytes, attack: str, **devices: Any) -> AttackingParticipant:
        """`Participant.for_run` wrapped with the attack named `attack` (`attacks.get_attack`)."""
        return cls(Participant.for_run(genesis_body, key, **devices), get_attack(attack))

    def __getattr__(self, name: str) -> Any:
        if name == "honest":  # not set yet (a copy in the making): no delegation to recurse into
            raise AttributeError(name)
        return getattr(self.honest, name)  # all but `train` and `aggregate` are the honest peer's

    def train(self, stop: Callable[[], bool] | None = None, start: np.ndarray | None = None,
              data: Sequence[np.ndarray] | None = None, sharded: bool = False) -> Contribution:
        """The honest inner steps, then the attack's payload in place of the honest one."""
        if sharded:
            raise ParticipantError("attacks run in allgather exchange")
        trained = self.honest.train(stop, start, data)
        assert trained.delta is not None
        attacked = self._attack_payload(trained.delta)
        return trained if attacked is None else dataclasses.replace(trained, payload=attacked)

    def aggregate(self, payloads: Mapping[bytes, bytes]) -> OuterResult:
        """The honest outer step; the others' accepted Δs are kept for the next round's attack."""
        result = self.honest.aggregate(payloads)
        self.others_last_round = self._decode_others(payloads, result.accepted)
        return result

    def _decode_others(self, payloads: Mapping[bytes, bytes], authors: list[bytes]) -> list[np.ndarray]:
        config = self.honest.outer.config
        block = None if config.codec == "fp32" else config.block_size
        return [decode(payloads[author], self.honest.outer.numel, modes=(config.codec,), block_size=block)
                for author in authors if author != self.honest.key]

    def _attack_payload(self, delta: np.ndarray) -> bytes | None:
        """The attack's payload; None (send the honest one) while an attack that needs the others'
        spread (ALIE) has seen no one else yet."""
        honest = self.honest
        deltas = [delta, *self.others_last_round]
        view = AttackView(
            round_index=honest.round, honest_deltas=deltas, past_honest_payloads=[], workers=len(deltas), byzantine=1,
            rng=np.random.default_rng(honest.round),
            encode_non_finite=lambda value, numel: non_finite_payload(honest.settings.codec, value, numel),
            previous=honest.outer.previous, aggregate=honest.outer.trial_aggregate,
        )
        try:
            attacked = self.attack(view)
        except ValueError:
            if len(deltas) >= 2:
                raise
            return None
        return attacked if isinstance(attacked, bytes) else Encoder(honest.settings.codec, error_feedback=False).encode(attacked)
