"""Stream helpers every locomesh protocol uses: length-prefixed frames and guarded handlers.

A protocol over libp2p is a stream handler plus a few frames each way. Two
things must hold for every one of them, and this module is where they hold:

* **Frames are bounded and timed.** A frame is a 4-byte big-endian length
  followed by that many bytes. `read_frame` refuses a length over the
  caller's `max_size` *before* reading the payload (so a peer cannot make us
  buffer 4 GiB), refuses a stream that ends mid-frame, and gives up after
  `timeout` seconds. All three are `ProtocolError`s with codes
  ``too-large``, ``truncated`` and ``timeout``, so they are counted and
  charged to the sender like any other bad input. A stream closed before
  its first frame is ``closed``: a peer that changed its mind, counted
  apart (`NOT_PROTOCOL_ERRORS`).

* **A handler never takes the host down.** In py-libp2p an exception that
  escapes a stream handler tears down the whole host (its ExceptionGroup
  leaves `host.run()`). `guarded(handler)` wraps a handler so that every
  exception is caught, logged, counted (through `on_error(code)`), and the
  stream is reset; a handler that returns normally gets its stream closed.
  Cancellation (`trio.Cancelled`) is not an error and passes through.

The helpers work on any object with ``async read(n) -> bytes`` and
``async write(data)`` (a libp2p `INetStream`, or the in-memory streams of the
simulator). End of stream may show as ``b""`` or as an `EOFError` (libp2p's
`StreamEOF` is one); both are handled.

Byte accounting is not done here: the node counts every byte at the
connection level (see `locomesh.node.meter`), which also covers Noise, Yamux
and Identify overhead.

Usage in a service::

    async def handle(stream):
        request = decode(await read_frame(stream, max_size=512, timeout=10))
        await write_frame(stream, reply_bytes, timeout=10)

    node.set_stream_handler(PROTOCOL_ID, handle)   # wraps it in guarded()
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

import trio
from libp2p.io.exceptions import IOException

from locomesh.protocol import ProtocolError

logger = logging.getLogger(__name__)

FRAME_HEADER_SIZE = 4
MAX_FRAME_SIZE = 2**32 - 1
_READ_CHUNK = 64 * 1024  # per read, unless the stream's `largest_read` says larger reads are cheap
_SEPARATE_WRITE = 64 * 1024  # frames from this size on are written as header, then payload
_RESET_TIMEOUT = 2.0


class ByteStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


async def write_frame(stream: ByteStream, data: bytes, *, timeout: float) -> None:
    """Send `data` as one frame, or raise `ProtocolError("timeout")` after `timeout` s.

    Errors of the stream itself (reset, closed) pass through unchanged.
    """
    if len(data) > MAX_FRAME_SIZE:
        raise ValueError(f"a frame holds at most {MAX_FRAME_SIZE} bytes, not {len(data)}")
    header = len(data).to_bytes(FRAME_HEADER_SIZE, "big")
    with _deadline(timeout, "writing a frame"):
        if len(data) < _SEPARATE_WRITE:
            await stream.write(header + data)
        else:  # a large payload is not copied just to put 4 bytes in front of it
            await stream.write(header)
            await stream.write(data)


async def read_frame(stream: ByteStream, *, max_size: int, timeout: float) -> bytes:
    """Receive one frame of at most `max_size` bytes within `timeout` seconds.

    Raises `ProtocolError` with code ``too-large`` (announced length over
    `max_size`; nothing of the payload is read), ``truncated`` (the stream
    ended inside the frame), ``closed`` (it ended before the frame's first
    byte) or ``timeout``.
    """
    frame = await read_frame_or_eof(stream, max_size=max_size, timeout=timeout)
    if frame is None:  # the peer sent nothing and closed: it changed its mind, not bad input
        raise ProtocolError("closed", "the peer closed the stream before sending a frame")
    return frame


async def read_frame_or_eof(stream: ByteStream, *, max_size: int, timeout: float) -> bytes | None:
    """Like `read_frame`, but a stream that ends cleanly *between* frames gives None.

    For loops that read frames until the peer is done.
    """
    _limit_frames(stream, FRAME_HEADER_SIZE + max_size)
    with _deadline(timeout, "reading a frame"):
        header = await _read_exactly(stream, FRAME_HEADER_SIZE, allow_eof=True)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
        if size > max_size:
            raise ProtocolError("too-large", f"frame of {size} bytes is over the limit of {max_size}")
        payload = await _read_exactly(stream, size, allow_eof=False)
        assert payload is not None
        return payload


def _limit_frames(stream: ByteStream, size: int) -> None:
    """Tell a stream that frames its bytes itself (the data plane's `SealedStream`) that the frames it
    opens next may hold `size` bytes at most: a larger one is refused from its header, before the
    stream buffers any of it (so the cap here holds for what the stream buffers, too)."""
    limit = getattr(stream, "limit_frames", None)
    if limit is not None:
        limit(size)


async def _read_exactly(stream: ByteStream, size: int, *, allow_eof: bool) -> bytes | None:
    """`size` bytes; None when the stream ends before the first one and `allow_eof`."""
    parts: list[bytes] = []
    received = 0
    largest_read = getattr(stream, "largest_read", _READ_CHUNK)
    while received < size:
        try:
            chunk = await stream.read(min(size - received, largest_read))
        except EOFError:
            chunk = b""
        if not chunk:
            if received == 0 and allow_eof:
                return None
            raise ProtocolError("truncated", f"stream ended after {received} of {size} bytes")
        parts.append(chunk)
        received += len(chunk)
    return b"".join(parts)


@contextmanager
def _deadline(seconds: float, doing: str) -> Iterator[None]:
    """`trio.fail_after` that raises `ProtocolError("timeout")` instead of `TooSlowError`."""
    if not seconds > 0:
        raise ValueError(f"a timeout must be positive, not {seconds!r}")
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise ProtocolError("timeout", f"gave up {doing} after {seconds:g} s") from None


Handler = Callable[[Any], Awaitable[None]]
ErrorCounter = Callable[[str], None]


# Failures of the stream itself (the peer reset it, the connection dropped): not bad input, not our bug.
_STREAM_FAILURES = (IOException, trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)

# Codes of streams that ended early without anything wrong in what the peer sent: it closed or reset
# the stream (a fetch it no longer needed, a peer that left), or it asked about a run this node does
# not replicate (yet: peers that join together ask each other before each has the run). Healthy runs
# see these all the time, so they are counted apart from protocol errors and logged at DEBUG.
NOT_PROTOCOL_ERRORS = frozenset({"closed", "stream-failed", "unknown-run"})


def error_code(error: BaseException) -> str:
    """The short label an error is counted under.

    A `ProtocolError`'s own code; ``truncated`` for an early end of stream;
    ``stream-failed`` when the stream or connection broke; ``internal`` for
    anything else (a bug in the handler). A group of one exception (what a
    handler's own nursery raises) counts as that exception.
    """
    error = sole_exception(error)
    if isinstance(error, trio.TooSlowError):
        return "timeout"
    if isinstance(error, ProtocolError):
        return error.code
    if isinstance(error, EOFError):
        return "truncated"
    if isinstance(error, _STREAM_FAILURES):
        return "stream-failed"
    return "internal"


def sole_exception(error: BaseException) -> BaseException:
    """The one exception inside (nested) groups of one, as trio's nurseries wrap it; else `error` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def guarded(
    handler: Handler,
    *,
    name: str,
    on_error: ErrorCounter | None = None,
    timeout: float | None = 60.0,
) -> Handler:
    """Wrap a stream handler so that nothing it does can escape into the host.

    The wrapper runs `handler(stream)` under an overall deadline of `timeout`
    seconds (None: no overall deadline, for long transfers that bound each
    frame instead). If the handler raises (or overruns), the error is logged
    at INFO for bad input (`ProtocolError`) and at ERROR with a traceback for
    anything else (that is a bug in us), `on_error(code)` is called, and the
    stream is reset. If it returns, the stream is closed. `name` (usually the
    protocol ID) appears in the log lines.
    """

    async def run_guarded(stream: Any) -> None:
        try:
            with trio.fail_after(timeout) if timeout is not None else nullcontext():
                await handler(stream)
        except Exception as error:  # noqa: BLE001 - the point of this wrapper
            code = error_code(error)
            _log_handler_error(name, _peer_of(stream), code, error)
            if on_error is not None:
                on_error(code)
            await reset_quietly(stream)
        else:
            await close_quietly(stream)

    run_guarded.__name__ = f"guarded_{getattr(handler, '__name__', 'handler')}"
    return run_guarded


def _log_handler_error(name: str, peer: str, code: str, error: Exception) -> None:
    if code == "internal":
        logger.error("%s: handler failed on a stream from %s", name, peer, exc_info=error)
    elif code in NOT_PROTOCOL_ERRORS:
        logger.debug("%s: a stream from %s ended early: %s", name, peer, str(error) or code)
    else:
        logger.info("%s: dropped a stream from %s: %s", name, peer, str(error) or code)


def _peer_of(stream: Any) -> str:
    """The remote peer ID of a libp2p stream, for log lines ("?" for other streams)."""
    connection = getattr(stream, "muxed_conn", None)
    return str(getattr(connection, "peer_id", "?"))


async def close_quietly(stream: Any) -> None:
    """Close `stream` within a short time, ignoring errors (it may already be gone)."""
    await _quietly(stream, "close")


async def reset_quietly(stream: Any) -> None:
    """Reset `stream` within a short time, ignoring errors (it may already be gone)."""
    await _quietly(stream, "reset")


async def _quietly(stream: Any, action: str) -> None:
    method = getattr(stream, action, None)
    if method is None:
        return
    with trio.move_on_after(_RESET_TIMEOUT):
        try:
            await method()
        except Exception as error:  # noqa: BLE001 - the stream may already be gone
            logger.debug("%s of a stream failed: %s", action, error)
