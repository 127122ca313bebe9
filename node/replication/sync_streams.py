"""Anti-entropy over one libp2p stream: the asker's pull and the server's answers.

Both sides run the sans-IO machines of `locomesh.crdt.sync` (`SyncPuller`, `SyncServer`) and only
move their frames: every frame is read with a size bound (`CRDT_OPS.max_size`) and a timeout
(`FRAME_TIMEOUT`), and written whole. What a pull found wrong (invalid ops, equivocations) and
what an asker may cost (its sync budget) are the service's to act on (node/replication/service.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from locomesh.crdt import Replica
from locomesh.crdt.sync import SYNC_KINDS, SyncPuller, SyncServer
from locomesh.protocol import ProtocolError, decode, public_key_from_peer_id
from locomesh.protocol.kinds import CRDT_OPS

from locomesh.node.streams import close_quietly, read_frame, read_frame_or_eof, write_frame

SYNC_PROTOCOL = "/locomesh/crdt-sync/1.0.0"
FRAME_TIMEOUT = 15.0
MAX_PULL_BATCHES = 256


async def pull_over(stream: Any, replica: Replica, identity: Any, peer: str) -> SyncPuller:
    """Pull from `peer` on `stream` the ops of `replica` it lacks, then close the stream; the
    puller, whose `progress` says what was applied, rejected and found equivocating."""
    puller = SyncPuller(replica, identity, peer=public_key_from_peer_id(peer), max_batches=MAX_PULL_BATCHES)
    try:
        request = puller.start()
        while request is not None:
            await write_frame(stream, request, timeout=FRAME_TIMEOUT)
            reply = await read_frame(stream, max_size=CRDT_OPS.max_size, timeout=FRAME_TIMEOUT)
            request = puller.receive(reply)
    finally:
        await close_quietly(stream)  # bounded, and never hides why the pull failed
    return puller


async def answer_on(stream: Any, peer: str, replicas: Mapping[bytes, Replica], identity: Any, *,
                    allow: Callable[[int], bool], peer_ahead: Callable[[bytes], None]) -> None:
    """Answer `peer`'s sync requests on `stream` until it closes it. Each answer's size is
    charged through `allow` first (False: `ProtocolError("busy")`); `peer_ahead(run_id)` is
    called when the asker holds ops this node lacks. `ProtocolError` for a request not signed
    by `peer` or about a run not replicated here."""
    author = public_key_from_peer_id(peer)
    servers: dict[bytes, SyncServer] = {}  # one per run asked about on this stream
    while True:
        frame = await read_frame_or_eof(stream, max_size=CRDT_OPS.max_size, timeout=FRAME_TIMEOUT)
        if frame is None:
            return
        envelope = decode(frame, kinds=SYNC_KINDS)
        if envelope.author != author:
            raise ProtocolError("wrong-author", "sync requests must be signed by the connected peer")
        replica = replicas.get(envelope.run)
        if replica is None:
            raise ProtocolError("unknown-run", "this node does not replicate that run")
        server = servers.setdefault(envelope.run, SyncServer(replica, identity))
        answer = server.answer_envelope(envelope)
        if not allow(len(answer.reply)):
            raise ProtocolError("busy", "this peer asked for more than its sync budget")
        await write_frame(stream, answer.reply, timeout=FRAME_TIMEOUT)
        if answer.peer_ahead:
            peer_ahead(envelope.run)
