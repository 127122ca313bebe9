"""The data plane: a plain TCP listener beside libp2p whose every byte is sealed (`dataplane_crypto`).

How a connection comes to be::

    asker                                              provider
      | -- libp2p stream /locomesh/ckpt-dataplane/1 -------------------------->  |
      |    ckpt.dataplane-hello{key: X25519 public}, signed                      |  new X25519 key, derive keys,
      | <-- ckpt.dataplane-offer{key, port}, signed ------------------------------|  remember them (pending, 30 s)
      | derive keys; TCP connect to the provider's IP, `port`                     |
      | -- sealed frame 0: HELLO ------------------------------------------------>|  which pending keys open it?
      | <== sealed request/answer frames (the `checkpoint_wire` exchange) =====>  |  that session, used once

The provider finds the session by trying each pending session's key on the
first frame (there are few, and a wrong key fails its tag check at once), so
not even a session ID travels in clear. Before that first frame opens, the
provider reads at most a small frame; afterwards frames are capped at
`MAX_FRAME`. A `SealedStream` has ``read``/``write`` like a libp2p stream, so
the checkpoint protocol runs over it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from locomesh.protocol import ProtocolError, encode
from locomesh.protocol.kinds import CKPT_DATAPLANE_HELLO, CKPT_DATAPLANE_OFFER, MAX_CKPT_PAYLOAD

from .dataplane_crypto import HEADER_SIZE, TAG_SIZE, DataPlaneError, FrameOpener, FrameSealer, SessionKeys, derive_keys, transcript
from .runtime import Node
from .checkpoint_wire import read_signed, remote_peer
from .streams import close_quietly, error_code, write_frame

logger = logging.getLogger(__name__)

HANDSHAKE_PROTOCOL = "/locomesh/ckpt-dataplane/1"
HELLO = b"locomesh/dataplane/hello/v1"
HANDSHAKE_TIMEOUT = 10.0
PENDING_TTL = 30.0
MAX_PENDING = 64
MAX_FRAME = MAX_CKPT_PAYLOAD + 64  # one checkpoint_wire frame: its 4-byte length and the payload
MAX_RECEIVE = 4 * 1024 * 1024

ServeFunction = Callable[["SealedStream", str], Awaitable[None]]


class SealedStream:
    """A byte stream over TCP in which every byte is sealed: ``write`` seals one frame, ``read`` opens them in order.

    A read returns at most the rest of the frame it is in, which is already in
    memory, so reads of any size are cheap (`largest_read`): a frame written by
    one ``write`` is read back as that very bytes object, uncopied.
    """

    largest_read = MAX_FRAME

    def __init__(self, tcp: trio.SocketStream, keys: SessionKeys, *, opener: FrameOpener | None = None) -> None:
        self._tcp = tcp
        self._sealer = FrameSealer(keys.send)
        self._opener = opener or FrameOpener(keys.receive, max_frame=MAX_FRAME)
        self._plain, self._offset = b"", 0

    async def write(self, data: bytes) -> None:
        header, sealed = self._sealer.seal_parts(data)
        await self._tcp.send_all(header)
        await self._tcp.send_all(sealed)

    async def read(self, n: int | None = None) -> bytes:
        """Up to `n` plaintext bytes (all buffered ones if None); b"" at a clean end between frames."""
        while self._offset >= len(self._plain):
            frame = self._opener.next_frame()
            if frame is not None:
                self._plain, self._offset = frame, 0
                continue
            # Never past the frame begun: the opener's buffer then holds one frame and is cleared, not shifted.
            data = await self._tcp.receive_some(min(self._opener.pending_size(), MAX_RECEIVE))
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

    async def close(self) -> None:
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            await self._tcp.aclose()

    reset = close


def _public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# --- asker ---------------------------------------------------------------------------------


async def open_sealed_stream(node: Node, peer_id: str, *, host_hint: str | None = None) -> SealedStream:
    """A data plane stream to `peer_id`: handshake over libp2p, then TCP. Raises `DataPlaneError`,
    `ProtocolError`, `DialError` or `OSError` if the peer has no data plane or it cannot be reached."""
    private = X25519PrivateKey.generate()
    public = _public_bytes(private)
    stream = await node.open_stream(peer_id, [HANDSHAKE_PROTOCOL], timeout=HANDSHAKE_TIMEOUT)
    try:
        hello = encode(node.identity, CKPT_DATAPLANE_HELLO.name, {"key": public})
        await write_frame(stream, hello, timeout=HANDSHAKE_TIMEOUT)
        offer = await read_signed(stream, CKPT_DATAPLANE_OFFER, peer_id, timeout=HANDSHAKE_TIMEOUT)
        remote = stream.get_remote_address()
    finally:
        await close_quietly(stream)
    if offer.body["port"] == 0:
        raise DataPlaneError("unavailable", f"{peer_id} offers no data plane")
    host = remote[0] if remote else host_hint
    if host is None:
        raise DataPlaneError("unavailable", f"no IP address known for {peer_id}")
    salt = transcript(node.peer_id, peer_id, public, offer.body["key"])
    keys = derive_keys(private, offer.body["key"], salt=salt, initiator=True)
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        tcp = await trio.open_tcp_stream(host, offer.body["port"])
    sealed = SealedStream(tcp, keys)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await sealed.write(HELLO)
    except BaseException:
        await sealed.close()
        raise
    return sealed


# --- provider ------------------------------------------------------------------------------


@dataclass
class _Pending:
    keys: SessionKeys
    peer_id: str
    expires: float


class DataPlaneServer:
    """The provider's side: the handshake handler and the TCP listener. `serve(stream, peer_id)` gets
    each authenticated connection."""

    def __init__(self, host: str, serve: ServeFunction) -> None:
        self.host = host
        self.port = 0
        self._serve = serve
        self._pending: list[_Pending] = []
        self._unauthenticated = trio.Semaphore(MAX_PENDING)
        self._node: Node | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on TCP (`host`, a free port), serve handshakes, report started, accept until cancelled."""
        self._node = node
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        node.set_stream_handler(HANDSHAKE_PROTOCOL, self._handshake, timeout=2 * HANDSHAKE_TIMEOUT)
        logger.info("data plane listening on %s:%d", self.host, self.port)
        task_status.started()
        await trio.serve_listeners(self._accept, listeners)

    async def _handshake(self, stream: Any) -> None:
        assert self._node is not None
        peer_id = remote_peer(stream)
        hello = await read_signed(stream, CKPT_DATAPLANE_HELLO, peer_id, timeout=HANDSHAKE_TIMEOUT)
        now = trio.current_time()
        self._pending = [entry for entry in self._pending if entry.expires > now]
        if len(self._pending) >= MAX_PENDING:
            raise ProtocolError("busy", f"{MAX_PENDING} data plane handshakes are pending")
        private = X25519PrivateKey.generate()
        public = _public_bytes(private)
        salt = transcript(peer_id, self._node.peer_id, hello.body["key"], public)
        keys = derive_keys(private, hello.body["key"], salt=salt, initiator=False)
        self._pending.append(_Pending(keys, peer_id, now + PENDING_TTL))
        offer = encode(self._node.identity, CKPT_DATAPLANE_OFFER.name, {"key": public, "port": self.port})
        await write_frame(stream, offer, timeout=HANDSHAKE_TIMEOUT)

    async def _accept(self, tcp: trio.SocketStream) -> None:
        assert self._node is not None
        try:
            session, opener = await self._authenticate(tcp)
            await self._serve(SealedStream(tcp, session.keys, opener=opener), session.peer_id)
        except Exception as error:  # noqa: BLE001 - a bad connection must not take the node down
            code = error_code(error)
            if code == "internal":
                logger.error("data plane connection failed", exc_info=error)
            else:
                logger.info("data plane connection dropped: %s", str(error) or code)
            self._node.count_protocol_error(code)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(HANDSHAKE_TIMEOUT):
                await tcp.aclose()

    async def _authenticate(self, tcp: trio.SocketStream) -> tuple[_Pending, FrameOpener]:
        """Read the first frame and find its session; at most MAX_PENDING connections may be at this step."""
        try:
            self._unauthenticated.acquire_nowait()
        except trio.WouldBlock:
            raise ProtocolError("busy", "too many data plane connections are still unauthenticated") from None
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                return self._claim(await _receive_first_frame(tcp))
        finally:
            self._unauthenticated.release()

    def _claim(self, first: bytes) -> tuple[_Pending, FrameOpener]:
        """The pending session whose key opens `first` to HELLO (removed: a session serves one connection)."""
        for entry in self._pending:
            opener = FrameOpener(entry.keys.receive, max_frame=len(HELLO))
            opener.feed(first)
            try:
                if opener.next_frame() != HELLO:
                    continue
            except DataPlaneError:
                continue
            if entry.expires <= trio.current_time():
                break
            self._pending.remove(entry)
            opener.max_frame = MAX_FRAME
            return entry, opener
        raise DataPlaneError("bad-frame", "the first frame opens under no pending data plane session")


async def _receive_first_frame(tcp: trio.SocketStream) -> bytes:
    """The raw bytes of the first sealed frame, which may be no larger than a sealed HELLO."""
    limit = HEADER_SIZE + len(HELLO) + TAG_SIZE
    data = b""
    while len(data) < HEADER_SIZE or len(data) < HEADER_SIZE + int.from_bytes(data[:HEADER_SIZE], "big"):
        if len(data) >= HEADER_SIZE and HEADER_SIZE + int.from_bytes(data[:HEADER_SIZE], "big") > limit:
            raise DataPlaneError("too-large", "the first data plane frame is larger than a hello")
        more = await tcp.receive_some(limit - len(data))
        if not more:
            raise DataPlaneError("truncated", "the data plane connection ended before its first frame")
        data += more
    return data
