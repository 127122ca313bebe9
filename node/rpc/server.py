"""The local HTTP server: the ASGI app of `app` (RPC, /metrics, the dashboard) served by Hypercorn's
per-connection HTTP machinery under our own trio accept loop, bound to 127.0.0.1 only.

We bind the socket ourselves, so that a port in use is an `AddressInUse` (the
daemon exits 2 with one line), and accept on it ourselves: each connection
runs in its own task of one nursery, as Hypercorn's `TCPServer`, and whatever
it raises ends that connection only. (Hypercorn 0.18's own `serve` lets one
connection's error, such as the `BusyResourceError` of a client that
half-closes while its answer goes out, tear down every connection; we rely on
0.18's `TCPServer` and `WorkerContext`, hence the pin in pyproject.toml.)

Bounds, so that a local process that misbehaves cannot hurt the node:

- a request head must arrive whole within `FIRST_BYTE_TIMEOUT` seconds of the
  connection opening or of the answer before it (an idle or dribbling
  connection is closed), and holds at most `app.MAX_HEAD` bytes (431); each
  read of a body waits at most `REQUEST_TIMEOUT` seconds and the whole body
  too (`app.read_body`), and it holds at most `app.MAX_BODY` bytes (413);
- at most `MAX_CONNECTIONS` connections are served at once. Past that, up to
  `MAX_WAITING` more have their first request read: one that carries the
  cookie is served in one of `RESERVED_CONNECTIONS` reserved slots (so the
  CLI still gets through while idle connections hold the others), any other
  is answered 503 with ``Connection: close``. A connection that finds every
  waiting slot taken pushes out the oldest waiting one (none of them has shown
  the cookie: one that does leaves its waiting slot), so idle connections
  cannot lock the cookie holder out, whoever opens them. Refusals and
  connections pushed out are counted through `on_reject` ("busy").

Shutdown: `stop()` ends the accept loop at once; idle connections are closed,
requests already being served get up to `DRAIN_TIMEOUT` seconds to be
answered (so the answer to ``node.shutdown`` gets out), then the
connections are closed.
"""

from __future__ import annotations

import errno
import hmac
import logging
import math
import socket
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import trio
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from locomesh.node.metrics import Metrics
from locomesh.node.rpc.app import MAX_HEAD, OnReject, build_app, local_hosts, refusal
from locomesh.node.rpc.dispatch import RpcDispatcher
from locomesh.node.runtime import AddressInUse, ListenError

logger = logging.getLogger(__name__)
# Hypercorn's own log: its warnings and errors stay.
_HYPERCORN_LOG = logging.getLogger(f"{__name__}.hypercorn")
_HYPERCORN_LOG.setLevel(logging.WARNING)

HOST = "127.0.0.1"
FIRST_BYTE_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
DRAIN_TIMEOUT = 2.0
BACKLOG = 128
MAX_CONNECTIONS = 32
RESERVED_CONNECTIONS = 2
MAX_WAITING = 32
FAILURE_LOG_EVERY = 60.0


class Site(Protocol):
    """More of the local HTTP side (the dashboard): its routes, and its tasks while the server runs."""

    def routes(self) -> Sequence[BaseRoute]: ...

    async def run(self, port: int, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...


class RpcServer:
    """Serves one `RpcDispatcher` guarded by `cookie`, the metrics of `metrics`, and `site` if given."""

    def __init__(
        self,
        dispatcher: RpcDispatcher,
        *,
        cookie: str,
        metrics: Metrics,
        on_reject: OnReject = lambda reason: None,
        site: Site | None = None,
        max_connections: int = MAX_CONNECTIONS,
        reserved_connections: int = RESERVED_CONNECTIONS,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self.dispatcher = dispatcher
        self._site = site
        self._on_reject = on_reject
        self._expected_auth = f"Bearer {cookie}".encode("ascii")
        self._hosts: frozenset[str] = frozenset()
        self._stopping = trio.Event()
        self._connections = _Slots(max_connections)
        self._reserved = _Slots(reserved_connections)
        self._waiting = _Waiting(max_waiting)
        self._context = WorkerContext(None)  # Hypercorn's: `terminated` tells connections we stop
        self._failures = _Throttled(FAILURE_LOG_EVERY)
        self.port: int | None = None
        routes = site.routes() if site is not None else ()
        self.app = build_app(
            dispatcher, cookie=cookie, metrics=metrics, hosts=lambda: self._hosts, on_reject=on_reject, routes=routes
        )
        self._served = wrap_app(self.app, 0, "asgi")

    async def run(self, port: int = 0, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on 127.0.0.1:`port` (0: any free port; the chosen one is `self.port`) until `stop()`.

        Raises `AddressInUse` if something listens there, `ListenError` if the port cannot be had otherwise.
        """
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(_listen(port)))
        async with listener:
            self.port = listener.socket.getsockname()[1]
            self._hosts = local_hosts(self.port)
            config = _config()
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as background:
                    handler = partial(self._serve_connection, config)
                    accept = partial(trio.serve_listeners, handler, [listener], handler_nursery=connections)
                    background.start_soon(accept)
                    if self._site is not None:
                        await background.start(self._site.run, self.port)
                    task_status.started(self.port)
                    await self._stopping.wait()
                    background.cancel_scope.cancel()
                await listener.aclose()
                await self._context.terminated.set()  # idle connections close; answers say Connection: close
                connections.cancel_scope.deadline = trio.current_time() + DRAIN_TIMEOUT

    def stop(self) -> None:
        """Make `run` stop accepting now and return once the connections are done (`DRAIN_TIMEOUT`)."""
        self._stopping.set()

    async def _serve_connection(self, config: Config, stream: trio.SocketStream) -> None:
        """Serve one accepted connection in the slot it can have, then close it; nothing it raises
        goes further than a (throttled) warning."""
        async with stream:
            try:
                await self._serve_in_a_slot(config, stream)
            except Exception as error:  # one connection's failure must not reach the others
                self._failures.warning("a local HTTP connection failed: %s", _describe(error))
                logger.debug("the failure", exc_info=True)

    async def _serve_in_a_slot(self, config: Config, stream: trio.SocketStream) -> None:
        """Hypercorn on `stream` in a free slot; past them, behind an `_Overflow` gate in a waiting
        slot, until it is served or pushed out by a newer connection (the caller then closes it);
        with no waiting slots at all, nothing."""
        if self._connections.take():
            try:
                await self._hypercorn(config, stream, self._served)
            finally:
                self._connections.release()
        elif self._waiting.total:
            gate = _Overflow(
                self.app, authorized=self._authorized, reserved=self._reserved, waiting=self._waiting,
                on_reject=self._on_reject,
            )
            with trio.CancelScope() as scope:
                self._waiting.take(gate, push_out=scope.cancel)
                try:
                    await self._hypercorn(config, stream, wrap_app(gate, 0, "asgi"))
                finally:
                    gate.release()
            if scope.cancelled_caught:
                self._on_reject("busy")
        else:
            self._on_reject("busy")  # closed at once: even its request would cost a slot to read

    async def _hypercorn(self, config: Config, stream: trio.SocketStream, app: Any) -> None:
        """Hypercorn's HTTP/1.1 (and h2c) server for one connection, until the connection ends."""
        await TCPServer(app, config, self._context, ConnectionState({}), stream).run()

    def _authorized(self, scope: Scope) -> bool:
        """Whether the request of `scope` carries exactly one ``Authorization`` header with the cookie."""
        given = [value for key, value in scope["headers"] if key == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self._expected_auth)


class _Overflow:
    """ASGI app of one connection accepted while every slot was taken (it holds a waiting slot):
    its requests are served by `app` once one of them carried the cookie and got a reserved slot;
    until then each is answered 503 with ``Connection: close``. `release()` gives back what it holds."""

    def __init__(self, app: ASGIApp, *, authorized: Any, reserved: _Slots,
                 waiting: _Waiting, on_reject: OnReject) -> None:
        self._app = app
        self._authorized = authorized
        self._reserved = reserved
        self._waiting: _Waiting | None = waiting
        self._holds_reserved = False
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._admitted(scope):
            self._on_reject("busy")
            answer = refusal(503, "too many local HTTP connections", headers={"Connection": "close"})
            await answer(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _admitted(self, scope: Scope) -> bool:
        """True once this connection holds a reserved slot; takes one for a request with the cookie."""
        if not self._holds_reserved and self._authorized(scope) and self._reserved.take():
            self._holds_reserved = True
            self._release_waiting()
        return self._holds_reserved

    def _release_waiting(self) -> None:
        """Give back the waiting slot (if it was not taken from us), once."""
        if self._waiting is not None:
            self._waiting.release(self)
            self._waiting = None

    def release(self) -> None:
        """Give back the slots this connection holds (once the connection has ended)."""
        self._release_waiting()
        if self._holds_reserved:
            self._reserved.release()
            self._holds_reserved = False


class _Throttled:
    """Logs a warning at most once every `every` seconds, and says how many it left out since."""

    def __init__(self, every: float) -> None:
        self._every = every
        self._next = -math.inf
        self._left_out = 0

    def warning(self, message: str, *args: object) -> None:
        """Log `message % args` as a warning unless one was logged less than `every` seconds ago."""
        now = trio.current_time()
        if now < self._next:
            self._left_out += 1
            return
        self._next = now + self._every
        left_out, self._left_out = self._left_out, 0
        if left_out:
            message, args = message + " (and %d like it not logged before)", (*args, left_out)
        logger.warning(message, *args)


def _describe(error: BaseException) -> str:
    """`error` in a short line: the leaves of an exception group, not its nesting."""
    if isinstance(error, BaseExceptionGroup):
        return ", ".join(_describe(inner) for inner in error.exceptions)[:300]
    return repr(error)[:200]


class _Slots:
    """A count of slots, taken and given back by any task (a `trio.CapacityLimiter` is bound to the
    task that took it; a slot here passes from the accept loop to Hypercorn's request tasks)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.taken = 0

    def take(self) -> bool:
        """Take a slot if one is free, without waiting."""
        if self.taken >= self.total:
            return False
        self.taken += 1
        return True

    def release(self) -> None:
        """Give back a slot taken with `take`."""
        assert self.taken > 0, "a slot given back that was not taken"
        self.taken -= 1


class _Waiting:
    """The waiting slots, each held by one connection, oldest first: when all are held, a newcomer
    takes the oldest one's slot, and that connection is pushed out."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._holders: dict[object, Callable[[], None]] = {}  # holder -> how to push it out, oldest first

    @property
    def taken(self) -> int:
        return len(self._holders)

    def take(self, holder: object, *, push_out: Callable[[], None]) -> None:
        """Give `holder` a slot, pushing out the oldest holder if none is free (`push_out` is
        called when `holder` is pushed out in its turn). At least one slot must exist."""
        assert self.total > 0, "no waiting slots"
        if len(self._holders) >= self.total:
            oldest = next(iter(self._holders))
            self._holders.pop(oldest)()
        self._holders[holder] = push_out

    def release(self, holder: object) -> None:
        """Give back `holder`'s slot; nothing if it was pushed out."""
        self._holders.pop(holder, None)


def _listen(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:`port`; `AddressInUse` or `ListenError`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise AddressInUse(f"address in use: {HOST}:{port} (the RPC port)") from None
        raise ListenError(f"cannot listen for RPC on {HOST}:{port}: {error.strerror}") from None
    return sock


def _config() -> Config:
    """Hypercorn's settings for our connections: the timeouts and head caps of the module docstring,
    no Server header, no access log, its errors to our log."""
    config = Config()
    config.keep_alive_timeout = FIRST_BYTE_TIMEOUT  # also the time a request head has to arrive whole
    config.read_timeout = REQUEST_TIMEOUT  # type: ignore[assignment] - Hypercorn takes any number
    config.graceful_timeout = DRAIN_TIMEOUT
    config.h11_max_incomplete_size = MAX_HEAD
    config.h2_max_header_list_size = MAX_HEAD
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = _HYPERCORN_LOG
    return config
