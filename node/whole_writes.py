"""Writes on a libp2p connection's byte stream go out whole, whatever cancels the writer.

Why: Noise seals each message with the next nonce of its session *before* it
writes it (py-libp2p 0.8.1, `security/noise/io.py`). A write cancelled after
that (at the socket's lock, or with half its bytes sent) leaves the session one
nonce, or a few bytes, out of step: the peer's next decryption fails
("NoiseInvalidMessage: Failed authentication of message") and it drops the
whole connection, with every stream on it. Writes are cancelled all the time
in a node: a chunk asked of two providers is cancelled at one once the other
answered, fetches of a discarded round are cancelled, timeouts fire. Under
load some of them land in that window: in `bench/round_exchange.py` runs
connections were dropped that way, and the payload fetches on them failed and
were retried (docs/measurements.md).

So the byte stream under every connection (`MeteredTransport` wraps each one
in a `WholeWriteStream`) shields each write from cancellation. A cancel still
lands, at the writer's next checkpoint, once the message is out. A write that
cannot finish within `WRITE_TIMEOUT` (the peer stopped reading) closes the
connection instead: after part of a message nothing else can follow on it.
"""

from __future__ import annotations

from typing import Any

import trio
from libp2p.io.abc import ReadWriteCloser
from libp2p.io.exceptions import ConnectionClosedError

WRITE_TIMEOUT = 20.0


class WholeWriteStream(ReadWriteCloser):
    """`inner`, whose every `write` either completes or, after `WRITE_TIMEOUT`, closes the stream."""

    def __init__(self, inner: ReadWriteCloser, *, timeout: float = WRITE_TIMEOUT) -> None:
        self._inner = inner
        self._timeout = timeout

    async def write(self, data: bytes) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._timeout):
                await self._inner.write(data)
                return
            with trio.move_on_after(self._timeout):
                await self._inner.close()
        raise ConnectionClosedError(f"a write of {len(data)} bytes took over {self._timeout:g} s; connection closed")

    async def read(self, n: int | None = None) -> bytes:
        return await self._inner.read(n)

    async def close(self) -> None:
        await self._inner.close()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._inner.get_remote_address()

    def __getattr__(self, name: str) -> Any:
        # Anything else a transport's stream offers (local address, socket options).
        return getattr(self._inner, name)
