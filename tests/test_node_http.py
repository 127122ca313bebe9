"""The sans-IO HTTP/1.1 request parser: what it accepts, what it refuses, and that it never crashes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from locomesh.node.rpc.http11 import HttpError, RequestParser, State, render_response


def feed(data: bytes, **limits) -> RequestParser:
    parser = RequestParser(**limits)
    parser.receive_data(data)
    return parser


def test_parses_a_post_with_a_body():
    parser = feed(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nAuthorization: Bearer abc\r\n\r\nhello")
    request = parser.next_request()
    assert request.method == "POST" and request.target == "/" and request.version == (1, 1)
    assert request.body == b"hello"
    assert request.headers["authorization"] == "Bearer abc"
    assert request.keep_alive
    assert parser.state is State.DONE


def test_waits_for_the_whole_body_then_serves_pipelined_requests():
    parser = RequestParser()
    parser.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
    assert parser.next_request() is None
    parser.receive_data(b"cdGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert parser.next_request().body == b"abcd"
    assert parser.next_request() is None  # DONE until the answer went out
    parser.start_next()
    second = parser.next_request()
    assert second.target == "/metrics" and not second.keep_alive


def test_clean_end_of_stream_between_requests_is_not_an_error():
    parser = RequestParser()
    parser.receive_data(b"")
    assert parser.next_request() is None
    assert parser.state is State.CLOSED


def test_http_1_0_closes_unless_asked_to_keep_alive():
    assert not feed(b"GET /metrics HTTP/1.0\r\n\r\n").next_request().keep_alive
    assert feed(b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").next_request().keep_alive


@pytest.mark.parametrize(
    "data, status",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20_000, 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 70 + b"\r\n", 431),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET / FTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /\r\nHost: x\r\n\r\n", 400),
        (b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400),
    ],
)
def test_refuses_bad_requests_with_the_right_status(data, status):
    parser = feed(data)
    with pytest.raises(HttpError) as caught:
        parser.next_request()
    assert caught.value.status == status
    with pytest.raises(HttpError):  # and keeps refusing: the connection is done
        parser.next_request()
    assert parser.state is State.ERROR


@pytest.mark.parametrize(
    "data", [b"GET / HTTP/1.1\r\nHo", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc"]
)
def test_end_of_stream_inside_a_request_is_an_error(data):
    parser = feed(data)
    assert parser.next_request() is None
    parser.receive_data(b"")
    with pytest.raises(HttpError) as caught:
        parser.next_request()
    assert caught.value.status == 400


def test_limits_are_configurable():
    with pytest.raises(HttpError) as caught:
        feed(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n", max_body=10).next_request()
    assert caught.value.status == 413


def test_render_response():
    assert render_response(200, b"{}", keep_alive=False) == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{}"
    )
    no_content = render_response(204, b"")
    assert no_content.startswith(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: keep-alive")


_head_lines = st.lists(
    st.sampled_from([b"Host: x", b"Content-Length: 3", b"Connection: close", b"X-Y: z", b"", b"Content-Length: x"]),
    max_size=6,
)


@given(
    chunks=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.builds(lambda lines: b"\r\n".join([b"POST / HTTP/1.1", *lines]) + b"\r\n\r\n", _head_lines),
        ),
        max_size=8,
    ),
    eof=st.booleans(),
)
def test_random_bytes_give_requests_or_http_errors_only(chunks, eof):
    parser = RequestParser(max_head=256, max_body=64)
    try:
        for chunk in chunks + ([b""] if eof else []):
            parser.receive_data(chunk)
            while (request := parser.next_request()) is not None:
                assert len(request.body) <= 64
                parser.start_next()
            if parser.state is State.CLOSED:
                break
    except HttpError as error:
        assert 400 <= error.status < 600
        assert parser.state is State.ERROR
    assert parser.buffered <= sum(len(chunk) for chunk in chunks)
