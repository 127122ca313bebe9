"""What the dashboard shows that the node does not keep: its traffic over time, and each peer's
round-trip time and bytes.

`TrafficHistory` is a ring buffer of samples of the node's byte totals (and
peer count), taken every `SAMPLE_INTERVAL` seconds: an hour of them. The
round-trip times come from our own ping protocol (`locomesh.node.ping`): a
peer is pinged when it has no fresh measurement (`PING_INTERVAL`), a few at
a time, each ping bounded by `PING_TIMEOUT`, and only while someone looks
(``node.traffic`` was called in the last `INTEREST` seconds): a node nobody
watches sends no pings for the dashboard's sake. The bytes of each connection
are counted by the transport wrapper (`locomesh.node.meter`).

All of it goes out through the RPC method ``node.traffic``; nothing here is
made up: a peer never pinged has no round-trip time, a relayed connection
has no byte count of its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from locomesh.node.meter import connection_bytes
from locomesh.node.connections import RELAYED, facts_of
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import Node

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL = 2.0
HISTORY = 1800  # samples: an hour
PING_INTERVAL = 15.0
PING_TIMEOUT = 5.0
PINGS_AT_ONCE = 8
INTEREST = 60.0
COLUMNS = ("at", "bytes_in", "bytes_out", "peers")


class TrafficHistory:
    """The last `size` samples of (wall-clock time, bytes in, bytes out, peers connected)."""

    def __init__(self, size: int = HISTORY) -> None:
        self._samples: deque[tuple[float, int, int, int]] = deque(maxlen=size)

    def add(self, at: float, bytes_in: int, bytes_out: int, peers: int) -> None:
        self._samples.append((at, bytes_in, bytes_out, peers))

    def since(self, after: float) -> list[tuple[float, int, int, int]]:
        """The samples taken after `after` (wall-clock seconds), oldest first."""
        return [sample for sample in self._samples if sample[0] > after]


@dataclass(frozen=True)
class RoundTrip:
    seconds: float
    measured_at: float  # monotonic (trio) time


class Pinger(Protocol):
    """What pings a peer (`locomesh.node.ping.PingService`)."""

    async def ping(self, peer_id: str) -> float: ...


class Telemetry:
    """Samples `node`'s traffic and pings its peers through `ping` (none: no round trips) while `run`
    runs; answers ``node.traffic``."""

    def __init__(self, node: Node, *, ping: Pinger | None, wall_clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.history = TrafficHistory()
        self.round_trips: dict[str, RoundTrip] = {}
        self._ping = ping
        self._tried_at: dict[str, float] = {}  # peer -> when we last pinged it (monotonic), answered or not
        self._watched_until = -math.inf  # trio time until which someone looks (node.traffic was called)
        self._wall_clock = wall_clock

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Take a sample now and one every SAMPLE_INTERVAL seconds after it, and ping the peers due for
        it as often, until cancelled. The pings run in a task of their own: one that waits out
        PING_TIMEOUT does not delay a sample."""
        self.sample()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sample_forever)
            nursery.start_soon(self._ping_forever)
            task_status.started()

    async def _sample_forever(self) -> None:
        """A sample every SAMPLE_INTERVAL seconds, until cancelled."""
        due = trio.current_time()
        while True:
            due += SAMPLE_INTERVAL  # on a fixed schedule: the samples stay evenly spaced
            await trio.sleep_until(due)
            self.sample()

    async def _ping_forever(self) -> None:
        """`ping_due_peers`, then a pause of SAMPLE_INTERVAL seconds, until cancelled."""
        while True:
            await self.ping_due_peers()
            await trio.sleep(SAMPLE_INTERVAL)

    def sample(self) -> None:
        """Add one sample of the node's byte totals and peer count, at the wall-clock time now."""
        meter = self.node.meter
        self.history.add(self._wall_clock(), meter.bytes_in, meter.bytes_out, len(self.node.peers))

    async def ping_due_peers(self) -> None:
        """Forget peers no longer connected; then, if someone looks, ping (at most PINGS_AT_ONCE, each
        within PING_TIMEOUT) the connected peers not tried in the last PING_INTERVAL seconds."""
        connected = {entry.peer_id for entry in self.node.peers.peers()}
        for gone in self._tried_at.keys() - connected:
            del self._tried_at[gone]
            self.round_trips.pop(gone, None)
        now = trio.current_time()
        if self._ping is None or now > self._watched_until:
            return
        due = [peer for peer in sorted(connected) if now - self._tried_at.get(peer, -math.inf) >= PING_INTERVAL]
        async with trio.open_nursery() as nursery:
            for peer in due[:PINGS_AT_ONCE]:
                self._tried_at[peer] = now
                nursery.start_soon(self._ping_one, self._ping, peer)

    async def rpc_traffic(self, since: float = 0.0) -> dict[str, Any]:
        """``node.traffic``: the samples after `since` (wall-clock seconds), and per-peer bytes and round trips."""
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise RpcError.invalid_params("since must be a number (seconds since the epoch)")
        self._watched_until = trio.current_time() + INTEREST
        meter = self.node.meter
        now = (self._wall_clock(), meter.bytes_in, meter.bytes_out, len(self.node.peers))
        return {
            "interval_s": SAMPLE_INTERVAL,
            "columns": list(COLUMNS),
            "samples": [list(sample) for sample in self.history.since(since)],
            "now": list(now),
            "peers": self.peer_traffic(),
        }

    def peer_traffic(self) -> dict[str, dict[str, Any]]:
        """peer ID -> {bytes_in, bytes_out (None: relayed), rtt_ms (None: not measured), rtt_age_s}."""
        connections = {str(peer): list(conns) for peer, conns in list(self.node.host.get_network().connections.items())}
        result = {}
        for entry in self.node.peers.peers():
            direct = [conn for conn in connections.get(entry.peer_id, []) if facts_of(conn).kind != RELAYED]
            counts = [connection_bytes(conn) for conn in direct]
            known = [count for count in counts if count is not None]
            trip = self.round_trips.get(entry.peer_id)
            result[entry.peer_id] = {
                "bytes_in": sum(count[0] for count in known) if known else None,
                "bytes_out": sum(count[1] for count in known) if known else None,
                "rtt_ms": None if trip is None else round(trip.seconds * 1000, 2),
                "rtt_age_s": None if trip is None else round(trio.current_time() - trip.measured_at, 1),
            }
        return result

    async def _ping_one(self, ping: Pinger, peer: str) -> None:
        with trio.move_on_after(PING_TIMEOUT):
            try:
                seconds = await ping.ping(peer)
            except Exception as error:  # noqa: BLE001 - DialError, ProtocolError: no measurement this time
                logger.debug("ping of %s failed: %s", peer, error)
                return
            self.round_trips[peer] = RoundTrip(seconds, trio.current_time())

