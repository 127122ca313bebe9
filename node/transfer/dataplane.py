"""The data plane: a plain TCP listener beside libp2p whose every byte is sealed (`dataplane_crypto`).

How a connection comes to be::

    asker                                              provider
      | -- libp2p stream /locomesh/ckpt-dataplane/2 -------------------------->  |
      |    ckpt.dataplane-hello{key: X25519 public}, signed                      |  new X25519 key, derive keys,
      | <-- ckpt.dataplane-offer{key, port}, signed ------------------------------|  remember them (pending, 15 s)
      | derive keys; TCP connect to the provider's IP, `port`                     |
      | -- sealed frame 0: HELLO ------------------------------------------------>|  which pending keys open it?
      | <-- sealed frame 0: READY ------------------------------------------------|  that session, used once
      | <== sealed request/answer frames (the `wire` exchange) =====>  |

The provider finds the session by trying each pending session's key on the
first frame (there are few, and a wrong key fails its tag check at once), so
not even a session ID travels in clear. The asker sends no request before
READY has opened under the session's keys: only then is it talking to the
peer it did the handshake with.

Everything a peer can make either side hold is capped (`dataplane_sessions`):
a frame is refused from its 4-byte header when it is larger than what may
come next (a hello, a READY, a request; on the asker's side a reply no larger
than the one announced, set by `streams.read_frame`), before a byte of it is
buffered; unauthenticated connections have `FIRST_FRAME_TIMEOUT` to send
their hello and are capped per source address and in all, newcomers pushing
out the oldest; pending and authenticated sessions are capped per peer and in
all. Refusals are counted as protocol errors, and a peer whose authenticated
connection sends an oversized or unopenable frame is struck (`PeerScores`).
A `SealedStream` has ``read``/``write`` like a libp2p stream, so the
checkpoint protocol runs over it unchanged. Its socket is held to the node's
upload and download caps, the same buckets as its libp2p connections
(`locomesh.node.bandwidth`): a frame goes out slice by slice, and reads wait
for their turn (TCP's flow control slows the sender).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from locomesh.protocol import Envelope, encode
from locomesh.protocol.kinds import CKPT_DATAPLANE_HELLO, CKPT_DATAPLANE_OFFER, MAX_CKPT_PAYLOAD

from locomesh.node.bandwidth import SLICE, Bandwidth, TokenBucket, slices
from locomesh.node.transfer.wire import read_signed, remote_peer
from locomesh.node.transfer.dataplane_crypto import (
    HEADER_SIZE, TAG_SIZE, DataPlaneError, FrameOpener, FrameSealer, SessionKeys, derive_keys, transcript,
)
from locomesh.node.transfer.dataplane_sessions import (
    ANSWER_FRAME, FIRST_FRAME, FIRST_FRAME_TIMEOUT, HELLO, READY, REQUEST_FRAME, SessionTable,
    UnauthenticatedConnections, source_of,
)
from locomesh.node.peer_scores import PeerScores
from locomesh.node.runtime import Node
from locomesh.node.streams import NOT_PROTOCOL_ERRORS, close_quietly, error_code, write_frame

logger = logging.getLogger(__name__)

HANDSHAKE_PROTOCOL = "/locomesh/ckpt-dataplane/2"  # 2: the provider answers the hello before any request
HANDSHAKE_TIMEOUT = 10.0
MAX_FRAME = MAX_CKPT_PAYLOAD + 64  # the largest frame there can be: one `wire` frame, length and payload
MAX_RECEIVE = 4 * 1024 * 1024
# Frames an authenticated connection's peer is struck for; the header is authenticated only with its frame,
# but no honest peer sends either, and a peer is only known once its connection has proved its keys.
_STRUCK = frozenset({"too-large", "bad-frame"})

ServeFunction = Callable[["SealedStream", str], Awaitable[None]]


class SealedStream:
    """A byte stream over TCP in which every byte is sealed: ``write`` seals one frame, ``read`` opens them in order.

    A read returns at most the rest of the frame it is in, which is already in
    memory, so reads of any size are cheap (`largest_read`): a frame written by
    one ``write`` is read back as that very bytes object, uncopied. A frame
    whose plaintext would be over `max_frame` bytes (see `limit_frames`) is
    refused from its header, before any of it is buffered. `bandwidth`: the node's caps (none if None).
    """

    largest_read = MAX_FRAME

    def __init__(
        self, tcp: trio.SocketStream, keys: SessionKeys, *, opener: FrameOpener | None = None,
        max_frame: int = REQUEST_FRAME, bandwidth: Bandwidth | None = None,
    ) -> None:
        self._tcp = tcp
        self._bandwidth = bandwidth or Bandwidth()
        self._sealer = FrameSealer(keys.send)
        self._opener = opener or FrameOpener(keys.receive, max_frame=max_frame)
        self._plain, self._offset = b"", 0

    def limit_frames(self, max_frame: int) -> None:
        """Refuse every frame opened from now on whose plaintext is over `max_frame` bytes.
        `streams.read_frame` calls it with the largest frame it will accept next."""
        self._opener.max_frame = max_frame

    async def write(self, data: bytes) -> None:
        header, sealed = self._sealer.seal_parts(data)
        await _paced_send(self._tcp, header, self._bandwidth.upload)
        await _paced_send(self._tcp, sealed, self._bandwidth.upload)

    async def read(self, n: int | None = None) -> bytes:
        """Up to `n` plaintext bytes (all buffered ones if None); b"" at a clean end between frames."""
        while self._offset >= len(self._plain):
            frame = self._opener.next_frame()
            if frame is not None:
                self._plain, self._offset = frame, 0
                continue
            # Never past the frame begun: the opener's buffer then holds one frame and is cleared, not shifted.
            # (`pending_size` refuses a frame over the cap as soon as its header is in.)
            data = await self._paced_receive(min(self._opener.pending_size(), MAX_RECEIVE))
            if not data:
                if self._opener.pending_size() != HEADER_SIZE:
                    raise DataPlaneError("truncated", "the data plane connection ended inside a frame")
                return b""
            self._opener.feed(data)
        end = len(self._plain) if n is None else self._offset + n
        chunk = self._plain[self._offset : end]
        self._offset += len(chunk)
        if self._offset >= len(self._plain):  # all read: an idle stream holds no frame (they run to 4 MiB)
            self._plain, self._offset = b"", 0
        return chunk

    async def _paced_receive(self, size: int) -> bytes:
        download = self._bandwidth.download
        if download.capped:
            await download.wait_ready()
            size = min(size, SLICE)
        data = await self._tcp.receive_some(size)
        download.charge(len(data))
        return data

    async def close(self) -> None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            await self._tcp.aclose()

    reset = close


async def _paced_send(tcp: trio.SocketStream, data: bytes, upload: TokenBucket) -> None:
    """`data` on `tcp`, slice by slice at `upload`'s rate (in one piece when it has no cap). A cancel
    between slices leaves a torn frame: the stream is then reset, never reused (`stream_pool`)."""
    if not upload.capped:
        await upload.take(len(data))
        await tcp.send_all(data)
        return
    for piece in slices(data):
        await upload.take(len(piece))
        await tcp.send_all(piece)


def _public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# --- asker ---------------------------------------------------------------------------------


async def open_sealed_stream(node: Node, peer_id: str, *, host_hint: str | None = None) -> SealedStream:
    """A data plane stream to `peer_id`, its READY answer checked: handshake over libp2p, then TCP.
    Raises `DataPlaneError`, `ProtocolError`, `DialError`, `OSError`, `trio.TooSlowError` or a
    broken-stream error if the peer has no data plane, refuses, or it cannot be reached."""
    private = X25519PrivateKey.generate()
    public = _public_bytes(private)
    offer, remote = await _handshake(node, peer_id, public)
    if offer.body["port"] == 0:
        raise DataPlaneError("unavailable", f"{peer_id} offers no data plane")
    host = remote[0] if remote else host_hint
    if host is None:
        raise DataPlaneError("unavailable", f"no IP address known for {peer_id}")
    salt = transcript(node.peer_id, peer_id, public, offer.body["key"])
    keys = derive_keys(private, offer.body["key"], salt=salt, initiator=True)
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        tcp = await trio.open_tcp_stream(host, offer.body["port"])
    sealed = SealedStream(tcp, keys, max_frame=ANSWER_FRAME, bandwidth=node.meter.bandwidth)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await sealed.write(HELLO)
            await _expect_ready(sealed, peer_id)
    except BaseException:
        await sealed.close()
        raise
    return sealed


async def _handshake(node: Node, peer_id: str, public: bytes) -> tuple[Envelope, Any]:
    """Our hello and the provider's offer on a libp2p stream; the offer and the provider's address."""
    stream = await node.open_stream(peer_id, [HANDSHAKE_PROTOCOL], timeout=HANDSHAKE_TIMEOUT)
    try:
        hello = encode(node.identity, CKPT_DATAPLANE_HELLO.name, {"key": public})
        await write_frame(stream, hello, timeout=HANDSHAKE_TIMEOUT)
        offer = await read_signed(stream, CKPT_DATAPLANE_OFFER, peer_id, timeout=HANDSHAKE_TIMEOUT)
        return offer, stream.get_remote_address()
    finally:
        await close_quietly(stream)


async def _expect_ready(sealed: SealedStream, peer_id: str) -> None:
    """The provider's first frame, which must open to READY under the session's keys."""
    try:
        answer = await sealed.read()
    except DataPlaneError as error:
        raise DataPlaneError("bad-answer", f"{peer_id} did not answer the data plane hello: {error.reason}") from None
    if not answer:
        raise DataPlaneError("refused", f"{peer_id} closed the data plane connection without answering")
    if answer != READY:
        raise DataPlaneError("bad-answer", f"{peer_id} answered the data plane hello with something else")


# --- provider ------------------------------------------------------------------------------


class DataPlaneServer:
    """The provider's side: the handshake handler and the TCP listener. `serve(stream, peer_id)` gets
    each authenticated connection; `scores` (if given) is where its peer is struck for bad frames."""

    def __init__(self, host: str, serve: ServeFunction, *, scores: PeerScores | None = None) -> None:
        self.host = host
        self.port = 0
        self.scores = scores
        self.sessions = SessionTable()
        self.unauthenticated = UnauthenticatedConnections()
        self.sessions_served = 0  # connections that proved their keys and were answered READY
        self._serve = serve
        self._node: Node | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on TCP (`host`, a free port), serve handshakes, report started, accept until cancelled."""
        self._node = node
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        node.metrics.counter("locomesh_dataplane_sessions_total", "Data plane connections that proved their keys.",
                             value=lambda: self.sessions_served)
        node.set_stream_handler(HANDSHAKE_PROTOCOL, self._handshake, timeout=2 * HANDSHAKE_TIMEOUT)
        logger.info("data plane listening on %s:%d", self.host, self.port)
        task_status.started()
        await trio.serve_listeners(self._accept, listeners)

    async def _handshake(self, stream: Any) -> None:
        """Agree session keys with the peer and offer our port; `DataPlaneError("busy")` (the stream is
        reset, the refusal counted) when the peer already holds all the sessions it may."""
        assert self._node is not None
        peer_id = remote_peer(stream)
        hello = await read_signed(stream, CKPT_DATAPLANE_HELLO, peer_id, timeout=HANDSHAKE_TIMEOUT)
        private = X25519PrivateKey.generate()
        public = _public_bytes(private)
        salt = transcript(peer_id, self._node.peer_id, hello.body["key"], public)
        keys = derive_keys(private, hello.body["key"], salt=salt, initiator=False)
        if self.sessions.offer(peer_id, keys, trio.current_time()) is not None:
            self._node.count_protocol_error("pending-evicted")
        offer = encode(self._node.identity, CKPT_DATAPLANE_OFFER.name, {"key": public, "port": self.port})
        await write_frame(stream, offer, timeout=HANDSHAKE_TIMEOUT)

    async def _accept(self, tcp: trio.SocketStream) -> None:
        """One TCP connection, from its first frame to its end; nothing it does escapes."""
        assert self._node is not None
        peer_id = None
        try:
            claimed = await self._authenticate(tcp)
            if claimed is not None:
                peer_id, keys, opener = claimed
                try:
                    sealed = SealedStream(tcp, keys, opener=opener, bandwidth=self._node.meter.bandwidth)
                    await self._serve_session(sealed, peer_id)
                finally:
                    self.sessions.end(peer_id)
        except Exception as error:  # noqa: BLE001 - a bad connection must not take the node down
            self._refused(error, peer_id)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(HANDSHAKE_TIMEOUT):
                await tcp.aclose()

    async def _authenticate(self, tcp: trio.SocketStream) -> tuple[str, SessionKeys, FrameOpener] | None:
        """The session `tcp`'s first frame opens (see `SessionTable.claim`), read within
        FIRST_FRAME_TIMEOUT while it counts among the unauthenticated connections; None if it was
        closed to make room for a newer one, or had already gone."""
        assert self._node is not None
        source = _source(tcp)
        if source is None:
            return None
        with trio.CancelScope() as scope:
            evicted = self.unauthenticated.admit(scope, source)
            if evicted is not None:
                evicted.cancel()  # that connection's task closes it at once
            try:
                with trio.fail_after(FIRST_FRAME_TIMEOUT):
                    first = await _receive_first_frame(tcp)
            finally:
                self.unauthenticated.release(scope)
            return self.sessions.claim(first, trio.current_time())
        self._node.count_protocol_error("evicted")
        return None

    async def _serve_session(self, sealed: SealedStream, peer_id: str) -> None:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await sealed.write(READY)
        self.sessions_served += 1
        await self._serve(sealed, peer_id)

    def _refused(self, error: Exception, peer_id: str | None) -> None:
        """Log and count why a connection was dropped; strike its peer, if known, for a bad frame."""
        assert self._node is not None
        code = error_code(error)
        if code == "internal":
            logger.error("data plane connection failed", exc_info=error)
        else:  # a fetcher that hung up is normal: worth a line only when debugging
            level = logging.DEBUG if code in NOT_PROTOCOL_ERRORS else logging.INFO
            logger.log(level, "data plane connection%s dropped: %s", f" of {peer_id}" if peer_id else "", str(error) or code)
        self._node.count_protocol_error(code)
        if peer_id is not None and code in _STRUCK and self.scores is not None:
            self.scores.strike(peer_id, f"data plane: {error}")


def _source(tcp: trio.SocketStream) -> str | None:
    """The source address `tcp` counts under (`source_of`), or None if it is already gone."""
    try:
        return source_of(tcp.socket.getpeername()[0])
    except OSError:
        return None


async def _receive_first_frame(tcp: trio.SocketStream) -> bytes:
    """The raw bytes of the first sealed frame, which may be no larger than a sealed HELLO."""
    limit = HEADER_SIZE + FIRST_FRAME + TAG_SIZE
    data = b""
    while len(data) < HEADER_SIZE or len(data) < HEADER_SIZE + int.from_bytes(data[:HEADER_SIZE], "big"):
        if len(data) >= HEADER_SIZE and HEADER_SIZE + int.from_bytes(data[:HEADER_SIZE], "big") > limit:
            raise DataPlaneError("too-large", "the first data plane frame is larger than a hello")
        more = await tcp.receive_some(limit - len(data))
        if not more:
            raise DataPlaneError("truncated", "the data plane connection ended before its first frame")
        data += more
    return data
