"""What a libp2p connection is, read once from py-libp2p's objects into plain data.

py-libp2p keeps the facts NAT traversal needs (direction, relayed or not,
the remote address, when it opened) on different objects and under
different names; `facts_of` gathers them into a `ConnectionFacts`, and
`facts_of_stream` does the same for the connection a stream runs on. Every
lookup is defensive: a missing attribute gives "unknown", never an error,
since these facts only steer decisions that fail safe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from locomesh.node.addresses import is_relayed, remote_ip

DIRECT, RELAYED = "direct", "relayed"


@dataclass(frozen=True)
class ConnectionFacts:
    peer_id: str
    direction: str  # "inbound", "outbound" or "unknown"
    kind: str  # DIRECT or RELAYED
    addrs: tuple[str, ...]
    opened_at: float  # wall-clock seconds (time.time), as py-libp2p records it

    @property
    def remote_ip(self) -> str | None:
        """The IP the connection comes from; None when relayed or unknown."""
        return None if self.kind == RELAYED else remote_ip(list(self.addrs))


def facts_of(conn: Any) -> ConnectionFacts:
    """The facts of a swarm connection (`INetConn`)."""
    addrs = tuple(str(address) for address in _transport_addrs(conn))
    relayed = any(is_relayed(address) for address in addrs) or _type_name(conn) == "relayed"
    created = getattr(conn, "_created_at", None)
    return ConnectionFacts(
        peer_id=str(conn.muxed_conn.peer_id),
        direction=_direction(conn),
        kind=RELAYED if relayed else DIRECT,
        addrs=addrs,
        opened_at=float(created) if isinstance(created, (int, float)) else time.time(),
    )


def facts_of_stream(stream: Any) -> ConnectionFacts | None:
    """The facts of the connection `stream` runs on; None if the stream does not say."""
    conn = getattr(stream, "swarm_conn", None)
    return None if conn is None else facts_of(conn)


def _direction(conn: Any) -> str:
    # py-libp2p's Direction enum: UNKNOWN = -1, INBOUND = 0, OUTBOUND = 1.
    name = getattr(getattr(conn, "direction", None), "name", "").lower()
    return name if name in ("inbound", "outbound") else "unknown"


def _type_name(conn: Any) -> str:
    """The swarm connection's type, else its muxer's (which knows it before the swarm is told)."""
    for source in (conn, getattr(conn, "muxed_conn", None)):
        try:
            name = str(source.get_connection_type().name).lower()
        except Exception:  # noqa: BLE001 - older connection objects lack it
            continue
        if name != "unknown":
            return name
    return "unknown"


def _transport_addrs(conn: Any) -> list[Any]:
    try:
        return list(conn.get_transport_addresses())
    except Exception:  # noqa: BLE001 - addresses are informative only
        return []
