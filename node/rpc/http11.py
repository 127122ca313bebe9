"""A small, strict HTTP/1.1 request parser (sans-IO) and response writer, for the local RPC.

Theory of operation
-------------------
The parser is fed bytes (`receive_data`, ``b""`` meaning end of stream) and
asked for the next complete request (`next_request`), in the manner of h11.
It never touches a socket and never blocks, so the same code is driven by the
trio server, by unit tests and by a fuzzer. It understands exactly what the
RPC needs: a request line, headers, and a body whose size ``Content-Length``
gives. Anything else is refused with an `HttpError` carrying the status to
answer with, after which the connection is closed:

* a request head over `max_head` bytes (431) or with over `max_headers` fields (431);
* a body over `max_body` bytes (413), announced before any of it is read;
* ``Transfer-Encoding`` (chunked bodies are not needed here: 501);
* bare LF line ends, header folding, a malformed request line or field, a
  missing or repeated ``Content-Length`` or ``Host`` where it matters (400);
* a version other than HTTP/1.0 or HTTP/1.1 (505);
* the stream ending in the middle of a request (400).

After a request is returned the parser waits in ``DONE`` until the server has
answered and calls `start_next` (keep-alive: bytes of a pipelined next
request stay buffered meanwhile).

States and transitions
----------------------
=========  =====================================================  ==========
state      event                                                  next state
=========  =====================================================  ==========
HEAD       head complete, no body                                 DONE  (request returned)
HEAD       head complete, Content-Length n > 0                    BODY
HEAD       end of stream before any byte                          CLOSED
HEAD       head too large, malformed, or stream ends inside it    ERROR (HttpError)
BODY       n bytes of body buffered                               DONE  (request returned)
BODY       end of stream first                                    ERROR (HttpError)
DONE       start_next()                                           HEAD
ERROR      any call                                               ERROR (same HttpError again)
=========  =====================================================  ==========
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD = 16 * 1024
MAX_BODY = 1024 * 1024
MAX_HEADERS = 64

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TARGET = re.compile(rb"^/[\x21-\x7e]*$")
_VERSIONS = {b"HTTP/1.1": (1, 1), b"HTTP/1.0": (1, 0)}
_FIELD_VALUE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")


class HttpError(Exception):
    """A request we will not serve; `status` is the HTTP status to answer with, then close."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: tuple[int, int]
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes

    @property
    def keep_alive(self) -> bool:
        connection = {token.strip() for token in self.headers.get("connection", "").lower().split(",")}
        if self.version >= (1, 1):
            return "close" not in connection
        return "keep-alive" in connection


class State(enum.Enum):
    HEAD = "head"
    BODY = "body"
    DONE = "done"
    CLOSED = "closed"
    ERROR = "error"


class RequestParser:
    """Bytes in, `Request`s out. See the module docstring for the state table."""

    def __init__(self, *, max_head: int = MAX_HEAD, max_body: int = MAX_BODY, max_headers: int = MAX_HEADERS) -> None:
        self.max_head = max_head
        self.max_body = max_body
        self.max_headers = max_headers
        self.state = State.HEAD
        self._buffer = bytearray()
        self._eof = False
        self._error: HttpError | None = None
        self._head: tuple[str, str, tuple[int, int], dict[str, str]] | None = None
        self._body_size = 0

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the client; ``b""`` means the client closed its side."""
        if data:
            if self._eof:
                raise RuntimeError("data after end of stream")
            self._buffer += data
        else:
            self._eof = True

    def next_request(self) -> Request | None:
        """The next complete request, or None if more bytes are needed (or the stream closed cleanly).

        Raises `HttpError` for a request that breaks the rules above, and keeps
        raising it: the connection is done.
        """
        if self._error is not None:
            raise self._error
        try:
            return self._advance()
        except HttpError as error:
            self.state, self._error = State.ERROR, error
            raise

    def start_next(self) -> None:
        """The answer to the last request was sent: look for the next one."""
        if self.state is not State.DONE:
            raise RuntimeError(f"start_next() in state {self.state.name}")
        self.state = State.HEAD

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _advance(self) -> Request | None:
        if self.state is State.HEAD:
            self._parse_head()
        if self.state is State.BODY:
            return self._take_body()
        return None

    def _parse_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n", 0, self.max_head + 4)
        if end < 0:
            if len(self._buffer) > self.max_head:
                raise HttpError(431, f"request head is over {self.max_head} bytes")
            if self._eof:
                if self._buffer:
                    raise HttpError(400, "connection closed inside a request head")
                self.state = State.CLOSED
            return
        head = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        self._head = self._parse_head_bytes(head)
        self._body_size = _content_length(self._head[3], self.max_body)
        self.state = State.BODY

    def _take_body(self) -> Request | None:
        if len(self._buffer) < self._body_size:
            if self._eof:
                raise HttpError(400, "connection closed inside a request body")
            return None
        body = bytes(self._buffer[: self._body_size])
        del self._buffer[: self._body_size]
        assert self._head is not None
        method, target, version, headers = self._head
        self._head, self.state = None, State.DONE
        return Request(method, target, version, headers, body)

    def _parse_head_bytes(self, head: bytes) -> tuple[str, str, tuple[int, int], dict[str, str]]:
        lines = head.split(b"\r\n")
        if any(b"\n" in line or b"\r" in line for line in lines):
            raise HttpError(400, "lines must end in CRLF")
        method, target, version = _request_line(lines[0])
        fields = lines[1:]
        if len(fields) > self.max_headers:
            raise HttpError(431, f"over {self.max_headers} header fields")
        headers: dict[str, str] = {}
        for line in fields:
            name, value = _header_field(line)
            if name in headers:
                if name in ("content-length", "host", "authorization"):
                    raise HttpError(400, f"repeated {name} header")
                value = f"{headers[name]}, {value}"
            headers[name] = value
        if version >= (1, 1) and "host" not in headers:
            raise HttpError(400, "HTTP/1.1 request without a Host header")
        return method, target, version, headers


def _request_line(line: bytes) -> tuple[str, str, tuple[int, int]]:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise HttpError(400, "malformed method")
    if not _TARGET.match(target):
        raise HttpError(400, "request target must be an absolute path")
    if version not in _VERSIONS:
        if version.startswith(b"HTTP/"):
            raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")
        raise HttpError(400, "malformed HTTP version")
    return method.decode("ascii"), target.decode("ascii"), _VERSIONS[version]


def _header_field(line: bytes) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise HttpError(400, "folded header lines are not accepted")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.match(name):
        raise HttpError(400, "malformed header field")
    value = value.strip(b" \t")
    if not _FIELD_VALUE.match(value):
        raise HttpError(400, "control characters in a header value")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _content_length(headers: dict[str, str], max_body: int) -> int:
    if "transfer-encoding" in headers:
        raise HttpError(501, "Transfer-Encoding is not supported; send Content-Length")
    text = headers.get("content-length", "0")
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise HttpError(400, "malformed Content-Length")
    size = int(text)
    if size > max_body:
        raise HttpError(413, f"body of {size} bytes is over {max_body}")
    return size


def render_response(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    keep_alive: bool = True,
    extra_headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The bytes of one HTTP/1.1 response."""
    reason = HTTPStatus(status).phrase
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    if body:
        lines.append(f"Content-Type: {content_type}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    lines.extend(f"{name}: {value}" for name, value in extra_headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
