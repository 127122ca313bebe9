"""Contribution scores, the daemon's side: a scoring committee member measures and signs them.

A run whose settings say ``"scoring": "report"`` has each certified round's contributions scored by
a small committee (crdt/scores.py: who, and what the reports add up to). This module is what one
member does (the participation, participation.py, calls it):

- before aggregating round r it keeps θ_r (`RoundParticipant.scoring_base`: a reference, the outer
  step never writes into it), with the set it aggregates and their payloads (held a round longer
  anyway, for peers replaying the round);
- once round r is certified with its hash, if it is on r's committee and precommitted the certified state,
  it scores each contribution of that set applied alone to θ_r, on batches drawn from a seed
  derived from r's certified hash (fixed only once the round's set was, so nobody prepared for
  them), in a worker thread beside the next round's training: never under the compute lock, so
  no round waits on it; one scoring at a time (a member still scoring when the next round is
  certified skips that one: bounded work);
- it writes the scores as a `score` op (fixed point, clipped: `crdt.scores.to_units`).

Scores inform only: they change no aggregate and no vote. A failure is logged, never raised.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any, Awaitable, Callable

from locomesh.crdt import Replica
from locomesh.crdt.scores import scoring_committee, to_units
from locomesh.training.contract import RoundParticipant

logger = logging.getLogger(__name__)


def score_seed(certified_hash: bytes) -> int:
    """The seed of a round's scoring batches: from its certified hash, so the same on every scorer
    and unknown to all until the round's set was fixed."""
    return int.from_bytes(hashlib.sha256(b"locomesh score" + certified_hash).digest()[:8], "big") >> 1


def score_fields(round_number: int, scores: Mapping[bytes, float]) -> dict[str, Any]:
    """The body fields of the `score` op for `scores` (author -> measured float)."""
    authors = sorted(scores)
    return {"round": round_number, "authors": authors, "scores": [to_units(scores[a]) for a in authors]}


class RoundScorer:
    """This member's part in scoring one run's rounds (module docstring)."""

    def __init__(self, replica: Replica, participant: RoundParticipant, me: bytes,
                 compute: Callable[..., Awaitable[Any]], crdt: Any) -> None:
        self.replica = replica
        self.participant = participant
        self.me = me
        self.compute = compute  # runs `participant.score` off the trio thread
        self.crdt = crdt  # its `write` signs and publishes an op (`CrdtService`)
        self.busy = False
        self.scored: deque[int] = deque(maxlen=100)  # the newest rounds we reported

    @property
    def enabled(self) -> bool:
        return self.participant.settings.scoring == "report"

    def on_committee(self, round_number: int) -> bool:
        """Are we among certified round `round_number`'s scorers (on its committee, and a
        precommitter of its certified state: only then do our scores count)?"""
        certificate = self.replica.chain.certificates.get(round_number)
        return (certificate is not None and self.me in self.replica.chain.voters(round_number)
                and self.me in scoring_committee(certificate))

    async def score(self, round_number: int, base: Any, authors: tuple[bytes, ...],
                    payloads: Mapping[bytes, Any]) -> None:
        """Score `authors` (the set we aggregated in `round_number`, whose payloads are in
        `payloads`) on `base` (θ before the round's step) and write the op, if we are a scorer of
        the certified round and not still scoring an earlier one."""
        if not self.enabled or self.busy or not self.on_committee(round_number):
            return
        certificate = self.replica.state.certificates[round_number]
        # Only the contributions the certificate accepted count (crdt/scores.py): score no others.
        mine = {a: payloads[a] for a in authors if a in payloads and a in certificate.accepted}
        if not mine:
            return
        self.busy = True
        try:
            scores = await self.compute(self.participant.score, base, mine, score_seed(certificate.hash))
            if scores:
                self.crdt.write(self.replica.run_id, "score", **score_fields(round_number, scores))
                self.scored.append(round_number)
        except Exception as error:  # noqa: BLE001 - a report we could not make costs the run nothing
            logger.warning("round %d: contribution scores not measured: %s: %s", round_number,
                           type(error).__name__, error)
        finally:
            self.busy = False
