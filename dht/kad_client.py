"""Kademlia requests over kept-open streams: one stream per peer, reused, reset when in doubt.

Why not py-libp2p's own request code: it opens a new stream for every
request, and opening one costs two more round trips (multistream-select
handshake, then the protocol), several times what a request on an open
stream costs (docs/measurements.md). The Kademlia wire protocol allows many
requests on one stream (py-libp2p's server loops reading them until EOF), so
`KadStreamPool` keeps one stream per peer and sends requests on it in turn.

Its rules, each for a reason:

* one request at a time per stream (a lock): responses carry no request ID;
* a request that fails or is cancelled resets and forgets its stream, under
  a shielded, bounded cleanup: a half-read response would poison the next
  request, and a stream left open holds one of the server's few handler
  slots (py-libp2p's server serves at most 12 streams at once by default);
* streams idle for `IDLE_TIMEOUT` seconds are closed by `close_idle`, which
  the owner calls periodically, for the same reason.

`get_value` and `get_providers` parse the answers into plain results and put
the addresses of the closer peers into the peerstore so that a lookup can
dial them next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio
import varint
from libp2p.abc import IHost, INetStream
from libp2p.kad_dht.common import MAX_DHT_MESSAGE_SIZE, PROTOCOL_ID
from libp2p.kad_dht.pb.kademlia_pb2 import Message
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import read_varint_prefixed_bytes_limited
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = 20.0
CLEANUP_TIMEOUT = 1.0
ADDRESS_TTL = 600  # seconds a closer peer's addresses stay in the peerstore
MAX_ADDRS_PER_PEER = 16


class KadRequestError(Exception):
    """A peer did not answer a Kademlia request properly."""


@dataclass
class _Pooled:
    stream: INetStream
    lock: trio.Lock = field(default_factory=trio.Lock)
    last_used: float = 0.0


class KadStreamPool:
    """Requests to peers over reused Kademlia streams. See the module docstring."""

    def __init__(self, host: IHost) -> None:
        self.host = host
        self._streams: dict[ID, _Pooled] = {}

    async def request(self, peer: ID, message: Message) -> Message:
        """Send `message` to `peer` and return its answer; `KadRequestError` if that fails.

        The caller bounds the time (a cancel scope); a cancelled request
        resets its stream so that the next request starts clean.
        """
        pooled = self._streams.get(peer)
        if pooled is not None and not pooled.lock.locked():
            try:
                return await self._exchange(peer, pooled, message)
            except KadRequestError as error:  # a kept stream may have died while idle: one fresh try
                logger.debug("kept Kademlia stream to %s failed (%s); opening a new one", peer, error)
        return await self._exchange(peer, await self._open(peer, keep=peer not in self._streams), message)

    async def _exchange(self, peer: ID, pooled: _Pooled, message: Message) -> Message:
        async with pooled.lock:
            try:
                payload = message.SerializeToString()
                await pooled.stream.write(varint.encode(len(payload)) + payload)
                answer = Message()
                answer.ParseFromString(await read_varint_prefixed_bytes_limited(pooled.stream, MAX_DHT_MESSAGE_SIZE))
            except BaseException as error:
                await self._discard(peer, pooled)
                if isinstance(error, Exception):
                    raise KadRequestError(f"{type(error).__name__}: {error}") from error
                raise
            finally:
                pooled.last_used = trio.current_time()
        if self._streams.get(peer) is not pooled:  # an extra stream for a busy peer: not kept
            await self._discard(peer, pooled)
        return answer

    async def _open(self, peer: ID, *, keep: bool) -> _Pooled:
        try:
            stream = await self.host.new_stream(peer, [PROTOCOL_ID])
        except Exception as error:  # py-libp2p raises many unrelated types here
            raise KadRequestError(f"no stream to {peer}: {error}") from error
        pooled = _Pooled(stream, last_used=trio.current_time())
        if keep:
            self._streams[peer] = pooled
        return pooled

    async def _discard(self, peer: ID, pooled: _Pooled) -> None:
        if self._streams.get(peer) is pooled:
            del self._streams[peer]
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
            try:
                await pooled.stream.reset()
            except Exception as error:  # noqa: BLE001 - the stream is gone either way
                logger.debug("resetting a Kademlia stream to %s failed: %s", peer, error)

    async def close_idle(self, idle: float = IDLE_TIMEOUT) -> None:
        """Close the streams not used for `idle` seconds (and not in use now)."""
        now = trio.current_time()
        for peer, pooled in list(self._streams.items()):
            if now - pooled.last_used >= idle and not pooled.lock.locked():
                del self._streams[peer]
                with trio.move_on_after(CLEANUP_TIMEOUT):
                    try:
                        await pooled.stream.close()
                    except Exception as error:  # noqa: BLE001 - closing a dead stream
                        logger.debug("closing an idle Kademlia stream to %s failed: %s", peer, error)

    def __len__(self) -> int:
        return len(self._streams)

    # --- the requests a lookup makes ------------------------------------------------------

    async def get_value(self, peer: ID, key: bytes) -> tuple[bytes | None, list[ID]]:
        """GET_VALUE: the value `peer` holds for `key` (unchecked: validate it!) and the closer peers it names."""
        answer = await self.request(peer, _message(Message.MessageType.GET_VALUE, key))
        value = answer.record.value if answer.HasField("record") and answer.record.value else None
        return value, self._closer_peers(answer)

    async def get_providers(self, peer: ID, key: bytes) -> tuple[list[PeerInfo], list[ID]]:
        """GET_PROVIDERS: the providers of `key` that `peer` knows, and the closer peers it names."""
        answer = await self.request(peer, _message(Message.MessageType.GET_PROVIDERS, key))
        providers = []
        for entry in answer.providerPeers:
            parsed = _peer_and_addrs(entry)
            if parsed is not None and parsed[1]:
                providers.append(PeerInfo(*parsed))
        return providers, self._closer_peers(answer)

    async def find_node(self, peer: ID, key: bytes) -> list[ID]:
        """FIND_NODE: the peers closest to `key` that `peer` knows (their addresses go into the peerstore)."""
        return self._closer_peers(await self.request(peer, _message(Message.MessageType.FIND_NODE, key)))

    def _closer_peers(self, answer: Message) -> list[ID]:
        closer = []
        own = self.host.get_id()
        for entry in answer.closerPeers:
            parsed = _peer_and_addrs(entry)
            if parsed is None or parsed[0] == own:
                continue
            peer, addrs = parsed
            if addrs:
                self.host.get_peerstore().add_addrs(peer, addrs, ADDRESS_TTL)
            closer.append(peer)
        return closer


def _message(kind: int, key: bytes) -> Message:
    message = Message()
    message.type = kind
    message.key = key
    return message


def _peer_and_addrs(entry: Message.Peer) -> tuple[ID, list[Multiaddr]] | None:
    """A peer entry's ID and parseable addresses, or None for an entry without a valid ID."""
    try:
        peer = ID(entry.id)
        peer.to_base58()
    except Exception:  # noqa: BLE001 - a malformed ID from a peer: skip the entry
        return None
    addrs = []
    for raw in entry.addrs[:MAX_ADDRS_PER_PEER]:
        try:
            addrs.append(Multiaddr(raw))
        except Exception:  # noqa: BLE001 - a malformed address: skip it
            continue
    return peer, addrs
