"""The local RPC endpoint: HTTP/1.1 on 127.0.0.1, JSON-RPC 2.0 at ``POST /``, Prometheus at ``GET /metrics``.

Authentication (bitcoind's cookie idea, with a Bearer header): at every start
the daemon writes 32 fresh random bytes, hex-encoded, to ``<datadir>/rpc.cookie``
(mode 0600). A JSON-RPC request must carry ``Authorization: Bearer <cookie>``;
the comparison takes constant time. A missing or wrong cookie gets 401, and
the method is not looked at. Whoever can read the data dir can drive the node.

``GET /metrics`` needs no cookie: Prometheus scrapers do not have one, the
socket is bound to 127.0.0.1 only, and the metrics reveal no secret (no peer
IDs either: nothing that labels who we talk to).

Every request must name us in its ``Host`` header (``127.0.0.1:PORT``,
``localhost:PORT`` or ``[::1]:PORT``), else 403: a web page whose DNS name is
rebound to 127.0.0.1 sends its own name there, so it cannot read /metrics.

Bounds, so a local process that misbehaves cannot hurt the node: request
heads of 16 KiB and bodies of 1 MiB at most (see `http11`); a connection
must start each request within `FIRST_BYTE_TIMEOUT` seconds (an idle one is
closed without a word) and deliver it whole within `REQUEST_TIMEOUT`; at
most `MAX_CONNECTIONS` connections are served at once. Past that, up to
`MAX_WAITING` more have their first request read: one that carries the
cookie is served in one of `RESERVED_CONNECTIONS` reserved slots (so the CLI
still gets through while idle connections hold the others), any other is
answered 503 with ``Connection: close``. Connections past those are closed
at once. A refused client gets its answer, not a reset: the server reads its
request before answering and, after the answer, reads what it still sends
for up to `LINGER_TIMEOUT` seconds before closing. Every HTTP-level refusal
carries a JSON-RPC error object as its body.

Shutdown: `stop()` closes the listening socket at once; requests already
being served get up to `DRAIN_TIMEOUT` seconds to be answered (so the answer
to ``node.shutdown`` gets out), then the connections are closed.
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from locomesh.node import metrics as metrics_module
from locomesh.node.rpc.http11 import HttpError, Request, RequestParser, State, render_response
from locomesh.node.rpc.dispatch import INVALID_REQUEST, RpcDispatcher
from locomesh.node.runtime import AddressInUse, ListenError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
FIRST_BYTE_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
SEND_TIMEOUT = 10.0
DRAIN_TIMEOUT = 2.0
LINGER_TIMEOUT = 1.0
MAX_CONNECTIONS = 32
RESERVED_CONNECTIONS = 2
MAX_WAITING = 32
_RECEIVE_SIZE = 64 * 1024
_MAX_LINGER_BYTES = 2 * 1024 * 1024


class RpcServer:
    """Serves one `RpcDispatcher` and one metrics page, guarded by `cookie`."""

    def __init__(
        self,
        dispatcher: RpcDispatcher,
        *,
        cookie: str,
        render_metrics: Callable[[], str],
        on_reject: Callable[[str], None] = lambda reason: None,
        max_connections: int = MAX_CONNECTIONS,
        reserved_connections: int = RESERVED_CONNECTIONS,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self.dispatcher = dispatcher
        self._expected_auth = f"Bearer {cookie}".encode("ascii")
        self._render_metrics = render_metrics
        self._on_reject = on_reject
        self._connections = trio.CapacityLimiter(max_connections)
        self._reserved = trio.CapacityLimiter(reserved_connections)
        self._waiting = trio.CapacityLimiter(max_waiting)
        self._stopping = trio.Event()
        self._hosts: frozenset[str] = frozenset()
        self.port: int | None = None

    async def run(self, port: int = 0, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1:`port` (0: any free port; the chosen one is `self.port`) until `stop()`.

        Raises `AddressInUse` if something listens there, `ListenError` if the port cannot be had otherwise.
        """
        try:
            listeners = await trio.open_tcp_listeners(port, host=HOST)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise AddressInUse(f"address in use: {HOST}:{port} (the RPC port)") from None
            raise ListenError(f"cannot listen for RPC on {HOST}:{port}: {error.strerror}") from None
        self.port = listeners[0].socket.getsockname()[1]
        self._hosts = frozenset(f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]"))
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as acceptor:
                serve = partial(trio.serve_listeners, self._serve_connection, listeners, handler_nursery=connections)
                acceptor.start_soon(serve)
                task_status.started(self.port)
                await self._stopping.wait()
                acceptor.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            with trio.move_on_after(DRAIN_TIMEOUT):
                while self._connections.borrowed_tokens or self._reserved.borrowed_tokens:
                    await trio.sleep(0.02)
            connections.cancel_scope.cancel()

    def stop(self) -> None:
        self._stopping.set()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            if _take(self._connections):
                try:
                    await self._serve_requests(stream, RequestParser())
                finally:
                    self._connections.release()
            elif _take(self._waiting):
                await self._serve_over_the_limit(stream)
            else:
                self._on_reject("busy")  # closed at once: even its request would cost a slot to read
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away; nothing to answer
        except Exception:  # noqa: BLE001 - one bad connection must not stop the server
            logger.exception("RPC connection failed")
        finally:
            await stream.aclose()

    async def _serve_over_the_limit(self, stream: trio.SocketStream) -> None:
        """Every slot is taken, and we hold a waiting one: read the first request, then serve it in a
        reserved slot if it carries the cookie and one is free, else answer 503."""
        parser = RequestParser()
        try:
            try:
                request = await _receive_request(stream, parser, whole=FIRST_BYTE_TIMEOUT)
            except HttpError as error:
                await self._refuse(stream, error, reason="timeout" if error.status == 408 else "bad-http")
                return
            if request is None:
                return
            if not (self._authorized(request) and _take(self._reserved)):
                await self._refuse(stream, HttpError(503, "too many RPC connections"), reason="busy")
                return
        finally:
            self._waiting.release()
        try:
            await self._serve_requests(stream, parser, first=request)
        finally:
            self._reserved.release()

    async def _serve_requests(
        self, stream: trio.SocketStream, parser: RequestParser, first: Request | None = None
    ) -> None:
        """Answer `first` (if given) and the requests after it on `stream` until the client stops
        keeping the connection alive, goes idle, or sends something we refuse."""
        request = first
        while not self._stopping.is_set():
            if request is None:
                try:
                    request = await _receive_request(stream, parser)
                except HttpError as error:
                    await self._refuse(stream, error, reason="timeout" if error.status == 408 else "bad-http")
                    return
                if request is None:
                    return
            status, body, content_type = await self._respond(request)
            keep_alive = request.keep_alive and not self._stopping.is_set()
            response = render_response(
                status, body, content_type=content_type, keep_alive=keep_alive, extra_headers=_extra(status)
            )
            with trio.move_on_after(SEND_TIMEOUT):
                await stream.send_all(response)
            if not keep_alive:
                return
            parser.start_next()
            request = None

    async def _respond(self, request: Request) -> tuple[int, bytes, str]:
        """(status, body, content type) for one request."""
        if request.headers.get("host", "").lower() not in self._hosts:
            self._on_reject("bad-host")
            return _http_error_body(HttpError(403, "the Host header must name 127.0.0.1, localhost or [::1] and our port"))
        if request.target == "/metrics":
            if request.method != "GET":
                return _http_error_body(HttpError(405, "use GET for /metrics"))
            return 200, self._render_metrics().encode("utf-8"), metrics_module.CONTENT_TYPE
        if request.target != "/":
            return _http_error_body(HttpError(404, f"nothing at {request.target[:64]}"))
        if request.method != "POST":
            return _http_error_body(HttpError(405, "JSON-RPC takes POST /"))
        if not self._authorized(request):
            self._on_reject("unauthorized")
            return _http_error_body(HttpError(401, "missing or wrong cookie (Authorization: Bearer <rpc.cookie>)"))
        body = await self.dispatcher.handle(request.body)
        return (204, b"", "application/json") if body is None else (200, body, "application/json")

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "").encode("latin-1")
        return hmac.compare_digest(given, self._expected_auth)

    async def _refuse(self, stream: trio.SocketStream, error: HttpError, *, reason: str) -> None:
        """Count the refusal under `reason`, answer `error` and close our side, then read what the
        client still sends (for a while): closing with unread bytes makes the kernel send a reset,
        and the client would lose the answer."""
        self._on_reject(reason)
        status, body, content_type = _http_error_body(error)
        response = render_response(
            status, body, content_type=content_type, keep_alive=False, extra_headers=_extra(status)
        )
        with trio.move_on_after(SEND_TIMEOUT):
            try:
                await stream.send_all(response)
                await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        await _linger(stream)


def _take(limiter: trio.CapacityLimiter) -> bool:
    try:
        limiter.acquire_nowait()
        return True
    except trio.WouldBlock:
        return False


async def _receive_request(
    stream: trio.SocketStream, parser: RequestParser, *, whole: float = REQUEST_TIMEOUT
) -> Request | None:
    """The next request on `stream`; None when the client closed cleanly or sent no byte of it within
    FIRST_BYTE_TIMEOUT (an idle connection: closed without a word); `HttpError` for a bad one, or
    408 when it did not arrive whole within `whole` seconds."""
    first_byte_by = trio.current_time() + FIRST_BYTE_TIMEOUT
    with trio.move_on_after(whole) as timer:
        while True:
            request = parser.next_request()
            if request is not None or parser.state is State.CLOSED:
                return request
            idle = parser.buffered == 0 and parser.state is State.HEAD
            with trio.move_on_at(first_byte_by if idle else math.inf) as waiting:
                data = await stream.receive_some(_RECEIVE_SIZE)
            if waiting.cancelled_caught:
                return None
            parser.receive_data(data)
    assert timer.cancelled_caught
    if parser.buffered == 0 and parser.state is State.HEAD:
        return None
    raise HttpError(408, f"request not complete within {whole:g} s")


async def _linger(stream: trio.SocketStream) -> None:
    """Read and drop what the client sends until it closes, for at most LINGER_TIMEOUT seconds."""
    received = 0
    with trio.move_on_after(LINGER_TIMEOUT):
        try:
            while received < _MAX_LINGER_BYTES and (data := await stream.receive_some(_RECEIVE_SIZE)):
                received += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _http_error_body(error: HttpError) -> tuple[int, bytes, str]:
    message = f"HTTP {error.status}: {error.reason}"
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
    return error.status, json.dumps(body).encode("utf-8"), "application/json"


def _extra(status: int) -> tuple[tuple[str, str], ...]:
    return (("WWW-Authenticate", 'Bearer realm="locomesh"'),) if status == 401 else ()
