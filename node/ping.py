"""Ping: the smallest real protocol over our framing, with signed `node.ping` envelopes both ways.

    dialer                                   listener
      | -- frame: node.ping{nonce}, signed by dialer -->  |  decode, check the author is the stream's peer
      | <-- frame: node.ping{same nonce}, signed by listener |
      | check the author is the peer we dialed and the nonce is ours

One ping per stream. It proves the remote holds the key of the peer ID we
dialed (beyond what Noise already proves, it exercises our envelope code on
real streams) and measures a round trip. Anything else a peer sends
(garbage, a frame too large, a valid envelope of another kind, someone
else's ping) is a `ProtocolError`; the guarded handler counts it and resets
the stream, and the node carries on.
"""

from __future__ import annotations

import secrets
from typing import Any

import trio

from locomesh.protocol import ProtocolError, decode, encode
from locomesh.protocol.kinds import PING

from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import DialError, Node
from locomesh.node.streams import close_quietly, read_frame, write_frame

PROTOCOL_ID = "/locomesh/ping/1.0.0"
FRAME_TIMEOUT = 10.0
NONCE_SIZE = 16


class PingService:
    """Answers pings, and offers `ping(peer_id)` and the RPC method `node.ping`."""

    name = "ping"

    def __init__(self) -> None:
        self._node: Node | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        node.set_stream_handler(PROTOCOL_ID, self._handle, timeout=2 * FRAME_TIMEOUT)
        node.rpc.register("node.ping", self._rpc_ping)
        task_status.started()

    async def _handle(self, stream: Any) -> None:
        assert self._node is not None
        frame = await read_frame(stream, max_size=PING.max_size, timeout=FRAME_TIMEOUT)
        request = decode(frame, kinds=frozenset({PING.name}))
        remote = str(stream.muxed_conn.peer_id)
        if request.author_peer_id != remote:
            raise ProtocolError("wrong-author", f"ping signed by {request.author_peer_id}, sent by {remote}")
        reply = encode(self._node.identity, PING.name, {"nonce": request.body["nonce"]})
        await write_frame(stream, reply, timeout=FRAME_TIMEOUT)

    async def ping(self, peer_id: str) -> float:
        """Round-trip time to `peer_id` in seconds; `DialError` or `ProtocolError` if it fails."""
        node = self._node
        assert node is not None, "the service is not running"
        nonce = secrets.token_bytes(NONCE_SIZE)
        stream = await node.open_stream(peer_id, [PROTOCOL_ID])
        try:
            started = trio.current_time()
            await write_frame(stream, encode(node.identity, PING.name, {"nonce": nonce}), timeout=FRAME_TIMEOUT)
            frame = await read_frame(stream, max_size=PING.max_size, timeout=FRAME_TIMEOUT)
            elapsed = trio.current_time() - started
        finally:
            await close_quietly(stream)
        reply = decode(frame, kinds=frozenset({PING.name}))
        if reply.author_peer_id != peer_id:
            raise ProtocolError("wrong-author", f"pong signed by {reply.author_peer_id}, not {peer_id}")
        if reply.body["nonce"] != nonce:
            raise ProtocolError("wrong-nonce", "pong carries another nonce")
        return elapsed

    async def _rpc_ping(self, peer_id: str) -> dict[str, Any]:
        if not isinstance(peer_id, str) or not peer_id:
            raise RpcError.invalid_params("peer_id must be a peer ID string")
        try:
            seconds = await self.ping(peer_id)
        except (DialError, ProtocolError, ValueError) as error:
            raise RpcError(-32000, f"ping failed: {error}") from None
        return {"peer_id": peer_id, "rtt_ms": round(seconds * 1000, 3)}
