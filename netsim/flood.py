"""Flooding gossip: the simulator's broadcast, over one long-lived stream per neighbour.

Why not GossipSub (not measured here, decided from the field notes):
py-libp2p's GossipSub needs its heartbeat retuned from the default 120 s to
about 1 s to form a mesh in a scenario's minutes, and then every node does
heartbeat work every virtual second (a thousand heartbeats per virtual
second at 1000 nodes, on top of the connections that already dominate the
CPU, see `bench/netsim_connectivity.py`); its spam protection and caches
read the wall clock (redirected to virtual time by `libp2p_time`, so it
*can* run here for smaller scenarios). Flooding is the simplest broadcast
that exercises what the simulator is for: real streams over real
Noise/Yamux connections, through NATs, with delays.

Protocol: one stream per connection (opened by the dialer, used both ways).
A frame is ``{"origin", "seq", "body", "hops", "id"}`` where ``id`` is the
16-byte BLAKE2b of ``[origin, seq, body]``; a frame whose id does not match
is bad input (counted, stream reset). A node that sees an id for the first
time records its arrival (virtual time, hop count) and forwards the frame
(``hops + 1``) to every other neighbour; a known id counts as a duplicate.
Each neighbour has a bounded queue; when it is full the frame is dropped and
counted, as GossipSub does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from locomesh.node.streams import guarded, read_frame_or_eof, write_frame
from locomesh.protocol import ProtocolError, pack

from .node import STREAM_TIMEOUT, SimNode
from .wire import decode_map

FLOOD_PROTOCOL = "/locomesh/sim/flood/1.0.0"
MAX_FRAME = 16 * 1024
IDLE_TIMEOUT = 3600.0
QUEUE = 64
_FIELDS = {"origin": str, "seq": int, "body": bytes, "hops": int, "id": bytes}


def message_id(origin: str, seq: int, body: bytes) -> bytes:
    return hashlib.blake2b(pack([origin, seq, body]), digest_size=16).digest()


@dataclass(frozen=True)
class Arrival:
    at: float
    hops: int


class Flood:
    """The flooding service of one node."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.arrivals: dict[bytes, Arrival] = {}
        self.duplicates = 0
        self.dropped = 0
        self._links: dict[str, trio.MemorySendChannel[bytes]] = {}
        self._seq = 0

    def serve(self) -> None:
        self.node.add_service(FLOOD_PROTOCOL, self._serve_link, timeout=None)

    def attach(self, peer_id: ID) -> None:
        """Open a flood link to a connected peer (in the background)."""
        if self.node.nursery is not None and str(peer_id) not in self._links:
            self.node.nursery.start_soon(self._dial_link, peer_id)

    @property
    def neighbours(self) -> list[str]:
        """Peer IDs this node has a flood link to."""
        return list(self._links)

    def publish(self, body: bytes) -> bytes:
        """Send `body` to everyone; returns its message id."""
        origin, seq = str(self.node.peer_id), self._seq
        self._seq += 1
        ident = message_id(origin, seq, body)
        self.arrivals[ident] = Arrival(trio.current_time(), 0)
        self._forward(pack({"origin": origin, "seq": seq, "body": body, "hops": 1, "id": ident}), exclude=None)
        return ident

    async def _dial_link(self, peer_id: ID) -> None:
        stream = await self.node.open_stream(peer_id, FLOOD_PROTOCOL)
        if stream is not None:
            await guarded(self._serve_link, name=FLOOD_PROTOCOL, on_error=self._count, timeout=None)(stream)

    async def _serve_link(self, stream: INetStream) -> None:
        peer = str(stream.muxed_conn.peer_id)
        send, receive = trio.open_memory_channel[bytes](QUEUE)
        owner = peer not in self._links  # a second link to the same peer only listens
        if owner:
            self._links[peer] = send
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop, stream, receive)
                await self._read_loop(stream, peer)
                nursery.cancel_scope.cancel()
        finally:
            if owner and self._links.get(peer) is send:
                del self._links[peer]

    async def _read_loop(self, stream: INetStream, peer: str) -> None:
        while (frame := await read_frame_or_eof(stream, max_size=MAX_FRAME, timeout=IDLE_TIMEOUT)) is not None:
            self._receive(frame, peer)

    async def _write_loop(self, stream: INetStream, frames: trio.MemoryReceiveChannel[bytes]) -> None:
        async for frame in frames:
            sent = self.node.hooks.frame(FLOOD_PROTOCOL, frame)
            if sent is not None:
                await write_frame(stream, sent, timeout=STREAM_TIMEOUT)

    def _receive(self, frame: bytes, peer: str) -> None:
        message = decode_map(frame, _FIELDS, max_size=MAX_FRAME)
        if message["id"] != message_id(message["origin"], message["seq"], message["body"]):
            raise ProtocolError("bad-id", "the message id does not match its content")
        if message["id"] in self.arrivals:
            self.duplicates += 1
            return
        self.arrivals[message["id"]] = Arrival(trio.current_time(), message["hops"])
        self._forward(pack({**message, "hops": message["hops"] + 1}), exclude=peer)

    def _forward(self, frame: bytes, *, exclude: str | None) -> None:
        for peer, link in self._links.items():
            if peer == exclude:
                continue
            try:
                link.send_nowait(frame)
            except trio.WouldBlock:
                self.dropped += 1

    def _count(self, code: str) -> None:
        self.node.count_error("flood-" + code)
