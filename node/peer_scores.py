"""Per-peer reputation for what peers serve us: a score, strikes, and the last reason for one.

A verified chunk earns a peer `REWARD`; a chunk or manifest that fails its
hash costs it `STRIKE_PENALTY` and a strike, and so does, in the CRDT service,
gossip past a peer's budget, an invalid op it forwarded or served, and sync
requests past its budget. One table per node (`Node.scores`). Downloads use it
to rank providers; `checkpoint.peers` (RPC, behind the cookie) shows it per
peer. The metrics (``locomesh_peer_strikes_total``, ``locomesh_peers_struck``)
count without naming anyone: /metrics needs no cookie, and a list of the peers
we talk to is not for whoever can reach it. Kept in memory for the life of the
node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from locomesh.node.metrics import Metrics

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
        if metrics is not None:
            metrics.counter("locomesh_peer_strikes_total", "Bad data (failed hash checks) received from peers.",
                            value=lambda: sum(entry.strikes for entry in self._peers.values()))
            metrics.gauge("locomesh_peers_struck", "Peers that sent us bad data at least once.",
                          value=lambda: sum(1 for entry in self._peers.values() if entry.strikes))

    def get(self, peer_id: str) -> PeerScore:
        return self._peers.setdefault(peer_id, PeerScore())

    def reward(self, peer_id: str) -> None:
        entry = self.get(peer_id)
        entry.served += 1
        entry.score += REWARD

    def strike(self, peer_id: str, reason: str) -> None:
        entry = self.get(peer_id)
        entry.strikes += 1
        entry.score -= STRIKE_PENALTY
        entry.last_strike = reason[:200]

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {peer: vars(entry).copy() for peer, entry in self._peers.items()}
