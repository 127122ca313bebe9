"""Per-peer reputation for what peers serve us: a score, strikes, and the last reason for one.

A verified chunk earns a peer `REWARD`; a chunk or manifest that fails its
hash costs it `STRIKE_PENALTY` and a strike, and so does, in the CRDT service,
gossip past a peer's budget, an invalid op it forwarded or served, and sync
requests past its budget. One table per node (`Node.scores`). Downloads use it
to rank providers; `checkpoint.peers` (RPC) and the metrics
``locomesh_peer_strikes_total`` / ``locomesh_peer_score`` show it. Kept in
memory for the life of the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .metrics import Metrics

REWARD = 1.0
STRIKE_PENALTY = 25.0


@dataclass
class PeerScore:
    score: float = 0.0
    strikes: int = 0
    served: int = 0
    last_strike: str | None = None


class PeerScores:
    def __init__(self, metrics: Metrics | None = None) -> None:
        self._peers: dict[str, PeerScore] = {}
        self._strikes = self._scores = None
        if metrics is not None:
            self._strikes = metrics.counter(
                "locomesh_peer_strikes_total", "Bad data (failed hash checks) received, by peer.", labels=("peer",)
            )
            self._scores = metrics.gauge("locomesh_peer_score", "Reputation of peers that served us.", labels=("peer",))

    def get(self, peer_id: str) -> PeerScore:
        return self._peers.setdefault(peer_id, PeerScore())

    def reward(self, peer_id: str) -> None:
        entry = self.get(peer_id)
        entry.served += 1
        entry.score += REWARD
        self._show(peer_id, entry)

    def strike(self, peer_id: str, reason: str) -> None:
        entry = self.get(peer_id)
        entry.strikes += 1
        entry.score -= STRIKE_PENALTY
        entry.last_strike = reason[:200]
        if self._strikes is not None:
            self._strikes.inc(peer=peer_id)
        self._show(peer_id, entry)

    def _show(self, peer_id: str, entry: PeerScore) -> None:
        if self._scores is not None:
            self._scores.set(entry.score, peer=peer_id)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {peer: vars(entry).copy() for peer, entry in self._peers.items()}
