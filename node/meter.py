"""Byte accounting at the connection level: a transport wrapper that counts every byte.

py-libp2p 0.8.1 keeps no byte counters we could read, so the node wraps each
of its transports in `MeteredTransport`. Every raw connection it dials or
accepts has its byte stream replaced by a `CountingStream`, which adds what
passes through `read` and `write` to one shared `ByteMeter`. The counts are
wire bytes: Noise handshakes and tags, Yamux headers, multistream
negotiation and Identify are all included, which is what a volunteer paying
for bandwidth cares about. Each `CountingStream` also keeps the totals of its
own connection, which `connection_bytes` finds under a swarm connection.

The same wrapping puts a `WholeWriteStream` under the counter, so that no
write on a connection is cut short by a cancelled writer (`whole_writes`
says why that matters), and between the two a `PacedStream`, which holds
each read and write to the node's upload and download caps
(`locomesh.node.bandwidth`; the meter carries the node's buckets).

The wrapper works for any transport whose connections are
`RawConnection`s (TCP, the simulator's in-memory transport). A transport that
hands out already-multiplexed connections (QUIC) is not counted; locomesh
does not use one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IListener, IRawConnection, ITransport
from libp2p.io.abc import ReadWriteCloser
from libp2p.network.connection.raw_connection import RawConnection
from multiaddr import Multiaddr

from locomesh.node.bandwidth import SLICE, Bandwidth
from locomesh.node.whole_writes import WholeWriteStream


@dataclass
class ByteMeter:
    """Totals of bytes received and sent over all connections of one host, and the node's rate caps
    (which the data plane's sockets share)."""

    bytes_in: int = 0
    bytes_out: int = 0
    bandwidth: Bandwidth = field(default_factory=Bandwidth)


class CountingStream(ReadWriteCloser):
    """A connection's byte stream that adds its traffic to a `ByteMeter`, and keeps its own totals."""

    def __init__(self, inner: ReadWriteCloser, meter: ByteMeter) -> None:
        self._inner = inner
        self._meter = meter
        self.bytes_in = 0
        self.bytes_out = 0

    async def read(self, n: int | None = None) -> bytes:
        data = await self._inner.read(n)
        self._meter.bytes_in += len(data)
        self.bytes_in += len(data)
        return data

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)
        self._meter.bytes_out += len(data)
        self.bytes_out += len(data)

    async def close(self) -> None:
        await self._inner.close()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._inner.get_remote_address()

    def __getattr__(self, name: str) -> Any:
        # Anything else a transport's stream offers (local address, socket options).
        return getattr(self._inner, name)


class PacedStream(ReadWriteCloser):
    """A connection's byte stream held to the node's upload and download caps (`bandwidth`).

    A write waits for its turn shielded from cancellation: Noise sealed it with its session's next
    nonce before writing it, so a write given up while waiting would tear the session just as one
    cut short on the socket would (`whole_writes`). The wait is for its own reservation only,
    never a lock: other connections' writers reserve after it and wait for theirs."""

    def __init__(self, inner: ReadWriteCloser, bandwidth: Bandwidth) -> None:
        self._inner = inner
        self._bandwidth = bandwidth

    async def read(self, n: int | None = None) -> bytes:
        download = self._bandwidth.download
        if not download.capped:
            data = await self._inner.read(n)
            download.charge(len(data))
            return data
        await download.wait_ready()
        data = await self._inner.read(SLICE if n is None else min(n, SLICE))
        download.charge(len(data))
        return data

    async def write(self, data: bytes) -> None:
        with trio.CancelScope(shield=True):
            await self._bandwidth.upload.take(len(data))
        # No checkpoint between here and the shield the `WholeWriteStream` below opens first thing.
        await self._inner.write(data)

    async def close(self) -> None:
        await self._inner.close()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._inner.get_remote_address()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class MeteredTransport(ITransport):
    """`inner`, with every connection it makes or accepts counted in `meter`, paced to its caps and
    written whole."""

    def __init__(self, inner: ITransport, meter: ByteMeter) -> None:
        self.inner = inner
        self.meter = meter
        self.provides_native_muxing = inner.provides_native_muxing

    async def dial(self, maddr: Multiaddr) -> IRawConnection:
        return self._count(await self.inner.dial(maddr))

    async def dial_with_source(self, maddr: Multiaddr, source: tuple[str, int]) -> IRawConnection:
        """Dial from a given local (ip, port): TCP hole punching needs it; other transports ignore `source`."""
        dial_with_source = getattr(self.inner, "dial_with_source", None)
        if dial_with_source is None:
            return await self.dial(maddr)
        return self._count(await dial_with_source(maddr, source))

    def create_listener(self, handler_function: Any) -> IListener:
        async def counted_handler(stream: ReadWriteCloser) -> None:
            if isinstance(stream, ReadWriteCloser):
                stream = _wrapped(stream, self.meter)
            await handler_function(stream)

        return self.inner.create_listener(counted_handler)

    def can_dial(self, maddr: Multiaddr) -> bool:
        return self.inner.can_dial(maddr)

    def can_listen(self, maddr: Multiaddr) -> bool:
        return self.inner.can_listen(maddr)

    def protocols(self) -> list[str]:
        return self.inner.protocols()

    def _count(self, connection: IRawConnection) -> IRawConnection:
        if isinstance(connection, RawConnection):
            connection.stream = _wrapped(connection.stream, self.meter)
        return connection


def _wrapped(stream: ReadWriteCloser, meter: ByteMeter) -> CountingStream:
    return CountingStream(PacedStream(WholeWriteStream(stream), meter.bandwidth), meter)


# Where py-libp2p 0.8.1 keeps the raw connection under a swarm connection:
# muxed_conn (Yamux) -> secured_conn (Noise session) -> conn -> conn (RawConnection) -> stream.
# Only that deep: a relayed connection's raw connection is a stream on the relay's connection, whose
# own layers lead on to the relay's counts, which are not this connection's.
_LAYERS = ("muxed_conn", "secured_conn", "conn", "stream", "read_writer")
_MAX_DEPTH = 6


def connection_bytes(conn: Any) -> tuple[int, int] | None:
    """(bytes in, bytes out) on the wire of one swarm connection so far; None when it runs over no
    `CountingStream` of ours (a relayed connection: its bytes count on the relay's connection)."""
    layer = conn
    for _ in range(_MAX_DEPTH):
        if isinstance(layer, CountingStream):
            return layer.bytes_in, layer.bytes_out
        inner = next((vars(layer)[name] for name in _LAYERS if name in getattr(layer, "__dict__", {})), None)
        if inner is None:
            return None
        layer = inner
    return None
