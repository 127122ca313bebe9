"""Run-state replication over libp2p: GossipSub for new ops, anti-entropy streams for the rest.

The CRDT itself (`locomesh.crdt`) is pure; this service only moves bytes:

* **Gossip.** One GossipSub topic per run, ``/locomesh/run/<run id>/ops``. Ops this node writes
  are batched into a signed `crdt.ops` envelope every `GOSSIP_FLUSH` seconds (GossipSub allows a
  few messages per second per peer, so one op per message would be throttled). Every node
  registers the same validator: it adds each op to the replica, and refuses the message if any
  op in it is invalid, so invalid ops are not forwarded.
* **Anti-entropy.** A request/response stream, `SYNC_PROTOCOL`, carrying the frames of
  `locomesh.crdt.sync` (heads, want, ops). Gossip is the fast path; anti-entropy is what makes
  delivery certain (GossipSub drops messages silently when its queues are full). Pulls are kept
  proportionate to what gossip misses (`anti_entropy.AntiEntropySchedule`): a node pulls from
  each peer right after it connects, then from a few peers per sweep, sweeping less often
  while pulls find nothing; an op gossiped with parents still unknown `GAP_GRACE` seconds later
  (not merely overtaken by them in flight) makes it pull from that op's author at once. A
  server that sees the asker ahead of it pulls back.
* **RPC** ``run.state(run_id)``: the materialised state of a run this node replicates.

Runs replicated: those created or joined in the data dir (`locomesh.node.run_store`), looked for
again at every sync sweep, plus any given to `open_run`. Equivocations seen by this node are
published as evidence ops. Ops are held in memory only (no persistence yet).
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import trio
from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_PROTOCOL_ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from locomesh.crdt import Genesis, Replica, evidence_fields
from locomesh.crdt.sync import SYNC_KINDS, SyncPuller, SyncServer
from locomesh.protocol import ProtocolError, decode, encode, peer_id_from_public_key, public_key_from_peer_id
from locomesh.protocol.kinds import CRDT_OPS, MAX_BATCH_OPS
from locomesh.protocol.runs import format_run_id, parse_run_id, short_run_id

from .anti_entropy import FANOUT, MAX_INTERVAL, AntiEntropySchedule
from .rpc import RpcError
from .run_store import RunStore
from .runtime import DialError, Node
from .streams import close_quietly, read_frame, read_frame_or_eof, write_frame

logger = logging.getLogger(__name__)

SYNC_PROTOCOL = "/locomesh/crdt-sync/1.0.0"
FRAME_TIMEOUT = 15.0
SYNC_INTERVAL = 5.0  # between sweeps while pulls bring ops; up to MAX_INTERVAL while they do not
NEW_PEER_POLL = 0.5
GAP_GRACE = 1.0  # an op's missing parents may be a gossip hop behind it: wait this long before pulling
GOSSIP_FLUSH = 0.25
GOSSIP_BATCH_BYTES = 512 * 1024  # GossipSub drops messages over 1 MiB without a word
RUN_NOT_FOUND = -32004


def topic_of(run_id: bytes) -> str:
    return f"/locomesh/run/{format_run_id(run_id)}/ops"


class CrdtService:
    """Replicates the state of every run this node takes part in. See the module docstring."""

    name = "crdt"

    def __init__(self, data_dir: str | os.PathLike | None = None, *, sync_interval: float = SYNC_INTERVAL,
                 max_sync_interval: float = MAX_INTERVAL, sync_fanout: int = FANOUT) -> None:
        self.store = RunStore(data_dir) if data_dir is not None else None
        self.sync_interval = sync_interval
        self.max_sync_interval = max(sync_interval, max_sync_interval)
        self.sync_fanout = sync_fanout
        self.schedule: AntiEntropySchedule | None = None
        self._gaps: dict[tuple[str, bytes], tuple[float, bytes]] = {}  # (author, run) -> (since, op waiting)
        self.replicas: dict[bytes, Replica] = {}
        self._outbox: dict[bytes, list[bytes]] = {}
        self._syncing: set[tuple[str, bytes]] = set()
        self._node: Node | None = None
        self._nursery: trio.Nursery | None = None
        self.pubsub: Pubsub | None = None

    # --- life cycle -------------------------------------------------------------------------

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.schedule = AntiEntropySchedule(node.rng, base_interval=self.sync_interval,
                                            max_interval=self.max_sync_interval, fanout=self.sync_fanout)
        # Built before any connection exists: Pubsub learns of peers through a notifee.
        router = GossipSub(
            protocols=[GOSSIPSUB_PROTOCOL_ID], degree=6, degree_low=4, degree_high=12, heartbeat_interval=1
        )
        self.pubsub = Pubsub(node.host, router, strict_signing=True, msg_id_constructor=_content_id)
        node.set_stream_handler(SYNC_PROTOCOL, self._serve_sync, timeout=None)
        node.rpc.register("run.state", self._rpc_state)
        node.add_status_field("crdt_ops", lambda: {short_run_id(r): len(rep) for r, rep in self.replicas.items()})
        self._sync_errors = node.metrics.counter(
            "locomesh_crdt_sync_failures_total", "Anti-entropy pulls that failed, by error code.", labels=("code",)
        )
        async with background_trio_service(self.pubsub), background_trio_service(router):
            await self.pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._open_stored_runs()
                nursery.start_soon(self._anti_entropy_loop)
                nursery.start_soon(self._gossip_loop)
                task_status.started()

    async def open_run(self, manifest: bytes) -> Replica:
        """Start replicating the run of this signed manifest (idempotent); `ProtocolError` if invalid."""
        genesis = Genesis.from_manifest(manifest)
        if genesis.run_id in self.replicas:
            return self.replicas[genesis.run_id]
        assert self.pubsub is not None and self._nursery is not None, "the service is not running"
        replica = self.replicas[genesis.run_id] = Replica(genesis)
        self._outbox[genesis.run_id] = []
        topic = topic_of(genesis.run_id)
        self.pubsub.set_topic_validator(topic, lambda _peer, message: self._on_gossip(replica, message.data), False)
        subscription = await self.pubsub.subscribe(topic)
        self._nursery.start_soon(_drain, subscription)  # the validator already took the ops in
        if self.schedule is not None:
            self.schedule.behind(trio.current_time())  # its backlog: pulled at the next look
        logger.info("replicating run %s", short_run_id(genesis.run_id))
        return replica

    def write(self, run_id: bytes, op_type: str, **fields: Any) -> bytes:
        """Write an op as this node into a replicated run; it is gossiped at the next flush."""
        return self.write_batch(run_id, [(op_type, fields)])[0]

    def write_batch(self, run_id: bytes, ops: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        """Write several ops at once under one seal (one signature for peers to check), in order."""
        assert self._node is not None
        sealed = self.replicas[run_id].create_batch(self._node.identity, ops)
        self._outbox[run_id].extend(sealed)
        return sealed

    # --- gossip -----------------------------------------------------------------------------

    def _on_gossip(self, replica: Replica, data: bytes) -> bool:
        """GossipSub validator: take in every op of a batch; forward the batch only if all are valid."""
        try:
            envelope = decode(data, run=replica.run_id, kinds=frozenset({CRDT_OPS.name}))
        except ProtocolError as error:
            self._count(error)
            return False
        valid = True
        for op in envelope.body["ops"]:
            try:
                receipt = replica.add(op)
            except ProtocolError as error:
                self._count(error)
                valid = False
                continue
            self._publish_evidence(replica, receipt.equivocations)
            if receipt.waiting:  # its author (the publisher) holds its parents
                self._gaps.setdefault((peer_id_from_public_key(envelope.author), replica.run_id),
                                      (trio.current_time(), receipt.id))
        return valid

    async def _gossip_loop(self) -> None:
        while True:
            await trio.sleep(GOSSIP_FLUSH)
            for run_id, queued in self._outbox.items():
                while queued:
                    batch = _take_batch(queued)
                    await self._publish(run_id, batch)

    async def _publish(self, run_id: bytes, ops: list[bytes]) -> None:
        assert self._node is not None and self.pubsub is not None
        message = encode(self._node.identity, CRDT_OPS.name, {"ops": ops, "more": False}, run=run_id)
        try:
            await self.pubsub.publish(topic_of(run_id), message)
        except Exception as error:  # noqa: BLE001 - py-libp2p raises many types; anti-entropy covers the loss
            logger.info("gossip of %d ops failed: %s", len(ops), error)

    def _publish_evidence(self, replica: Replica, pairs: list) -> None:
        for first, second in pairs:
            fields = evidence_fields(first, second)
            if fields is not None and first.author not in replica.facts.convicted:
                logger.warning("run %s: %s by %s", short_run_id(replica.run_id), fields["reason"], first.author.hex())
                self.write(replica.run_id, "evidence", **fields)

    # --- anti-entropy -------------------------------------------------------------------------

    async def _anti_entropy_loop(self) -> None:
        """Pull as `self.schedule` says (new peers at once, a few peers per sweep), and from the
        author of any op still waiting for its parents after `GAP_GRACE`."""
        assert self._node is not None and self.schedule is not None
        while True:
            await trio.sleep(NEW_PEER_POLL)
            now = trio.current_time()
            self._repair_gaps(now)
            connected = [entry.peer_id for entry in self._node.peers.peers()]
            due, sweep = self.schedule.due(now, connected)
            if sweep:
                await self._open_stored_runs()
            for peer in due:
                for run_id in list(self.replicas):
                    self._start_pull(peer, run_id)

    def _repair_gaps(self, now: float) -> None:
        """Pull from the authors of ops that still wait for parents `GAP_GRACE` after arriving."""
        assert self.schedule is not None
        for (author, run_id), (since, waiting) in list(self._gaps.items()):
            if now - since < GAP_GRACE:
                continue
            del self._gaps[(author, run_id)]
            replica = self.replicas[run_id]
            if waiting not in replica and not replica.is_rejected(waiting):  # no later message released it
                self.schedule.behind(now)
                self._start_pull(author, run_id)

    def _start_pull(self, peer: str, run_id: bytes) -> None:
        if (peer, run_id) not in self._syncing and self._nursery is not None:
            self._syncing.add((peer, run_id))
            self._nursery.start_soon(self._pull_guarded, peer, run_id)

    async def _pull_guarded(self, peer: str, run_id: bytes) -> None:
        try:
            applied = await self.pull(peer, run_id)
            if self.schedule is not None:
                self.schedule.pulled(applied)
        except (DialError, ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError) as error:
            self._sync_errors.inc(code=getattr(error, "code", type(error).__name__))
            logger.debug("sync of %s with %s failed: %s", short_run_id(run_id), peer, error)
        except Exception as error:  # noqa: BLE001 - a broken stream from py-libp2p must not stop the node
            self._sync_errors.inc(code="stream-failed")
            logger.info("sync of %s with %s failed: %s: %s", short_run_id(run_id), peer, type(error).__name__, error)
        finally:
            self._syncing.discard((peer, run_id))

    async def pull(self, peer: str, run_id: bytes) -> int:
        """Fetch from `peer` the ops of `run_id` we lack; return how many were applied."""
        assert self._node is not None
        replica = self.replicas[run_id]
        puller = SyncPuller(replica, self._node.identity, peer=public_key_from_peer_id(peer), max_batches=256)
        stream = await self._node.open_stream(peer, [SYNC_PROTOCOL])
        try:
            request = puller.start()
            while request is not None:
                await write_frame(stream, request, timeout=FRAME_TIMEOUT)
                reply = await read_frame(stream, max_size=CRDT_OPS.max_size, timeout=FRAME_TIMEOUT)
                request = puller.receive(reply)
        finally:
            await close_quietly(stream)  # bounded, and never hides why the pull failed
        self._publish_evidence(replica, puller.progress.equivocations)
        return puller.progress.applied

    async def _serve_sync(self, stream: Any) -> None:
        """Answer sync requests on one stream until the asker closes it."""
        peer = str(stream.muxed_conn.peer_id)
        author = public_key_from_peer_id(peer)
        servers: dict[bytes, SyncServer] = {}  # one per run asked about on this stream
        while True:
            frame = await read_frame_or_eof(stream, max_size=CRDT_OPS.max_size, timeout=FRAME_TIMEOUT)
            if frame is None:
                return
            envelope = decode(frame, kinds=SYNC_KINDS)
            if envelope.author != author:
                raise ProtocolError("wrong-author", "sync requests must be signed by the connected peer")
            replica = self.replicas.get(envelope.run)
            if replica is None:
                raise ProtocolError("unknown-run", "this node does not replicate that run")
            server = servers.setdefault(envelope.run, SyncServer(replica, self._node.identity))
            answer = server.answer_envelope(envelope)
            await write_frame(stream, answer.reply, timeout=FRAME_TIMEOUT)
            if answer.peer_ahead:
                self._start_pull(peer, envelope.run)

    # --- runs and RPC --------------------------------------------------------------------------

    async def _open_stored_runs(self) -> None:
        if self.store is None:
            return
        for known in self.store.load():
            if known.origin != "seen" and known.run_id not in self.replicas:
                await self.open_run(known.manifest)

    async def _rpc_state(self, run_id: str) -> dict[str, Any]:
        if not isinstance(run_id, str):
            raise RpcError.invalid_params("run_id must be a string")
        try:
            replica = self.replicas.get(parse_run_id(run_id))
        except ProtocolError as error:
            raise RpcError.invalid_params(error.reason) from None
        if replica is None:
            raise RpcError(RUN_NOT_FOUND, f"this node does not replicate run {run_id}")
        state = replica.state.to_json()
        return {"run_id": format_run_id(replica.run_id), **state, "heads": len(replica.heads),
                "pending": len(replica.pending), "wanted": len(replica.wanted())}

    def _count(self, error: ProtocolError) -> None:
        if self._node is not None:
            self._node.count_protocol_error(error.code)


def _take_batch(queued: list[bytes]) -> list[bytes]:
    """Remove and return the first ops of `queued` that fit one gossip message."""
    size, count = 0, 0
    for data in queued[:MAX_BATCH_OPS]:
        if count and size + len(data) > GOSSIP_BATCH_BYTES:
            break
        size += len(data)
        count += 1
    batch = queued[:count]
    del queued[:count]
    return batch


def _content_id(message: Any) -> bytes:
    """GossipSub message ID: the hash of the bytes, so one batch relayed twice is seen once."""
    return hashlib.sha256(message.data).digest()


async def _drain(subscription: Any) -> None:
    while True:
        await subscription.get()
