"""Keeping the links to the peers we work with: a dropped connection is dialled again by itself.

Theory of operation
-------------------
The members of a run we take part in must stay reachable: a relay that
restarts drops every relayed connection through it at once, a NAT mapping
expires, a peer reboots. Nobody should have to ask for a connection again.

`LinkKeeper` is the sans-IO bookkeeping, asked every few seconds with the
peers we want (`wanted`), those connected now, and the time; `due` returns
the peers to dial now. Per peer it keeps a `Backoff` (capped, jittered, from
`locomesh.node.bootstrap`): a dial that fails, or that leaves the peer
unconnected, doubles the wait before the next one; a peer seen connected
starts afresh. Per peer::

    state        event                     next
    connected    seen connected            connected
    connected    seen unconnected          due (dial at once)
    due          dial started (`dialling`) dialling
    dialling     dial ended (`finished`)   waiting (until its backoff delay ran out)
    waiting      delay over, unconnected   due
    any          seen connected            connected (backoff reset)
    any          no longer wanted          forgotten

What it holds is bounded: at most `MAX_KEPT` peers (the first in the order
given), at most `MAX_DIALS` dials at once. Dialling itself is the relay
service's `connect` (direct addresses first, relayed ones beside them); a
relayed link is then upgraded by hole punching where the NATs allow.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from locomesh.node.bootstrap import Backoff

MAX_KEPT = 64
MAX_DIALS = 4
BACKOFF_BASE = 2.0
BACKOFF_CAP = 60.0


@dataclass
class _Link:
    backoff: Backoff
    not_before: float = 0.0  # when the next dial may go out
    dialling: bool = False


@dataclass
class LinkKeeper:
    """Which wanted peers to dial now (see the module docstring)."""

    rng: random.Random = field(default_factory=random.SystemRandom)
    links: dict[str, _Link] = field(default_factory=dict)

    def due(self, wanted: Iterable[str], connected: set[str], now: float) -> list[str]:
        """The peers to dial now; each is marked as dialling until `finished` is called for it."""
        kept = list(dict.fromkeys(wanted))[:MAX_KEPT]
        for peer in [peer for peer in self.links if peer not in kept]:
            del self.links[peer]
        dialling = sum(link.dialling for link in self.links.values())
        ready = []
        for peer in kept:
            link = self.links.setdefault(peer, _Link(Backoff(base=BACKOFF_BASE, cap=BACKOFF_CAP, rng=self.rng)))
            if peer in connected:
                link.backoff.reset()
                link.not_before = 0.0
            elif not link.dialling and now >= link.not_before and dialling < MAX_DIALS:
                link.dialling = True
                dialling += 1
                ready.append(peer)
        return ready

    def finished(self, peer: str, *, connected: bool, now: float) -> None:
        """A dial `due` returned has ended; unless it left the peer connected, the peer waits its backoff."""
        link = self.links.get(peer)
        if link is None:
            return
        link.dialling = False
        if connected:
            link.backoff.reset()
            link.not_before = 0.0
        else:
            link.not_before = now + link.backoff.next_delay()

    def status(self, now: float) -> dict[str, float]:
        """Peer -> seconds until its next dial, for the peers waiting after a failed one."""
        return {peer: round(link.not_before - now, 1) for peer, link in self.links.items() if link.not_before > now}
