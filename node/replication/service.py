"""Run-state replication over libp2p: GossipSub for new ops, anti-entropy streams for the rest.

The CRDT itself (`locomesh.crdt`) is pure; this service only moves bytes:

* **Gossip.** One GossipSub topic per run, ``/locomesh/run/<run id>/ops``. Ops this node writes
  are batched into a signed `crdt.ops` envelope every `GOSSIP_FLUSH` seconds (GossipSub allows a
  few messages per second per peer, so one op per message would be throttled). Every node
  registers the same validator: it adds each op to the replica, and refuses the message if any
  op in it is invalid, so invalid ops are not forwarded.
* **Anti-entropy.** A request/response stream, `SYNC_PROTOCOL` (sync_streams.py), carrying the frames of
  `locomesh.crdt.sync` (heads, want, ops). Gossip is the fast path; anti-entropy is what makes
  delivery certain (GossipSub drops messages silently when its queues are full). Pulls are kept
  proportionate to what gossip misses (`anti_entropy.AntiEntropySchedule`): a node pulls from
  each peer right after it connects, then from a few peers per sweep, sweeping less often
  while pulls find nothing; an op gossiped with parents still unknown `GAP_GRACE` seconds later
  (not merely overtaken by them in flight) makes it pull from that op's author at once. A
  server that sees the asker ahead of it pulls back.
* **Limits per peer.** What a peer forwards by gossip is charged to it (`GOSSIP_RATE`: bytes,
  plus `OP_COST` per op): past its budget a message is dropped (not applied, not forwarded) and
  the peer scored against (node/peer_scores.py); so is a message with an invalid op. Anti-entropy
  brings any honest op that was dropped. A peer gets at most `MAX_SERVED_PER_PEER` sync streams
  served at once (`MAX_SERVED` in all) and `SERVE_RATE` bytes of answers. What one *author* may
  write (members only, per-round caps) is the CRDT's rule (crdt/limits.py).
* **On disk.** Every op applied is appended to the run's op log (node/replication/op_log.py); this node's own
  ops are synced to disk before they are published, the others' at least every `LOG_SYNC`
  seconds. `open_run` loads the log into the replica before anything else, so a restarted node
  signs its next op after its own newest one: reusing a place in its chain would be a fork, a ban.
* **Writing** (`write`): never an op that contradicts what this node said before (a second,
  different vote, commitment or proposal for a round: an equivocation), never one that repeats
  it, never one the run's limits refuse; such a write is logged and skipped.
* **Bans.** A ban of this node's own key is logged once as a warning, with its reason
  (`ban_reason`); evidence is published only once a pull has completed since the run was opened
  (our own chain is then what the peers hold too).
* **RPC** ``run.state(run_id)``: the materialised state of a run this node replicates.

Runs replicated: those created or joined in the data dir (`locomesh.node.runs.store`), looked for
again at every sync sweep, plus any given to `open_run`. Equivocations seen by this node are
published as evidence ops.
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
from locomesh.crdt.limits import earlier_statement
from locomesh.crdt.scores import scores_json
from locomesh.protocol import ProtocolError, decode, encode, peer_id_from_public_key, public_key_from_peer_id
from locomesh.protocol.kinds import CRDT_OPS, MAX_BATCH_OPS
from locomesh.protocol.runs import format_run_id, parse_run_id, short_run_id

from locomesh.node.replication.anti_entropy import FANOUT, MAX_INTERVAL, AntiEntropySchedule
from locomesh.node.replication.op_log import OpLog, load_into
from locomesh.node.replication.own_ban import OwnBans
from locomesh.node.rate_limit import RateLimiter
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runs.store import RunStore
from locomesh.node.runtime import DialError, Node
from locomesh.node.replication.sync_streams import SYNC_PROTOCOL, answer_on, pull_over

logger = logging.getLogger(__name__)

SYNC_INTERVAL = 5.0  # between sweeps while pulls bring ops; up to MAX_INTERVAL while they do not
NEW_PEER_POLL = 0.5
GAP_GRACE = 1.0  # an op's missing parents may be a gossip hop behind it: wait this long before pulling
GOSSIP_FLUSH = 0.25
GOSSIP_BATCH_BYTES = 512 * 1024  # GossipSub drops messages over 1 MiB without a word
RUN_NOT_FOUND = -32004
MiB = 1024 * 1024
# Per peer. A peer forwards every run op once, so its gossip is the run's whole op rate: a
# hundred members writing a few ops a round is tens of ops a second; a backlog goes by pulls.
OP_COST = 512  # bytes an op is charged beyond its size: what parsing and checking it costs
GOSSIP_BURST, GOSSIP_RATE = 8 * MiB, 1 * MiB  # charged bytes at once, and per second after that
GOSSIP_MESSAGES = 100  # messages a second per peer GossipSub takes (its spam check); bytes are budgeted above
SERVE_BURST, SERVE_RATE = 64 * MiB, 8 * MiB  # sync answers: a newcomer's whole backlog at once
MAX_SERVED_PER_PEER = 4  # sync streams served at once: one pull per run it shares with us
MAX_SERVED = 64
LOG_SYNC = 1.0  # seconds between syncs of the op logs to disk (others' ops)


def topic_of(run_id: bytes) -> str:
    return f"/locomesh/run/{format_run_id(run_id)}/ops"


class CrdtService:
    """Replicates the state of every run this node takes part in. See the module docstring."""

    name = "crdt"

    def __init__(self, data_dir: str | os.PathLike | None = None, *, sync_interval: float = SYNC_INTERVAL,
                 max_sync_interval: float = MAX_INTERVAL, sync_fanout: int = FANOUT,
                 gossip_budget: tuple[int, int] = (GOSSIP_BURST, GOSSIP_RATE)) -> None:
        """`data_dir` None: no run store and no op logs (ops in memory only). `gossip_budget`:
        (burst, per second) of what one peer may forward, in charged bytes (module docstring)."""
        self.data_dir = data_dir
        self.store = RunStore(data_dir) if data_dir is not None else None
        self.gossip_budget = gossip_budget
        self.sync_interval = sync_interval
        self.max_sync_interval = max(sync_interval, max_sync_interval)
        self.sync_fanout = sync_fanout
        self.schedule: AntiEntropySchedule | None = None
        self._gaps: dict[tuple[str, bytes], tuple[float, bytes]] = {}  # (author, run) -> (since, op waiting)
        self.replicas: dict[bytes, Replica] = {}
        self._logs: dict[bytes, OpLog] = {}
        self._opening: dict[bytes, trio.Event] = {}  # runs being loaded: no caller sees one half loaded
        self._own_bans = OwnBans()
        self._pulled: set[bytes] = set()  # runs pulled from a peer since they were opened
        self._outbox: dict[bytes, list[bytes]] = {}
        self._syncing: set[tuple[str, bytes]] = set()
        self._served: dict[str, int] = {}  # peer -> sync streams being served to it
        self._closing = False
        self._node: Node | None = None
        self._nursery: trio.Nursery | None = None
        self.pubsub: Pubsub | None = None

    # --- life cycle -------------------------------------------------------------------------

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.schedule = AntiEntropySchedule(node.rng, base_interval=self.sync_interval,
                                            max_interval=self.max_sync_interval, fanout=self.sync_fanout)
        # Built before any connection exists: Pubsub learns of peers through a notifee.
        # GossipSub's own spam check (10 messages a second per peer and topic by default) drops what
        # a peer forwards of a busy run's agreement (every member's batches, a few a second each);
        # what one peer may forward is bounded by our own budget instead (`GOSSIP_RATE`, `OP_COST`).
        router = GossipSub(
            protocols=[GOSSIPSUB_PROTOCOL_ID], degree=6, degree_low=4, degree_high=12, heartbeat_interval=1,
            max_messages_per_topic_per_second=GOSSIP_MESSAGES,
        )
        self.pubsub = Pubsub(node.host, router, strict_signing=True, msg_id_constructor=_content_id)
        node.set_stream_handler(SYNC_PROTOCOL, self._serve_sync, timeout=None)
        node.rpc.register("run.state", self._rpc_state)
        node.add_status_field("crdt_ops", lambda: {short_run_id(r): len(rep) for r, rep in self.replicas.items()})
        self._sync_errors = node.metrics.counter(
            "locomesh_crdt_sync_failures_total", "Anti-entropy pulls that failed, by error code.", labels=("code",)
        )
        self._dropped = node.metrics.counter(
            "locomesh_crdt_gossip_dropped_total", "Gossip messages dropped, by reason.", labels=("reason",)
        )
        burst, rate = self.gossip_budget
        self._gossip_limit = RateLimiter(trio.current_time, burst=burst, interval=1 / rate)
        self._serve_limit = RateLimiter(trio.current_time, burst=SERVE_BURST, interval=1 / SERVE_RATE)
        try:
            async with background_trio_service(self.pubsub), background_trio_service(router):
                await self.pubsub.wait_until_ready()
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    await self._open_stored_runs()
                    nursery.start_soon(self._anti_entropy_loop)
                    nursery.start_soon(self._gossip_loop)
                    task_status.started()
        finally:
            self._closing = True  # no more own ops: one not on disk must never be published
            for run_id, log in self._logs.items():
                self.replicas[run_id].sinks.remove(log.append)
                _close_quietly(log)

    async def open_run(self, manifest: bytes) -> Replica:
        """Start replicating the run of this signed manifest (idempotent); `ProtocolError` if invalid.

        The run's op log is loaded first: no one (us included) sees the replica before it holds
        every op this node applied in the run before."""
        genesis = Genesis.from_manifest(manifest)
        run_id = genesis.run_id
        while run_id not in self.replicas:
            if run_id in self._opening:  # another caller is loading it: wait, then look again
                await self._opening[run_id].wait()
                continue
            self._opening[run_id] = trio.Event()
            try:
                replica = Replica(genesis)
                await self._load_log(replica)
                self._own_bans.watch(replica, self._node.identity.public_key)
                await self._replicate(replica)
            finally:
                self._opening.pop(run_id).set()
        return self.replicas[run_id]

    async def _replicate(self, replica: Replica) -> None:
        assert self.pubsub is not None and self._nursery is not None, "the service is not running"
        genesis = replica.genesis
        self.replicas[genesis.run_id] = replica
        self._outbox[genesis.run_id] = []
        topic = topic_of(genesis.run_id)

        def validate(forwarder: Any, message: Any) -> bool:
            return self._on_gossip(replica, message.data, forwarder)

        self.pubsub.set_topic_validator(topic, validate, False)
        subscription = await self.pubsub.subscribe(topic)
        self._nursery.start_soon(_drain, subscription)  # the validator already took the ops in
        if self.schedule is not None:
            self.schedule.behind(trio.current_time())  # its backlog: pulled at the next look
        logger.info("replicating run %s", short_run_id(genesis.run_id))

    def write(self, run_id: bytes, op_type: str, **fields: Any) -> bytes | None:
        """Write an op as this node into a replicated run; it is gossiped at the next flush.
        None if it was not written (see `write_batch`)."""
        written = self.write_batch(run_id, [(op_type, fields)])
        return written[0] if written else None

    def write_batch(self, run_id: bytes, ops: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        """Write several ops at once under one seal (one signature for peers to check), in order,
        synced to disk before anyone can have them. Nothing is written (and [] returned, the
        reason logged) if one would repeat or contradict what this node said before, or break
        the run's limits (crdt/limits.py). `OSError` if the op log cannot be synced."""
        assert self._node is not None
        if self._closing:
            logger.info("run %s: not writing %s: shutting down", short_run_id(run_id), [t for t, _f in ops])
            return []
        replica, me = self.replicas[run_id], self._node.identity.public_key
        for op_type, fields in ops:
            said = earlier_statement(replica.facts, me, op_type, fields)
            if said is not None:
                log = logger.warning if said == "conflict" else logger.info
                what = "something else" if said == "conflict" else "it"
                log("run %s: not writing a %s for round %s: we said %s before (a restart?)",
                    short_run_id(run_id), op_type, fields.get("round"), what)
                return []
        try:
            sealed = replica.create_batch(self._node.identity, ops)
        except ProtocolError as error:
            logger.warning("run %s: not writing %s: %s", short_run_id(run_id), [t for t, _f in ops], error)
            return []
        if run_id in self._logs:
            self._logs[run_id].sync()  # durable before it is published (module docstring)
        self._outbox[run_id].extend(sealed)
        return sealed

    def has_pulled(self, run_id: bytes) -> bool:
        """Has a pull of `run_id` from a peer gone through since the run was opened here?"""
        return run_id in self._pulled

    def has_standing(self, peer_id: str) -> bool:
        """Is `peer_id` a member of a run replicated here with a say there (admitted, or earned by
        counted work: crdt/membership.py)? What a node serves before anyone else (upload slots, the
        doctor probe): a join is free in an open run, standing is not."""
        try:
            key = public_key_from_peer_id(peer_id)
        except ProtocolError:
            return False
        for replica in list(self.replicas.values()):
            member = replica.chain.tip.membership.roster.get(key)
            if member is not None and member.say:
                return True
        return False

    def ban_reason(self, run_id: bytes) -> str | None:
        """Why this node's key is banned in `run_id`, or None if it is not (or the run is not replicated)."""
        me = self._node.identity.public_key if self._node is not None else None
        return self._own_bans.reason(self.replicas.get(run_id), run_id, me)

    # --- gossip -----------------------------------------------------------------------------

    def _on_gossip(self, replica: Replica, data: bytes, forwarder: Any = None) -> bool:
        """GossipSub validator: take in every op of a batch; forward the batch only if all are valid.
        What `forwarder` sends past its budget is dropped; it is scored for that and for invalid ops."""
        peer = str(forwarder) if forwarder is not None else None
        try:
            envelope = decode(data, run=replica.run_id, kinds=frozenset({CRDT_OPS.name}))
        except ProtocolError as error:
            self._count(error)
            self._strike(peer, f"gossip: {error.code}")
            return False
        ops = envelope.body["ops"]
        charge = len(data) + OP_COST * len(ops)
        if peer not in (None, self._node.peer_id) and not self._gossip_limit.allow(peer, charge):
            self._dropped.inc(reason="over-rate")
            self._strike(peer, "gossip over its rate limit")
            return False
        valid = True
        for op in ops:
            try:
                receipt = replica.add(op)
            except ProtocolError as error:
                self._count(error)
                if valid:
                    self._strike(peer, f"gossip: invalid op ({error.code})")
                valid = False
                continue
            self._publish_evidence(replica, receipt.equivocations)
            if receipt.waiting:  # its author (the publisher) holds its parents
                self._gaps.setdefault((peer_id_from_public_key(envelope.author), replica.run_id),
                                      (trio.current_time(), receipt.id))
        return valid

    async def _gossip_loop(self) -> None:
        synced = trio.current_time()
        while True:
            await trio.sleep(GOSSIP_FLUSH)
            for run_id, queued in list(self._outbox.items()):
                while queued:
                    batch = _take_batch(queued)
                    await self._publish(run_id, batch)
            if trio.current_time() - synced >= LOG_SYNC:
                synced = trio.current_time()
                self._sync_logs()

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
                if replica.run_id in self._pulled:  # else our own chain may not be all here yet
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
        stream = await self._node.open_stream(peer, [SYNC_PROTOCOL])
        progress = (await pull_over(stream, replica, self._node.identity, peer)).progress
        self._pulled.add(run_id)
        if progress.rejected:  # a peer serves only ops it applied, and validity is the same everywhere
            self._strike(peer, f"sync: {len(progress.rejected)} invalid ops served")
        self._publish_evidence(replica, progress.equivocations)
        return progress.applied

    async def _serve_sync(self, stream: Any) -> None:
        """Answer sync requests on one stream until the asker closes it (a few streams per peer at once)."""
        peer = str(stream.muxed_conn.peer_id)
        if self._served.get(peer, 0) >= MAX_SERVED_PER_PEER or sum(self._served.values()) >= MAX_SERVED:
            raise ProtocolError("busy", "too many sync streams at once")
        self._served[peer] = self._served.get(peer, 0) + 1
        try:
            await self._answer_sync(stream, peer)
        finally:
            self._served[peer] -= 1
            if not self._served[peer]:
                del self._served[peer]

    async def _answer_sync(self, stream: Any, peer: str) -> None:
        def allow(size: int) -> bool:
            if self._serve_limit.allow(peer, size):
                return True
            self._strike(peer, "sync requests over its rate limit")
            return False

        await answer_on(stream, peer, self.replicas, self._node.identity, allow=allow,
                        peer_ahead=lambda run_id: self._start_pull(peer, run_id))

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
            replica = self.replicas.get(parse_run_id(run_id, self.replicas))
        except ProtocolError as error:
            raise RpcError.invalid_params(error.reason) from None
        if replica is None:
            raise RpcError(RUN_NOT_FOUND, f"this node does not replicate run {run_id}: it holds the state of the runs "
                                          "it created or joined (locomesh run join RUN_ID)")
        state = replica.state.to_json()
        return {"run_id": format_run_id(replica.run_id), **state, "heads": len(replica.heads),
                "pending": len(replica.pending), "wanted": len(replica.wanted()),
                "scores": scores_json(replica.facts, replica.state)}

    def _count(self, error: ProtocolError) -> None:
        if self._node is not None:
            self._node.count_protocol_error(error.code)

    def _strike(self, peer: str | None, reason: str) -> None:
        if peer is not None and self._node is not None and peer != self._node.peer_id:
            self._node.scores.strike(peer, reason)

    # --- on disk, and our own bans ---------------------------------------------------------------

    async def _load_log(self, replica: Replica) -> None:
        """Apply the run's op log (if this node keeps one) to `replica`; it then keeps what is applied."""
        if self.data_dir is not None:
            self._logs[replica.run_id] = await load_into(replica, OpLog.for_run(self.data_dir, replica.run_id))

    def _sync_logs(self) -> None:
        for log in self._logs.values():
            try:
                log.sync()
            except OSError as error:  # others' ops only: a restart fetches them again
                logger.error("%s: cannot sync: %s", log.path, error)


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


def _close_quietly(log: OpLog) -> None:
    try:
        log.close()
    except OSError as error:
        logger.error("%s: cannot close: %s", log.path, error)


def _content_id(message: Any) -> bytes:
    """GossipSub message ID: the hash of the bytes, so one batch relayed twice is seen once."""
    return hashlib.sha256(message.data).digest()


async def _drain(subscription: Any) -> None:
    while True:
        await subscription.get()
