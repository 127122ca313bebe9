"""The `/locomesh/ckpt/1` wire: requests and answers for checkpoint manifests and chunks.

One stream carries any number of requests, each answered before the next is read::

    asker                                          provider
      | -- frame: ckpt.get-manifest{id} or ckpt.get-chunk{id, index}, signed -->  |
      | <-- frame: ckpt.reply{status, size}, signed --------------------------------|
      | <-- frame: `size` raw bytes (only when status is "ok") ---------------------|

The same exchange runs over a libp2p stream or a sealed data plane stream
(`dataplane`); either way the caller names the peer at the other end.
Requests and answers are signed envelopes (`locomesh.protocol.encode`) of the
``ckpt.*`` kinds, decoded strictly (kind, size cap, schema, signature) and
checked to be signed by the peer at the other end of the stream. The payload
itself is not signed: the asker checks it against a hash it already trusts
(the checkpoint ID for a manifest, the manifest's chunk hash for a chunk),
which is stronger than any provider's signature.

Answers: ``ok`` (the payload follows), ``busy`` (the provider serves as many
uploads as it allows; ask again later or elsewhere) and ``not-found``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from locomesh.protocol import Envelope, Identity, MessageKind, ProtocolError, decode, encode
from locomesh.protocol.kinds import CKPT_GET_CHUNK, CKPT_GET_MANIFEST, CKPT_REPLY, CKPT_REQUEST_KINDS

from locomesh.node.streams import read_frame, read_frame_or_eof, write_frame

PROTOCOL_ID = "/locomesh/ckpt/1"
OK, BUSY, NOT_FOUND = "ok", "busy", "not-found"


@dataclass(frozen=True)
class Request:
    """A decoded request: `index` is None for a manifest."""

    checkpoint_id: bytes
    index: int | None


@dataclass(frozen=True)
class Reply:
    status: str
    payload: bytes


def remote_peer(stream: Any) -> str:
    """The peer ID at the other end of a libp2p stream (a data plane stream knows it from its handshake)."""
    return str(stream.muxed_conn.peer_id)


def _check_author(envelope: Envelope, peer_id: str) -> None:
    if envelope.author_peer_id != peer_id:
        raise ProtocolError("wrong-author", f"{envelope.kind} signed by {envelope.author_peer_id}, sent by {peer_id}")


async def read_signed(stream: Any, kind: MessageKind, peer_id: str, *, timeout: float) -> Envelope:
    """One frame holding an envelope of `kind` signed by `peer_id` (the peer at the other end), or `ProtocolError`."""
    envelope = decode(await read_frame(stream, max_size=kind.max_size, timeout=timeout), kinds=frozenset({kind.name}))
    _check_author(envelope, peer_id)
    return envelope


# --- asker side ------------------------------------------------------------------------------


async def ask(
    stream: Any, identity: Identity, peer_id: str, checkpoint_id: bytes, index: int | None, *,
    max_size: int, timeout: float,
) -> Reply:
    """Send one request on `stream` to `peer_id` and read its answer; the payload may be at most `max_size` bytes.

    `timeout` bounds each frame. Raises `ProtocolError` for a malformed or
    mis-signed answer, a payload over `max_size`, a timeout or a stream that ends.
    """
    if index is None:
        request = encode(identity, CKPT_GET_MANIFEST.name, {"id": checkpoint_id})
    else:
        request = encode(identity, CKPT_GET_CHUNK.name, {"id": checkpoint_id, "index": index})
    await write_frame(stream, request, timeout=timeout)
    header = await read_signed(stream, CKPT_REPLY, peer_id, timeout=timeout)
    status, size = header.body["status"], header.body["size"]
    if status != OK:
        if size:
            raise ProtocolError("bad-reply", f"a {status!r} answer announces {size} bytes")
        return Reply(status, b"")
    if size > max_size:
        raise ProtocolError("too-large", f"the provider offers {size} bytes where at most {max_size} fit")
    payload = await read_frame(stream, max_size=size, timeout=timeout)
    if len(payload) != size:
        raise ProtocolError("bad-reply", f"announced {size} bytes, sent {len(payload)}")
    return Reply(OK, payload)


# --- provider side ---------------------------------------------------------------------------


async def next_request(stream: Any, peer_id: str, *, idle_timeout: float) -> Request | None:
    """The next request from `peer_id` on `stream`, or None when the asker closed it between requests."""
    frame = await read_frame_or_eof(stream, max_size=CKPT_GET_CHUNK.max_size, timeout=idle_timeout)
    if frame is None:
        return None
    envelope = decode(frame, kinds=CKPT_REQUEST_KINDS)
    _check_author(envelope, peer_id)
    return Request(envelope.body["id"], envelope.body.get("index"))


async def answer(stream: Any, identity: Identity, status: str, payload: bytes = b"", *, timeout: float) -> None:
    """Send the answer to the request just read: a signed header, then the payload when `status` is ok."""
    if status != OK and payload:
        raise ValueError("only an ok answer carries a payload")
    header = encode(identity, CKPT_REPLY.name, {"status": status, "size": len(payload)})
    await write_frame(stream, header, timeout=timeout)
    if status == OK:
        await write_frame(stream, payload, timeout=timeout)
