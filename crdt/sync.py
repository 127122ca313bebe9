"""Anti-entropy: bring one replica up to date with one peer, in request/response pairs.

Theory of operation
-------------------
A sync is a *pull*: the puller asks, the server answers, one reply per request, so any
transport that can carry a request and wait for its reply (a libp2p stream, an in-memory
queue in tests) can run it. Both sides are sans-IO: bytes in, bytes out, no clock, no socket.

1. The puller sends `crdt.heads` (reply = false) with its own heads; the server answers with
   its heads (reply = true). The server also learns whether the puller holds ops it lacks
   (`Answer.peer_ahead`), so its owner can start a pull the other way.
2. The puller's targets are the peer's heads it has not applied (nor found invalid), plus the
   dependencies its pending ops wait for. None: done.
3. The puller sends `crdt.want` {ids: targets, have: ops it holds}. `have` names first what the
   server surely knows (the server's heads that the puller holds, ops of the last batch that
   it held already), then the puller's own heads, which the server may not know: the server
   can only skip the past of `have` ops it holds itself. The server answers with `crdt.ops`:
   the ops in the past of the targets and not in the past of `have`, parents first,
   at most `MAX_BATCH_OPS` ops and about `batch_bytes` bytes, with `more` set if it stopped early.
4. The puller adds the ops (each is validated on its own; an invalid one is counted and
   skipped, it does not end the sync) and goes back to step 2 with the targets still missing.

The sync ends when nothing is missing, when a batch brings nothing new and nothing more is
coming (the peer cannot help further), or after `max_batches` batches (the next periodic sync
carries on). Every list on the wire is bounded by its kind's schema, every message by its
kind's size cap. The server keeps, per session, the ordered list of ops it is sending, so a
backlog of n ops costs it one walk of the DAG rather than one per batch.

Puller transitions (state, event) -> next state; any pair not in the table is a protocol error:

    IDLE        start        -> AWAIT_HEADS   send heads?
    DONE        start        -> AWAIT_HEADS   send heads?
    AWAIT_HEADS crdt.heads!  -> FETCHING      send want       (something missing)
                             -> DONE                          (nothing missing)
    FETCHING    crdt.ops     -> FETCHING      send want       (still missing, progress, budget left)
                             -> DONE
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

from locomesh.protocol import Envelope, Identity, ProtocolError, decode, encode
from locomesh.protocol.kinds import CRDT_HEADS, CRDT_OPS, CRDT_WANT, MAX_BATCH_OPS, MAX_PARENTS, MAX_WANT

from .ops import Op, OpId, op_id
from .replica import Replica

SYNC_KINDS = frozenset({CRDT_HEADS.name, CRDT_WANT.name, CRDT_OPS.name})
DEFAULT_BATCH_BYTES = 2 * 1024 * 1024  # well under the 4 MiB cap of crdt.ops, envelope included


class State(enum.Enum):
    IDLE = "idle"
    AWAIT_HEADS = "await-heads"
    FETCHING = "fetching"
    DONE = "done"
    FAILED = "failed"


@dataclass
class Progress:
    """What a sync did so far."""

    batches: int = 0
    applied: int = 0
    waiting: int = 0
    rejected: list[tuple[OpId, ProtocolError]] = field(default_factory=list)
    equivocations: list[tuple[Op, Op]] = field(default_factory=list)  # material for evidence ops
    complete: bool = False  # ended with nothing missing


class SyncPuller:
    """The asking side of one sync (see the module docstring)."""

    def __init__(self, replica: Replica, identity: Identity, *, peer: bytes | None = None, max_batches: int = 64):
        self.replica, self.identity, self.peer = replica, identity, peer
        self.max_batches = max_batches
        self.state = State.IDLE
        self.progress = Progress()
        self._targets: list[OpId] = []
        self._server_heads: list[OpId] = []
        self._already_held: list[OpId] = []  # ops of the last batch that we held before it came

    def start(self) -> bytes:
        """Begin (or begin again); returns the first request to send."""
        return self._step("start", None)

    def receive(self, data: bytes) -> bytes | None:
        """Feed the server's reply; returns the next request, or None when the sync is over.

        Raises `ProtocolError` for a malformed or unexpected reply (the state becomes FAILED).
        """
        try:
            envelope = decode(data, run=self.replica.run_id, kinds=SYNC_KINDS)
            if self.peer is not None and envelope.author != self.peer:
                raise ProtocolError("wrong-author", "the reply is not signed by the peer we are syncing with")
        except ProtocolError:
            self.state = State.FAILED
            raise
        event = "crdt.heads!" if envelope.kind == CRDT_HEADS.name and envelope.body["reply"] else envelope.kind
        return self._step(event, envelope)

    @property
    def done(self) -> bool:
        return self.state in (State.DONE, State.FAILED)

    # --- transitions ---------------------------------------------------------------------------

    def _step(self, event: str, envelope: Envelope | None) -> bytes | None:
        handler = _PULLER_TRANSITIONS.get((self.state, event))
        if handler is None:
            state, self.state = self.state, State.FAILED
            raise ProtocolError("unexpected-message", f"{event} is not expected in state {state.value}")
        return handler(self, envelope)

    def _send_heads(self, _envelope: None) -> bytes:
        self.progress = Progress()
        self.state = State.AWAIT_HEADS
        return self._message(CRDT_HEADS.name, {"heads": self.replica.heads[:MAX_PARENTS], "reply": False})

    def _on_heads(self, envelope: Envelope) -> bytes | None:
        self._targets = list(envelope.body["heads"])
        self._server_heads = list(envelope.body["heads"])
        self._already_held = []
        return self._want_or_finish(progressed=True)

    def _on_ops(self, envelope: Envelope) -> bytes | None:
        self.progress.batches += 1
        before = (self.progress.applied, self.progress.waiting)
        self._already_held = []
        for data in envelope.body["ops"]:
            self._add(data)
        new = (self.progress.applied, self.progress.waiting) != before
        # A batch of ops we already held still moves the sync on: the next `have` names them,
        # so the server skips their past (it could not see it from heads it does not know).
        return self._want_or_finish(progressed=new or (envelope.body["more"] and bool(self._already_held)))

    def _want_or_finish(self, *, progressed: bool) -> bytes | None:
        missing = self._missing()
        if not missing:
            self.progress.complete = True
        if not missing or not progressed or self.progress.batches >= self.max_batches:
            self.state = State.DONE
            return None
        self.state = State.FETCHING
        return self._message(CRDT_WANT.name, {"ids": missing[:MAX_WANT], "have": self._have()})

    # --- helpers ---------------------------------------------------------------------------------

    def _have(self) -> list[OpId]:
        """What to tell the server we hold: ops it certainly knows first (its own heads that we
        hold, ops it just sent that we already had), then our heads; at most MAX_PARENTS."""
        replica = self.replica
        known_to_server = [h for h in self._server_heads if h in replica] + self._already_held[::-1]
        have = list(dict.fromkeys(known_to_server + replica.heads))
        return sorted(have[:MAX_PARENTS])

    def _missing(self) -> list[OpId]:
        replica = self.replica
        self._targets = [t for t in self._targets if t not in replica and not replica.is_rejected(t)]
        return sorted(set(self._targets) | set(replica.wanted()))

    def _add(self, data: bytes) -> None:
        try:
            receipt = self.replica.add(data)
        except ProtocolError as error:
            self.progress.rejected.append((_name_of(data), error))
            return
        if receipt.duplicate:
            self._already_held.append(receipt.id)
        self.progress.applied += len(receipt.applied)
        self.progress.waiting += receipt.waiting
        self.progress.rejected.extend(receipt.rejected)
        self.progress.equivocations.extend(receipt.equivocations)

    def _message(self, kind: str, body: dict) -> bytes:
        return encode(self.identity, kind, body, run=self.replica.run_id)


def _name_of(data: bytes) -> OpId:
    """The op ID of `data` if it is shaped like an op, else the SHA-256 of the bytes (to report them)."""
    try:
        return op_id(data)
    except ProtocolError:
        return hashlib.sha256(data).digest()


_PULLER_TRANSITIONS = {
    (State.IDLE, "start"): SyncPuller._send_heads,
    (State.DONE, "start"): SyncPuller._send_heads,
    (State.AWAIT_HEADS, "crdt.heads!"): SyncPuller._on_heads,
    (State.FETCHING, "crdt.ops"): SyncPuller._on_ops,
}


@dataclass(frozen=True)
class Answer:
    reply: bytes
    peer_ahead: bool = False  # the asker's heads include ops we do not hold: pull from it too


class SyncServer:
    """The answering side of one sync session: one reply per request.

    Serving a `want` costs two walks of the DAG; a session that asks again for the same targets
    (the usual case: one batch after the other) continues from where the last batch ended
    instead, so a whole backlog costs about one walk. Use one `SyncServer` per session.
    """

    def __init__(self, replica: Replica, identity: Identity, *, batch_bytes: int = DEFAULT_BATCH_BYTES):
        self.replica, self.identity, self.batch_bytes = replica, identity, batch_bytes
        self._plan: tuple[tuple[OpId, ...], list[OpId], int] | None = None  # (want, ops to send, next index)

    def answer(self, data: bytes) -> Answer:
        """The reply to one request, or `ProtocolError` if it is not a request we serve."""
        return self.answer_envelope(decode(data, run=self.replica.run_id, kinds=SYNC_KINDS))

    def answer_envelope(self, envelope: Envelope) -> Answer:
        """Like `answer`, for a request its caller already decoded (to find the run it names)."""
        if envelope.run != self.replica.run_id:
            raise ProtocolError("wrong-run", "message belongs to another run")
        body, replica = envelope.body, self.replica
        if envelope.kind == CRDT_HEADS.name and not body["reply"]:
            self._plan = None  # a new session starts
            ahead = any(h not in replica and not replica.is_rejected(h) for h in body["heads"])
            reply = {"heads": replica.heads[:MAX_PARENTS], "reply": True}
            return Answer(encode(self.identity, CRDT_HEADS.name, reply, run=replica.run_id), ahead)
        if envelope.kind == CRDT_WANT.name:
            ops, more = self._batch(body["ids"], body["have"])
            return Answer(encode(self.identity, CRDT_OPS.name, {"ops": ops, "more": more}, run=replica.run_id))
        raise ProtocolError("unexpected-message", f"{envelope.kind} is not a sync request")

    def _batch(self, want: list[OpId], have: list[OpId]) -> tuple[list[bytes], bool]:
        """The next ops for `want`: at most MAX_BATCH_OPS and about `batch_bytes`; and whether more remain."""
        if self._plan is None or self._plan[0] != tuple(want):
            self._plan = (tuple(want), self.replica.difference(want, have), 0)
        key, order, start = self._plan
        batch, size, index = [], 0, start
        while index < len(order) and len(batch) < MAX_BATCH_OPS:
            data = self.replica.get(order[index])
            if batch and size + len(data) > self.batch_bytes:
                break
            batch.append(data)
            size += len(data)
            index += 1
        self._plan = (key, order, index)
        return batch, index < len(order)
