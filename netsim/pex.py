"""Peer exchange: how a simulated node finds others, off a few public bootstrap nodes.

A node opens a stream to a bootstrap node and sends
``{"want": k, "listen": "ip:port"}``. The bootstrap answers
``{"you": "ip:port", "peers": [[peer_id, observed, listen], ...]}``: the
address it saw the asker connect from (behind a NAT: the NAT's public
ip:port for that flow) and up to `k` peers it heard from before, each with
the address it observed for them and the one they say they listen on. Then
it remembers the asker. This is what Identify's observed address plus a
rendezvous point give a real node, in one round trip.

An asker whose observed IP equals a peer's observed IP sits behind the same
NAT as that peer, and dials its (private) listen address instead: NATs here
do not hairpin (see `nat.py`).
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from functools import lru_cache

from libp2p.abc import INetStream
from libp2p.peer.id import ID

from locomesh.node.streams import read_frame, write_frame
from locomesh.protocol import ProtocolError, pack

from .node import STREAM_TIMEOUT, SimNode
from .pipe import Endpoint
from .wire import decode_map, expect_list

PEX_PROTOCOL = "/locomesh/sim/pex/1.0.0"
MAX_WANT = 64
MAX_REQUEST = 256
MAX_REPLY = 64 * 1024
MAX_PEER_ID_TEXT = 128


@dataclass(frozen=True)
class PeerEntry:
    peer_id: str
    observed: Endpoint
    listen: Endpoint


def format_endpoint(endpoint: Endpoint) -> str:
    return f"{endpoint[0]}:{endpoint[1]}"


def parse_endpoint(text: object) -> Endpoint:
    """"a.b.c.d:port" -> (ip, port); `ProtocolError("bad-address")` for anything else."""
    if not isinstance(text, str):
        raise ProtocolError("bad-address", "an address is an 'ip:port' string")
    ip, _, port = text.rpartition(":")
    try:
        ipaddress.IPv4Address(ip)
        number = int(port)
    except ValueError:
        raise ProtocolError("bad-address", f"not an ip:port address: {text[:40]!r}") from None
    if not 0 < number < 65536:
        raise ProtocolError("bad-address", f"port out of range: {number}")
    return (ip, number)


class PeerExchange:
    """Both sides of peer exchange for one node (bootstrap nodes serve it, all nodes ask)."""

    def __init__(self, node: SimNode, rng: random.Random, *, max_known: int = 4096) -> None:
        self.node = node
        self._rng = rng
        self._max_known = max_known
        self.known: dict[str, PeerEntry] = {}

    def serve(self) -> None:
        self.node.add_service(PEX_PROTOCOL, self.handle, timeout=2 * STREAM_TIMEOUT)

    async def handle(self, stream: INetStream) -> None:
        frame = await read_frame(stream, max_size=MAX_REQUEST, timeout=STREAM_TIMEOUT)
        request = decode_map(frame, {"want": int, "listen": str}, max_size=MAX_REQUEST)
        listen = parse_endpoint(request["listen"])
        observed = stream.get_remote_address()
        if observed is None:
            raise ProtocolError("no-address", "the connection has no remote address")
        asker = str(stream.muxed_conn.peer_id)
        others = [entry for peer, entry in self.known.items() if peer != asker]
        sample = self._rng.sample(others, min(len(others), max(0, min(request["want"], MAX_WANT))))
        reply = {
            "you": format_endpoint(observed),
            "peers": [[e.peer_id, format_endpoint(e.observed), format_endpoint(e.listen)] for e in sample],
        }
        frame = self.node.hooks.frame(PEX_PROTOCOL, pack(reply))
        if frame is not None:
            await write_frame(stream, frame, timeout=STREAM_TIMEOUT)
        self._remember(PeerEntry(asker, (observed[0], observed[1]), listen))

    async def ask(self, bootstrap: ID, want: int) -> tuple[Endpoint, list[PeerEntry]] | None:
        """(my observed address, peers) from `bootstrap`; None if the exchange failed (counted)."""
        stream = await self.node.open_stream(bootstrap, PEX_PROTOCOL)
        if stream is None:
            return None
        try:
            request = pack({"want": want, "listen": format_endpoint(self.node.listen_addr)})
            await write_frame(stream, request, timeout=STREAM_TIMEOUT)
            reply = decode_map(
                await read_frame(stream, max_size=MAX_REPLY, timeout=STREAM_TIMEOUT),
                {"you": str, "peers": list},
                max_size=MAX_REPLY,
            )
            return parse_endpoint(reply["you"]), [self._entry(item) for item in reply["peers"][:MAX_WANT]]
        except Exception as error:  # noqa: BLE001 - bad input, or a dead stream (which raises many types)
            self.node.count_error("pex-" + getattr(error, "code", type(error).__name__.lower()))
            return None
        finally:
            await _close_quietly(stream)

    def _entry(self, item: object) -> PeerEntry:
        peer_id, observed, listen = expect_list(item, item=str, length=3, max_items=3)
        if not _is_peer_id(peer_id):
            raise ProtocolError("bad-peer-id", f"not a peer ID: {peer_id[:60]!r}")
        return PeerEntry(peer_id, parse_endpoint(observed), parse_endpoint(listen))

    def learn(self, entries: list[PeerEntry]) -> None:
        """Remember peers heard of from elsewhere (bootstrap nodes share what they know)."""
        for entry in entries:
            if entry.peer_id != str(self.node.peer_id) and entry.peer_id not in self.known:
                self._remember(entry)

    def _remember(self, entry: PeerEntry) -> None:
        self.known.pop(entry.peer_id, None)
        self.known[entry.peer_id] = entry
        while len(self.known) > self._max_known:
            del self.known[next(iter(self.known))]


def _is_peer_id(text: str) -> bool:
    """Whether `text` is a base58 peer ID (ours are 52 characters; longer text is not cached)."""
    return len(text) <= MAX_PEER_ID_TEXT and _decodes_as_peer_id(text)


@lru_cache(maxsize=1 << 16)
def _decodes_as_peer_id(text: str) -> bool:
    """Memoised: bootstrap nodes exchange the same IDs every round, and base58 decoding in
    Python made that sharing a visible cost at 1,000 nodes (docs/measurements.md)."""
    try:
        ID.from_base58(text)
    except Exception:  # noqa: BLE001 - base58 / multihash errors of several types
        return False
    return True


async def _close_quietly(stream: INetStream) -> None:
    try:
        await stream.close()
    except Exception:  # noqa: BLE001 - closing a broken stream may raise anything; it is gone either way
        pass
