"""The JSON-RPC dispatcher (malformed input → the right error code), the metrics registry, and the
server over real sockets."""

from __future__ import annotations

import json
import math

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from locomesh.node.metrics import MAX_SERIES, Metrics
from locomesh.node.rpc.dispatch import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_BATCH,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcDispatcher,
    RpcError,
    RpcRegistry,
)
from locomesh.node.rpc.server import RpcServer


def make_dispatcher():
    registry = RpcRegistry()
    calls: list[str] = []

    async def add(a: int, b: int = 0) -> int:
        if not isinstance(a, int) or not isinstance(b, int):
            raise RpcError.invalid_params("a and b must be integers")
        return a + b

    async def broken() -> None:
        raise KeyError("a bug")

    async def unserializable() -> object:
        return object()

    for name, function in {"test.add": add, "test.broken": broken, "test.unserializable": unserializable}.items():
        registry.register(name, function)
    return RpcDispatcher(registry, on_call=calls.append), calls


async def call(dispatcher, request) -> dict:
    body = request if isinstance(request, bytes) else json.dumps(request).encode()
    return json.loads(await dispatcher.handle(body))


async def test_a_call_by_name_and_by_position():
    dispatcher, calls = make_dispatcher()
    assert await call(dispatcher, {"jsonrpc": "2.0", "id": 7, "method": "test.add", "params": {"a": 2, "b": 3}}) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": 5,
    }
    assert (await call(dispatcher, {"jsonrpc": "2.0", "id": "x", "method": "test.add", "params": [4]}))["result"] == 4
    assert calls == ["test.add", "test.add"]


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", PARSE_ERROR),
        (b"\xff\xfe", PARSE_ERROR),
        (b"[" * 100_000, PARSE_ERROR),
        (b"1" * 5000, PARSE_ERROR),  # over Python's int-parsing limit
        (b'"a string"', INVALID_REQUEST),
        (b"[]", INVALID_REQUEST),
        (b'{"id": 1, "method": "test.add"}', INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "test.add"}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add", "params": 3}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": {}, "method": "test.add"}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add", "extra": 1}', INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "no.such"}', METHOD_NOT_FOUND),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add"}', INVALID_PARAMS),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add", "params": {"c": 1}}', INVALID_PARAMS),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add", "params": [1, 2, 3]}', INVALID_PARAMS),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.add", "params": {"a": "x"}}', INVALID_PARAMS),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.broken"}', INTERNAL_ERROR),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "test.unserializable"}', INTERNAL_ERROR),
    ],
)
async def test_malformed_requests_get_the_right_error(body, code):
    dispatcher, _ = make_dispatcher()
    response = await call(dispatcher, body)
    assert response["jsonrpc"] == "2.0"
    assert response["error"]["code"] == code
    assert "result" not in response


async def test_internal_errors_do_not_leak_details():
    dispatcher, _ = make_dispatcher()
    response = await call(dispatcher, {"jsonrpc": "2.0", "id": 1, "method": "test.broken"})
    assert "a bug" not in json.dumps(response)


async def test_notifications_get_no_answer_even_when_they_fail():
    dispatcher, calls = make_dispatcher()
    assert await dispatcher.handle(b'{"jsonrpc": "2.0", "method": "test.add", "params": [1]}') is None
    assert await dispatcher.handle(b'{"jsonrpc": "2.0", "method": "no.such"}') is None
    assert calls == ["test.add"]  # an unknown name is never passed on (it would become a metric label)


async def test_batches():
    dispatcher, _ = make_dispatcher()
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "test.add", "params": [1, 1]},
        {"jsonrpc": "2.0", "method": "test.add", "params": [1]},
        5,
        {"jsonrpc": "2.0", "id": 2, "method": "no.such"},
    ]
    responses = await call(dispatcher, batch)
    assert [response.get("result") for response in responses] == [2, None, None]
    codes = [response.get("error", {}).get("code") for response in responses]
    assert codes == [None, INVALID_REQUEST, METHOD_NOT_FOUND]
    too_many = [{"jsonrpc": "2.0", "id": index, "method": "test.add", "params": [1]} for index in range(MAX_BATCH + 1)]
    assert (await call(dispatcher, too_many))["error"]["code"] == INVALID_REQUEST


def test_registry_refuses_bad_registrations():
    registry = RpcRegistry()

    async def method() -> None:
        return None

    def not_async() -> None:
        return None

    registry.register("a.b", method)
    with pytest.raises(ValueError):
        registry.register("a.b", method)
    with pytest.raises(ValueError):
        registry.register("rpc.reserved", method)
    with pytest.raises(TypeError):
        registry.register("a.c", not_async)


def scraped(metrics: Metrics) -> str:
    """What ``GET /metrics`` serves a scraper that asks for no format: the Prometheus text format."""
    body, content_type = metrics.exposition(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    return body.decode("utf-8")


def test_metrics_render_in_the_prometheus_text_format():
    metrics = Metrics()
    requests = metrics.counter("x_requests_total", "Requests.", labels=("method",))
    metrics.gauge("x_up", "Up?\nreally", value=lambda: 1)
    level = metrics.gauge("x_level", "Level.")
    requests.inc(method='we"ird\\')
    requests.inc(2, method="a")
    level.set(math.inf)
    text = scraped(metrics)
    assert text == (
        "# HELP x_requests_total Requests.\n"
        "# TYPE x_requests_total counter\n"
        'x_requests_total{method="a"} 2.0\n'
        'x_requests_total{method="we\\"ird\\\\"} 1.0\n'
        "# HELP x_up Up?\\nreally\n"
        "# TYPE x_up gauge\n"
        "x_up 1.0\n"
        "# HELP x_level Level.\n"
        "# TYPE x_level gauge\n"
        "x_level +Inf\n"
    )
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    assert parsed["x_requests"].samples[1].labels == {"method": 'we"ird\\'}  # escaped, and back
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert metrics.exposition(None)[1].startswith("text/plain; version=0.0.4")


def test_metric_series_are_capped_and_names_checked():
    metrics = Metrics()
    counter = metrics.counter("x_total", "X.", labels=("code",))
    for index in range(MAX_SERIES + 10):
        counter.inc(code=str(index))
    assert len(counter.values) == MAX_SERIES + 1  # the overflow goes to code="other"
    assert counter.get(code="other") == 10
    with pytest.raises(ValueError):
        counter.inc(-1, code="a")
    with pytest.raises(ValueError):
        counter.inc(wrong="a")
    with pytest.raises(ValueError):
        metrics.counter("bad-name", "X.")
    with pytest.raises(ValueError):
        metrics.counter("x_total", "again")


async def _exchange(port: int, request: bytes, *, half_close: bool = False) -> bytes:
    """Send `request` on a new connection; everything the server answers until it closes (or 10 s)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    chunks = []
    async with stream:
        await stream.send_all(request)
        if half_close:
            await stream.send_eof()
        with trio.move_on_after(10):
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
    return b"".join(chunks)


async def test_the_rpc_server_over_real_sockets(nursery):
    dispatcher, _ = make_dispatcher()
    metrics = Metrics()
    metrics.gauge("m", "M.", value=lambda: 1)
    rejected: list[str] = []
    server = RpcServer(dispatcher, cookie="c" * 64, metrics=metrics, on_reject=rejected.append)
    port = await nursery.start(server.run)
    auth = b"Authorization: Bearer " + b"c" * 64 + b"\r\n"
    host = b"Host: 127.0.0.1:%d\r\nConnection: close\r\n" % port

    notification = b'{"jsonrpc":"2.0","method":"test.add","params":[1]}'
    head = b"POST / HTTP/1.1\r\n" + host + auth + b"Content-Length: %d\r\n\r\n" % len(notification)
    assert (await _exchange(port, head + notification)).startswith(b"HTTP/1.1 204 ")
    call = b'{"jsonrpc":"2.0","id":3,"method":"test.add","params":[1,2]}'
    head = b"POST / HTTP/1.1\r\n" + host + auth + b"Content-Length: %d\r\n\r\n" % len(call)
    assert (await _exchange(port, head + call)).endswith(b'{"jsonrpc":"2.0","id":3,"result":3}')
    assert (await _exchange(port, b"GET / HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 405 ")
    assert (await _exchange(port, b"POST /metrics HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 405 ")
    metrics = await _exchange(port, b"GET /metrics HTTP/1.1\r\n" + host + b"\r\n")
    assert metrics.endswith(b"\r\n\r\n# HELP m M.\n# TYPE m gauge\nm 1.0\n")
    upgrade = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    upgrade += b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nHost: 127.0.0.1:%d\r\n\r\n" % port
    assert (await _exchange(port, b"GET /metrics HTTP/1.1\r\n" + upgrade)).startswith(b"HTTP/1.1 403 ")
    chunked = b"POST / HTTP/1.1\r\n" + host + auth + b"Transfer-Encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
    assert (await _exchange(port, chunked + chunk * 17 + b"0\r\n\r\n")).startswith(b"HTTP/1.1 413 ")  # no length said
    assert rejected == ["too-large"]
    long_query = b"GET /metrics?" + b"q" * 60_000 + b" HTTP/1.1\r\n" + host + b"\r\n"  # one piece: no parser cap
    assert (await _exchange(port, long_query)).startswith(b"HTTP/1.1 431 ")
    assert rejected == ["too-large", "too-large"]
    server.stop()


def _slow_dispatcher() -> tuple[RpcDispatcher, trio.Event, trio.Event]:
    """A dispatcher whose ``test.slow`` sets the first event once called, then answers "done" once the
    second is set (or after 10 s)."""
    entered, release = trio.Event(), trio.Event()
    registry = RpcRegistry()

    async def slow() -> str:
        entered.set()
        with trio.move_on_after(10):
            await release.wait()
        return "done"

    registry.register("test.slow", slow)
    return RpcDispatcher(registry), entered, release


def _rpc_request(port: int, body: bytes, *, cookie: bytes = b"c" * 64) -> bytes:
    head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n" % port
    head += b"Authorization: Bearer " + cookie + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body


async def test_a_slow_call_survives_a_flood_of_half_closing_clients(nursery, caplog):
    """Hypercorn 0.18 raises `BusyResourceError` when a client half-closes while its answer goes out;
    that ends its own connection only, not a call in flight on another, and is logged once a minute
    at most."""
    dispatcher, entered, release = _slow_dispatcher()
    server = RpcServer(dispatcher, cookie="c" * 64, metrics=Metrics())
    port = await nursery.start(server.run)
    answers: list[bytes] = []

    async def slow_call() -> None:
        answers.append(await _exchange(port, _rpc_request(port, b'{"jsonrpc":"2.0","id":1,"method":"test.slow"}')))

    async with trio.open_nursery() as calls:
        calls.start_soon(slow_call)
        await entered.wait()
        host = b"Host: 127.0.0.1:%d\r\n" % port
        for _ in range(20):
            await _exchange(port, b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 99999999\r\n\r\n", half_close=True)
        release.set()
    assert answers[0].endswith(b'{"jsonrpc":"2.0","id":1,"result":"done"}')
    assert len([record for record in caplog.records if "connection failed" in record.message]) <= 1
    server.stop()


async def _small_server(nursery) -> tuple[RpcServer, int, list[str]]:
    """A server with 2 connection slots (1 reserved for the cookie holder) and 2 waiting slots,
    its port, and the list its refusals are counted in."""
    dispatcher, _ = make_dispatcher()
    rejected: list[str] = []
    server = RpcServer(
        dispatcher, cookie="c" * 64, metrics=Metrics(), on_reject=rejected.append,
        max_connections=2, reserved_connections=1, max_waiting=2,
    )
    return server, await nursery.start(server.run), rejected


async def test_past_the_connection_cap_only_the_cookie_holder_is_served(nursery):
    """With every slot held by stalled connections, a request without the cookie gets 503 and one
    with it is served in a reserved slot."""
    server, port, rejected = await _small_server(nursery)
    stalled = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    for stream in stalled:
        await stream.send_all(b"POST / HTTP/1.1\r\n")
    await _wait_until(lambda: server._connections.taken == 2)
    metrics = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port
    assert (await _exchange(port, metrics)).startswith(b"HTTP/1.1 503 ")
    assert rejected == ["busy"]
    answer = await _exchange(port, _rpc_request(port, b'{"jsonrpc":"2.0","id":1,"method":"test.add","params":[1,2]}'))
    assert answer.endswith(b'{"jsonrpc":"2.0","id":1,"result":3}')
    assert (await _exchange(port, _rpc_request(port, b"{}", cookie=b"d" * 64))).startswith(b"HTTP/1.1 503 ")
    assert rejected == ["busy"] * 2
    for stream in stalled:
        await stream.aclose()
    server.stop()


async def test_idle_connections_in_every_slot_do_not_lock_the_cookie_holder_out(nursery):
    """Every slot, waiting ones included, held by idle connections: a newcomer pushes out the oldest
    waiting one, so the cookie holder is served; the connections it pushed out are closed."""
    server, port, rejected = await _small_server(nursery)
    idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    await _wait_until(lambda: server._connections.taken == 2)
    for _ in range(2):  # one at a time, so that which one is oldest is known
        idle.append(await trio.open_tcp_stream("127.0.0.1", port))
        await _wait_until(lambda: server._waiting.taken == len(idle) - 2)
    answer = await _exchange(port, _rpc_request(port, b'{"jsonrpc":"2.0","id":1,"method":"test.add","params":[1,2]}'))
    assert answer.endswith(b'{"jsonrpc":"2.0","id":1,"result":3}')
    with trio.fail_after(1):  # well before the idle timeout would close it
        assert await idle[2].receive_some(100) == b""  # the oldest waiting one, pushed out
    assert rejected == ["busy"]
    assert server._waiting.taken == 1  # the newer idle one waits on
    for stream in idle:
        await stream.aclose()
    server.stop()


async def _wait_until(condition) -> None:
    """Wait (10 s at most) until `condition()` holds: the server's tasks run on their own schedule."""
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)
