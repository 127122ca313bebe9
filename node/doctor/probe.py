"""A bounded bandwidth probe between two nodes, for ``locomesh doctor``: "send me N bytes".

    asker                                       answerer
      | -- frame: N (4 bytes, big-endian) -->     |  N <= MAX_PROBE_BYTES, the asker within its rate
      | <-- frame: N bytes -----------------------|
      | download rate = N / (time to receive them - one round trip)

What a peer can make us send is bounded three ways: `MAX_PROBE_BYTES` per request, `PER_PEER`
requests per peer (a token bucket: a burst, then one every `PER_PEER_INTERVAL` s), and a shared
budget: `TOTAL` requests from the members of the runs this node holds together (one every
`TOTAL_INTERVAL` s after a burst), `STRANGERS` requests from everyone else together (a smaller
one): at most a few megabytes a minute, whoever asks. Members come first: a peer ID costs nothing
to make, so a stranger can use up the strangers' budget with many of them, never the members'
(they are the peers whose doctors probe us). A request over the size is bad input (a
`ProtocolError`, counted against the sender by the guarded handler); one over the rate is
answered with nothing (the stream is closed) and counted, and the asker reads that as "busy".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from locomesh.protocol import ProtocolError

from locomesh.node.rate_limit import RateLimiter
from locomesh.node.runtime import Node
from locomesh.node.streams import close_quietly, read_frame, write_frame

PROTOCOL_ID = "/locomesh/doctor-probe/1"
MAX_PROBE_BYTES = 1024 * 1024
PROBE_BYTES = 256 * 1024  # what doctor asks each member for
FRAME_TIMEOUT = 10.0
PER_PEER_BURST, PER_PEER_INTERVAL = 3, 20.0
TOTAL_BURST, TOTAL_INTERVAL = 10, 6.0
STRANGERS_BURST, STRANGERS_INTERVAL = 3, 20.0
_MEMBERS, _STRANGERS = "members", "strangers"
_REQUEST_SIZE = 4


class ProbeBusy(Exception):
    """The peer answered nothing: it is over its rate of probes, or does not serve them."""


class ProbeServer:
    """Answers probes within the bounds of the module docstring; `is_member(peer_id)` says
    whether a peer is a member of a run this node holds."""

    def __init__(self, node: Node, is_member: Callable[[str], bool] = lambda peer_id: False) -> None:
        self._node = node
        self._is_member = is_member
        self._per_peer = RateLimiter(trio.current_time, burst=PER_PEER_BURST, interval=PER_PEER_INTERVAL)
        self._shared = {
            _MEMBERS: RateLimiter(trio.current_time, burst=TOTAL_BURST, interval=TOTAL_INTERVAL, max_keys=1),
            _STRANGERS: RateLimiter(trio.current_time, burst=STRANGERS_BURST, interval=STRANGERS_INTERVAL, max_keys=1),
        }
        node.set_stream_handler(PROTOCOL_ID, self._handle, timeout=3 * FRAME_TIMEOUT)

    def _allowed(self, peer: str) -> bool:
        """Take a probe from `peer`'s budget and its group's (members or strangers), if both have one."""
        group = _MEMBERS if self._is_member(peer) else _STRANGERS
        return self._per_peer.allow(peer) and self._shared[group].allow(group)

    async def _handle(self, stream: Any) -> None:
        request = await read_frame(stream, max_size=_REQUEST_SIZE, timeout=FRAME_TIMEOUT)
        size = int.from_bytes(request, "big") if len(request) == _REQUEST_SIZE else -1
        if not 0 < size <= MAX_PROBE_BYTES:
            raise ProtocolError("bad-probe", f"a probe asks for 1 to {MAX_PROBE_BYTES} bytes, not {size}")
        peer = str(stream.muxed_conn.peer_id)
        if not self._allowed(peer):
            self._node.count_protocol_error("probe-rate")
            await close_quietly(stream)
            return
        await write_frame(stream, bytes(size), timeout=FRAME_TIMEOUT)
        await close_quietly(stream)


async def measure_download(node: Node, peer_id: str, size: int = PROBE_BYTES, *, rtt: float = 0.0) -> float:
    """Bytes per second `peer_id` sent us `size` bytes at (one round trip `rtt` taken off the time);
    `ProbeBusy` if it would not, `DialError` or `ProtocolError` if the stream failed."""
    if not 0 < size <= MAX_PROBE_BYTES:
        raise ValueError(f"a probe is 1 to {MAX_PROBE_BYTES} bytes")
    stream = await node.open_stream(peer_id, [PROTOCOL_ID])
    try:
        started = trio.current_time()
        await write_frame(stream, size.to_bytes(_REQUEST_SIZE, "big"), timeout=FRAME_TIMEOUT)
        try:
            reply = await read_frame(stream, max_size=size, timeout=FRAME_TIMEOUT)
        except ProtocolError as error:
            if error.code == "closed":
                raise ProbeBusy(f"{peer_id} sent no probe bytes (busy, or an older version)") from None
            raise
        elapsed = trio.current_time() - started
    finally:
        await close_quietly(stream)
    if len(reply) != size:
        raise ProtocolError("bad-probe", f"asked for {size} bytes, got {len(reply)}")
    return size / max(elapsed - rtt, elapsed / 2, 1e-6)
