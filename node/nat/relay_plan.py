"""What a relay gives away, and which relays a private node reserves on: pure decisions, no I/O.

`RelayBounds` names py-libp2p's `RelayLimits` for what they bound; `plan_reservations`
is the relay client's choice at each check of `locomesh.node.nat.relay_service`.
"""

from __future__ import annotations

from dataclasses import dataclass

from libp2p.relay.circuit_v2.resources import RelayLimits

REFRESH_INTERVAL = 900.0  # well inside a relay's reservation TTL (`RelayBounds.reservation_ttl`)


@dataclass(frozen=True)
class RelayBounds:
    """What one relay gives away at most (py-libp2p's `RelayLimits`, named for what they bound)."""

    max_reservations: int = 32
    max_circuits: int = 16
    circuit_seconds: int = 1800
    circuit_bytes: int = 1024**3  # a whole checkpoint download must fit
    reservation_ttl: int = 3600

    def limits(self) -> RelayLimits:
        return RelayLimits(
            duration=self.circuit_seconds,
            data=self.circuit_bytes,
            max_circuit_conns=self.max_circuits,
            max_reservations=self.max_reservations,
            reservation_ttl=self.reservation_ttl,
        )


def plan_reservations(
    held: dict[str, float], candidates: list[str], *, want: int, now: float
) -> tuple[list[str], list[str]]:
    """Which relays to (re-)reserve now, and which held ones to drop.

    `held` maps a relay to when we last reserved on it; `candidates` are the
    relays we could use, best first (connected, speaking hop). Held relays no
    longer among the candidates are dropped; held ones older than
    `REFRESH_INTERVAL` are refreshed; free slots are filled from the rest.
    """
    drop = [relay for relay in held if relay not in candidates]
    kept = [relay for relay in held if relay in candidates]
    refresh = [relay for relay in kept if now - held[relay] >= REFRESH_INTERVAL]
    fresh = [relay for relay in candidates if relay not in held][: max(0, want - len(kept))]
    return refresh + fresh, drop
