"""The JSON-RPC dispatcher (malformed input → the right error code) and the metrics registry."""

from __future__ import annotations

import json
import math

import pytest

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


def test_metrics_render_in_the_prometheus_text_format():
    metrics = Metrics()
    requests = metrics.counter("x_requests_total", "Requests.", labels=("method",))
    metrics.gauge("x_up", "Up?\nreally", value=lambda: 1)
    level = metrics.gauge("x_level", "Level.")
    requests.inc(method='we"ird\\')
    requests.inc(2, method="a")
    level.set(math.inf)
    assert metrics.render() == (
        "# HELP x_requests_total Requests.\n"
        "# TYPE x_requests_total counter\n"
        'x_requests_total{method="a"} 2\n'
        'x_requests_total{method="we\\"ird\\\\"} 1\n'
        "# HELP x_up Up?\\nreally\n"
        "# TYPE x_up gauge\n"
        "x_up 1\n"
        "# HELP x_level Level.\n"
        "# TYPE x_level gauge\n"
        "x_level +Inf\n"
    )


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


async def test_the_rpc_server_over_real_sockets(nursery):
    import trio

    from locomesh.node.rpc.server import RpcServer

    dispatcher, _ = make_dispatcher()
    rejected: list[str] = []
    server = RpcServer(
        dispatcher, cookie="c" * 64, render_metrics=lambda: "m 1\n", on_reject=rejected.append, max_connections=2
    )
    port = await nursery.start(server.run)
    auth = b"Authorization: Bearer " + b"c" * 64 + b"\r\n"
    host = b"Host: 127.0.0.1:%d\r\n" % port

    async def exchange(request: bytes) -> bytes:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(request)
            with trio.fail_after(10):
                return await stream.receive_some(65536)

    notification = b'{"jsonrpc":"2.0","method":"test.add","params":[1]}'
    head = b"POST / HTTP/1.1\r\n" + host + auth + b"Content-Length: %d\r\n\r\n" % len(notification)
    answer = await exchange(head + notification)
    assert answer.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert (await exchange(b"GET / HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 405 ")
    assert (await exchange(b"POST /metrics HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 405 ")
    assert (await exchange(b"GET /metrics HTTP/1.1\r\n" + host + b"\r\n")).endswith(b"\r\n\r\nm 1\n")

    stalled = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    for stream in stalled:
        await stream.send_all(b"POST / HTTP/1.1\r\n")
    await trio.sleep(0.1)
    assert (await exchange(b"GET /metrics HTTP/1.1\r\n" + host + b"\r\n")).startswith(b"HTTP/1.1 503 ")
    assert rejected == ["busy"]
    for stream in stalled:
        await stream.aclose()
    server.stop()
