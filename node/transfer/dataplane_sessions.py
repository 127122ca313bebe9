"""What a data plane provider keeps for its askers, and how much of it (sans-IO: no sockets, no clock).

Two tables, each capped per peer (or per source address) and in all, because
everything in them is held on behalf of someone who may be hostile:

* `UnauthenticatedConnections`: TCP connections that have not yet sent a
  first frame opening under a pending session. Anyone can open them, no
  identity needed. A newcomer is always let in, and room is made by closing
  an older one: the oldest of its own source when that source is at its cap,
  else (all sources together at the cap) the oldest of the source holding
  the most. A squatter, however many sockets it opens, only pushes out its
  own, and an asker from another address gets in at once; nothing is queued.
* `SessionTable`: the sessions whose keys were agreed over libp2p (so the
  peer is known): *pending* until a TCP connection proves it holds the keys
  (its first frame opens to `HELLO`), then *active* until that connection
  ends. A peer past its own caps is refused (`busy`); pending sessions of all
  peers together past `MAX_PENDING` push out the oldest, so many identities
  cannot hold every slot either.

`HELLO` and `READY` are the plaintexts of the first frame each way: the
asker's proves it holds the session's keys, the provider's answer proves the
provider does, before the asker sends any request.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from locomesh.protocol.kinds import CKPT_GET_CHUNK, CKPT_GET_MANIFEST

from locomesh.node.transfer.dataplane_crypto import DataPlaneError, FrameOpener, SessionKeys

HELLO = b"locomesh/dataplane/hello/v2"
READY = b"locomesh/dataplane/ready/v2"

# The frame caps, by direction and state (a sealed frame's plaintext, in bytes):
FIRST_FRAME = len(HELLO)  # what an unauthenticated connection may send: the hello, nothing larger
ANSWER_FRAME = len(READY)  # what an asker accepts before the provider has proved its keys
REQUEST_FRAME = 4 + max(CKPT_GET_CHUNK.max_size, CKPT_GET_MANIFEST.max_size)  # a provider reads only requests
# (an asker accepts reply frames only as large as the reply it was told: `streams.read_frame` sets that)

FIRST_FRAME_TIMEOUT = 2.0  # an asker sends its hello right after connecting: one round trip is plenty
MAX_UNAUTHENTICATED = 64  # connections still to send their first frame, from everyone (a socket and a task each)
MAX_UNAUTHENTICATED_PER_SOURCE = 8  # from one IPv4 address or IPv6 /64: more than one asker's download opens at once
PENDING_TTL = 15.0  # the asker connects within its handshake timeout (10 s) of the offer, then has FIRST_FRAME_TIMEOUT
MAX_PENDING = 64  # agreed keys awaiting their connection; a first frame is tried against each of them
MAX_PENDING_PER_PEER = 16  # a peer's handshakes in flight: 4 streams per download, a few downloads at once
MAX_SESSIONS = 256  # authenticated connections in all: each is a socket and a task for up to the idle timeout
MAX_SESSIONS_PER_PEER = 32  # one asker's streams (4 per download; a round downloads several payloads at once)


def source_of(address: str) -> str:
    """The source an unauthenticated connection is counted under: its IPv4 address, or its IPv6 /64
    (one host is given a whole /64, so counting single IPv6 addresses would cap nothing)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class UnauthenticatedConnections:
    """The connections still to send their first frame, by source, oldest first (see the module docstring)."""

    def __init__(self, *, total: int = MAX_UNAUTHENTICATED, per_source: int = MAX_UNAUTHENTICATED_PER_SOURCE) -> None:
        if min(total, per_source) < 1:
            raise ValueError("total and per_source must be at least 1")
        self.total, self.per_source = total, per_source
        self._by_source: dict[str, dict[Hashable, int]] = {}  # source -> {connection: admission number}
        self._admitted = itertools.count()

    def __len__(self) -> int:
        return sum(len(connections) for connections in self._by_source.values())

    def admit(self, connection: Hashable, source: str) -> Hashable | None:
        """Let `connection` in; the connection to close at once to make room for it, if any."""
        evicted = None
        if len(self._by_source.get(source, ())) >= self.per_source:
            evicted = self._oldest(source)
        elif len(self) >= self.total:
            evicted = self._oldest(self._largest_source())
        if evicted is not None:
            self.release(evicted)
        self._by_source.setdefault(source, {})[connection] = next(self._admitted)
        return evicted

    def release(self, connection: Hashable) -> None:
        """`connection` sent its first frame, or ended: it no longer counts (a no-op if it was evicted)."""
        for source, connections in self._by_source.items():
            if connections.pop(connection, None) is not None:
                if not connections:
                    del self._by_source[source]
                return

    def _oldest(self, source: str) -> Hashable:
        connections = self._by_source[source]
        return min(connections, key=connections.__getitem__)

    def _largest_source(self) -> str:
        """The source holding the most connections; of equals, the one holding the oldest."""
        def size_then_age(source: str) -> tuple[int, int]:
            connections = self._by_source[source]
            return len(connections), -min(connections.values())

        return max(self._by_source, key=size_then_age)


@dataclass
class PendingSession:
    peer_id: str
    keys: SessionKeys
    expires: float


class SessionTable:
    """Pending and active data plane sessions, capped per peer and in all (see the module docstring)."""

    def __init__(
        self, *, max_pending: int = MAX_PENDING, pending_per_peer: int = MAX_PENDING_PER_PEER,
        max_sessions: int = MAX_SESSIONS, sessions_per_peer: int = MAX_SESSIONS_PER_PEER, ttl: float = PENDING_TTL,
    ) -> None:
        self.max_pending, self.pending_per_peer = max_pending, pending_per_peer
        self.max_sessions, self.sessions_per_peer, self.ttl = max_sessions, sessions_per_peer, ttl
        self.pending: list[PendingSession] = []  # oldest first
        self.active: Counter[str] = Counter()

    def offer(self, peer_id: str, keys: SessionKeys, now: float) -> PendingSession | None:
        """Remember the keys agreed with `peer_id` until `now + ttl`; the pending session pushed out to
        make room, if any. `DataPlaneError("busy")` if the peer holds all it may, or every session is taken."""
        self.pending = [entry for entry in self.pending if entry.expires > now]
        held = sum(entry.peer_id == peer_id for entry in self.pending)
        if held >= self.pending_per_peer:
            raise DataPlaneError("busy", f"{peer_id} already has {held} data plane handshakes pending")
        if held + self.active[peer_id] >= self.sessions_per_peer:
            raise DataPlaneError("busy", f"{peer_id} holds {self.sessions_per_peer} data plane sessions")
        if self.active.total() >= self.max_sessions:
            raise DataPlaneError("busy", f"all {self.max_sessions} data plane sessions are taken")
        evicted = self.pending.pop(0) if len(self.pending) >= self.max_pending else None
        self.pending.append(PendingSession(peer_id, keys, now + self.ttl))
        return evicted

    def claim(self, first_frame: bytes, now: float) -> tuple[str, SessionKeys, FrameOpener]:
        """The session whose keys open `first_frame` (a whole sealed frame) to `HELLO`, now active: its
        peer, keys, and the opener to read the connection's next frames with (capped to a request).
        `DataPlaneError`: ``bad-frame`` if no pending session opens it, ``expired`` if its session's time
        is up, ``busy`` if every session is taken."""
        for entry in self.pending:
            opener = FrameOpener(entry.keys.receive, max_frame=FIRST_FRAME)
            opener.feed(first_frame)
            try:
                if opener.next_frame() != HELLO:
                    continue
            except DataPlaneError:
                continue
            self.pending.remove(entry)
            if entry.expires <= now:
                raise DataPlaneError("expired", "the data plane session's keys were offered too long ago")
            if self.active.total() >= self.max_sessions:
                raise DataPlaneError("busy", f"all {self.max_sessions} data plane sessions are taken")
            self.active[entry.peer_id] += 1
            opener.max_frame = REQUEST_FRAME
            return entry.peer_id, entry.keys, opener
        raise DataPlaneError("bad-frame", "the first frame opens under no pending data plane session")

    def end(self, peer_id: str) -> None:
        """An active session of `peer_id` ended (its connection closed)."""
        self.active[peer_id] -= 1
        if self.active[peer_id] <= 0:
            del self.active[peer_id]
