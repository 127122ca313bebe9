"""A minimal HTTP/1.1 client for talking to a home gateway (UPnP IGD): one request per connection.

Sans-IO part: `render_request` writes a request (always ``Connection:
close``); `parse_response` reads the bytes received so far and returns the
response once complete, None while more is needed, or raises `MappingError`
(``bad-reply`` for a malformed response, ``too-large`` past the caps). The
body is delimited by ``Content-Length``, by chunked transfer coding (common
on routers), or by the end of the stream. Re-parsing the buffer on every
read costs little at the small caps used here (a few tens of KiB).

Trio part: `request` opens a TCP connection to an IP literal from an
``http://`` URL (no DNS: a gateway names itself by address), sends, and
reads until the response is complete, all within one `timeout`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from locomesh.node.nat.mapping_errors import MappingError

MAX_HEAD = 8 * 1024
MAX_BODY = 64 * 1024
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,8})(?:;[^\r\n]*)?$")


@dataclass(frozen=True)
class Url:
    host: str  # an IP address
    port: int
    target: str  # path and query, at least "/"

    @classmethod
    def parse(cls, text: str) -> Url:
        """An ``http://<ip>[:port]/path`` URL, or `MappingError` ``bad-reply``."""
        try:
            parts = urlsplit(text)
            port = parts.port or 80
            host = str(ipaddress.ip_address(parts.hostname or ""))
        except ValueError:
            raise MappingError("bad-reply", f"not an http://<ip>/ URL: {text[:120]!r}") from None
        if parts.scheme != "http" or parts.username or parts.password:
            raise MappingError("bad-reply", f"not an http://<ip>/ URL: {text[:120]!r}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if not target.startswith("/") or any(ord(char) < 0x21 or ord(char) > 0x7E for char in target):
            raise MappingError("bad-reply", f"bad path in URL {text[:120]!r}")
        return cls(host=host, port=port, target=target)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.target}"


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes


def render_request(method: str, url: Url, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    host = f"[{url.host}]" if ":" in url.host else url.host
    lines = [f"{method} {url.target} HTTP/1.1", f"Host: {host}:{url.port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_response(data: bytes, *, eof: bool, max_body: int = MAX_BODY) -> HttpResponse | None:
    """The complete response in `data`, None if more bytes are needed (and may come), else `MappingError`."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0 or head_end > MAX_HEAD:
        if len(data) > MAX_HEAD:
            raise MappingError("too-large", f"HTTP response head over {MAX_HEAD} bytes")
        return _incomplete(eof)
    status, headers = _parse_head(data[:head_end])
    rest = data[head_end + 4 :]
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(rest, max_body)
    elif "content-length" in headers:
        length = _content_length(headers["content-length"], max_body)
        body = rest[:length] if len(rest) >= length else None
    else:
        if len(rest) > max_body:
            raise MappingError("too-large", f"HTTP body over {max_body} bytes")
        body = rest if eof else None
    if body is None:
        return _incomplete(eof)
    return HttpResponse(status=status, headers=headers, body=body)


def _incomplete(eof: bool) -> None:
    if eof:
        raise MappingError("bad-reply", "the HTTP response ended early")
    return None


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.split(b"\r\n")
    match = _STATUS_LINE.match(lines[0])
    if match is None:
        raise MappingError("bad-reply", f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b"\n" in line:
            raise MappingError("bad-reply", f"malformed HTTP header line {line[:80]!r}")
        key, text = name.decode("latin-1").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(match.group(1)), headers


def _content_length(text: str, max_body: int) -> int:
    if not text.isdigit() or len(text) > 12:
        raise MappingError("bad-reply", f"bad Content-Length {text[:40]!r}")
    if int(text) > max_body:
        raise MappingError("too-large", f"HTTP body of {text} bytes, over {max_body}")
    return int(text)


def _dechunk(data: bytes, max_body: int) -> bytes | None:
    """The body of a complete chunked message in `data`; None if incomplete (trailers are skipped)."""
    body, at = bytearray(), 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            if len(data) - at > 80:
                raise MappingError("bad-reply", "chunk size line too long")
            return None
        match = _CHUNK_SIZE.match(data[at:line_end])
        if match is None:
            raise MappingError("bad-reply", f"bad chunk size line {data[at:line_end][:40]!r}")
        size, at = int(match.group(1), 16), line_end + 2
        if size == 0:
            return bytes(body) if data.find(b"\r\n\r\n", at - 2) >= 0 else None
        if len(body) + size > max_body:
            raise MappingError("too-large", f"chunked HTTP body over {max_body} bytes")
        if len(data) < at + size + 2:
            return None
        if data[at + size : at + size + 2] != b"\r\n":
            raise MappingError("bad-reply", "a chunk does not end in CRLF")
        body += data[at : at + size]
        at += size + 2


async def request(
    method: str, url: Url, *, headers: dict[str, str] | None = None, body: bytes = b"", timeout: float,
    max_body: int = MAX_BODY,
) -> HttpResponse:
    """One request and its response, within `timeout` seconds, or `MappingError`."""
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(url.host, url.port)
        except OSError as error:
            raise MappingError("no-gateway", f"cannot connect to {url}: {error}") from None
        async with stream:
            try:
                await stream.send_all(render_request(method, url, headers, body))
                return await _receive_response(stream, max_body)
            except (OSError, trio.BrokenResourceError) as error:
                raise MappingError("no-gateway", f"connection to {url} failed: {error}") from None
    raise MappingError("timeout", f"no complete HTTP response from {url} within {timeout} s")


async def _receive_response(stream: trio.SocketStream, max_body: int) -> HttpResponse:
    buffer = bytearray()
    while True:
        data = await stream.receive_some(16 * 1024)
        buffer += data
        response = parse_response(bytes(buffer), eof=not data, max_body=max_body)
        if response is not None:
            return response
        if len(buffer) > MAX_HEAD + 2 * max_body:  # chunk framing included, with room to spare
            raise MappingError("too-large", f"HTTP response over {len(buffer)} bytes")
