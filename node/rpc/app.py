"""The local HTTP side as an ASGI app (Starlette): JSON-RPC at ``POST /``, Prometheus at ``GET /metrics``.

Authentication (bitcoind's cookie idea, with a Bearer header): at every start
the daemon writes 32 fresh random bytes, hex-encoded, to ``<datadir>/rpc.cookie``
(mode 0600). A JSON-RPC request must carry ``Authorization: Bearer <cookie>``;
the comparison takes constant time. A missing or wrong cookie gets 401, and
the method is not looked at. Whoever can read the data dir can drive the node.

``GET /metrics`` needs no cookie: Prometheus scrapers do not have one, the
socket is bound to 127.0.0.1 only, and the metrics reveal no secret (no peer
IDs either: nothing that labels who we talk to).

Every request must name us in its ``Host`` header (``127.0.0.1:PORT``,
``localhost:PORT`` or ``[::1]:PORT``), else 403 (`LocalOnly`): a web page
whose DNS name is rebound to 127.0.0.1 sends its own name there, so it can
read neither /metrics nor the dashboard.

Bodies are capped (`MAX_BODY`), by their declared length before a byte of
them is read and by what arrives when none is declared, and must arrive
within `REQUEST_TIMEOUT` seconds (`read_body`). Every HTTP-level refusal of
the RPC carries a JSON-RPC error object as its body. Other routes (the
dashboard) are added by the caller.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Sequence

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from locomesh.node.metrics import Metrics
from locomesh.node.rpc.dispatch import INVALID_REQUEST, RpcDispatcher

logger = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
MAX_HEAD = 16 * 1024
MAX_HEADERS = 64
REQUEST_TIMEOUT = 10.0
LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")

# What sending an answer raises when the client closed its side meanwhile (trio's errors, as
# Hypercorn lets them through).
_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError)

OnReject = Callable[[str], None]  # told a fixed reason for every refused request (a metric label)


def local_hosts(port: int) -> frozenset[str]:
    """The ``Host`` header values (lower case) that name us at `port`."""
    return frozenset(f"{name}:{port}" for name in LOCAL_NAMES)


def refusal(status: int, reason: str, headers: dict[str, str] | None = None) -> Response:
    """An HTTP refusal whose body is a JSON-RPC error object (what RPC clients can read)."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": f"HTTP {status}: {reason}"}}
    return Response(json.dumps(body), status_code=status, media_type="application/json", headers=headers)


async def read_body(request: Request, *, limit: int = MAX_BODY, timeout: float = REQUEST_TIMEOUT) -> bytes:
    """The request's body, at most `limit` bytes, arrived within `timeout` seconds; else
    `HTTPException` 413 (too large: refused before reading when the length is declared) or 408."""
    check_declared_length(request, limit)
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout) as timer:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"body over {limit} bytes")
            chunks.append(chunk)
    if timer.cancelled_caught:
        raise HTTPException(408, f"request body not complete within {timeout:g} s")
    return b"".join(chunks)


def check_declared_length(request: Request, limit: int) -> None:
    """`HTTPException` 413 if the request declares a body over `limit` bytes (400 if it declares nonsense)."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.isascii() or not declared.isdigit() or len(declared) > 18:
        raise HTTPException(400, "malformed Content-Length")
    if int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes is over {limit}")


class LocalOnly:
    """ASGI middleware: refuses a request head over `MAX_HEAD` bytes or `MAX_HEADERS` fields (431)
    and any request whose one ``Host`` header is not in `hosts()` (403), and answers 500 for an
    exception a handler let escape (logged), so that none reaches the server."""

    def __init__(self, app: ASGIApp, *, hosts: Callable[[], frozenset[str]], on_reject: OnReject) -> None:
        self.app = app
        self.hosts = hosts
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # nothing here speaks it: refused before any check
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        head_size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        head_size += sum(len(key) + len(value) + 4 for key, value in headers)
        if head_size > MAX_HEAD or len(headers) > MAX_HEADERS:
            # The HTTP parser caps only a head that arrives in pieces; one that came whole is measured here.
            self.on_reject("too-large")
            await refusal(431, f"request head over {MAX_HEAD} bytes or {MAX_HEADERS} fields")(scope, receive, send)
            return
        names = [value.decode("latin-1").lower() for key, value in headers if key == b"host"]
        if len(names) != 1 or names[0] not in self.hosts():
            self.on_reject("bad-host")
            reason = "the Host header must name 127.0.0.1, localhost or [::1] and our port"
            await refusal(403, reason)(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except _CLIENT_GONE as error:  # the answer could not go out: nobody left to tell
            logger.debug("HTTP client of %s went away: %r", scope.get("path", "?")[:64], error)
        except Exception:  # a bug in one handler must not reach the server
            logger.exception("HTTP handler for %s failed", scope.get("path", "?")[:64])
            if not started:
                await refusal(500, "internal error")(scope, receive, send)


def build_app(
    dispatcher: RpcDispatcher,
    *,
    cookie: str,
    metrics: Metrics,
    hosts: Callable[[], frozenset[str]],
    on_reject: OnReject = lambda reason: None,
    routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The app: JSON-RPC and /metrics, then `routes` (the dashboard), behind `LocalOnly`."""
    expected = f"Bearer {cookie}".encode("ascii")

    async def rpc(request: Request) -> Response:
        check_declared_length(request, MAX_BODY)
        given = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, expected):
            on_reject("unauthorized")
            reason = "missing or wrong cookie (Authorization: Bearer <rpc.cookie>)"
            return refusal(401, reason, headers={"WWW-Authenticate": 'Bearer realm="locomesh"'})
        answer = await dispatcher.handle(await read_body(request))
        if answer is None:
            return Response(status_code=204)
        return Response(answer, media_type="application/json")

    async def scrape(request: Request) -> Response:
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code in (408, 413):
            on_reject("timeout" if error.status_code == 408 else "too-large")
        return refusal(error.status_code, str(error.detail)[:200], headers=error.headers)

    return Starlette(
        routes=[Route("/", rpc, methods=["POST"]), Route("/metrics", scrape, methods=["GET"]), *routes],
        middleware=[Middleware(LocalOnly, hosts=hosts, on_reject=on_reject)],
        exception_handlers={HTTPException: http_error},
    )
