"""One replica of a run's state: the op DAG, its validation, and the certified history it holds.

Theory of operation. `add(bytes)` is the one way in. An op is decoded and its seal checked
once (ops/wire.py, seal.py); an op already held, applied or waiting, costs a parse, one SHA-256
and a dict lookup, which is the cache of verified op IDs; the other ops of a sealed batch
skip the signature check (`SealCache`). If all its dependencies are applied, it is applied
now; otherwise it waits in the bounded pending buffer (pending.py) and every op it releases
is applied in turn. Applying checks what depends on the causal past (the `seq` rule,
evidence, and what one author may write: members only, a few ops per round and a budget per
window of rounds, rounds backed by other members' precommits; limits.py), records the op's
facts (facts.py), hands its row to the chain (chain.py: the certified history, built as ops
arrive) and updates the heads. An authenticated op that fails is rejected with a
`ProtocolError`, remembered by ID (bounded), and every op waiting on it is rejected too; bytes
that fail before their seal proved the author are refused and forgotten, since the ID names only
the content and a good copy may follow. No step reads a clock or depends on arrival order, so two
replicas holding the same ops hold the same facts, chain and `state` (view.py), whatever order
the ops came in.

Writing: `create` seals one op; `create_batch` chains several ops of one author and seals
them with one signature, which is what makes a backlog cheap to verify.

The `seq` rule: an op's `seq` is one more than the largest `seq` among its dependencies by
the same author, or 1 when none is by that author. An honest author always lists its own
newest op, so its ops form one chain; two ops by one author with one `seq` are a fork, and two
ops that state different things at one place (crdt/ops/) a double statement: the facts prove
both, and `Receipt.equivocations` hands the pair to the caller, which publishes it as evidence
(replicas that saw one side learn of it; a round's value names the evidence and the ban takes
effect).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from locomesh.protocol import Identity, ProtocolError
from locomesh.protocol.kinds import MAX_PARENTS

from .chain import Chain
from .evidence import ban_reason, guilty_author
from .facts import Facts
from .genesis import Genesis
from .limits import AHEAD, Limits
from .membership import JOIN_FRESH
from .ops import REGISTRY, Op, OpId, content_id, decode_op, decode_wire, op_content, parse_wire, seal_ops
from .pending import PendingBuffer
from .seal import SealCache
from .view import Checkpoint, RunState, checkpoint_candidates, derive

MiB = 1024 * 1024


@dataclass
class Receipt:
    """What one `add` did."""

    id: OpId
    duplicate: bool = False
    applied: list[OpId] = field(default_factory=list)  # this op and every op it released
    waiting: bool = False  # this op is parked in the pending buffer
    evicted: list[OpId] = field(default_factory=list)  # pending ops dropped to make room
    rejected: list[tuple[OpId, ProtocolError]] = field(default_factory=list)  # released ops found invalid
    equivocations: list[tuple[Op, Op]] = field(default_factory=list)  # conflicting pairs seen


class Replica:
    def __init__(
        self,
        genesis: Genesis,
        *,
        max_pending_ops: int = 10_000,
        max_pending_bytes: int = 32 * MiB,
        max_rejected: int = 100_000,
    ) -> None:
        self.genesis = genesis
        self.run_id = genesis.run_id
        self.facts = Facts()
        self.pending = PendingBuffer(max_pending_ops, max_pending_bytes)
        self._data: dict[OpId, bytes] = {}  # applied ops we can serve (not those compacted away)
        self._deps: dict[OpId, tuple[OpId, ...]] = {}
        self._heads: set[OpId] = set()
        self._rejected: OrderedDict[OpId, ProtocolError] = OrderedDict()
        self._max_rejected = max_rejected
        self._seen_seq: dict[tuple[bytes, int], OpId] = {}  # first op per (author, seq), applied or waiting
        self._newest: dict[bytes, tuple[int, OpId]] = {}  # author -> its newest applied (seq, id)
        self.limits = Limits(genesis.trusted)  # what each author may still write (limits.py)
        self.chain = Chain(genesis, self.facts)  # the certified history, as ops arrive (chain.py)
        self._state: RunState | None = None
        self._seals = SealCache()
        # Called (no arguments) after every op applied: how a reader waits for news without polling.
        self.listeners: list[Callable[[], None]] = []
        # Called with the bytes of every op applied, in the order applied (parents first): how a
        # node keeps its replica on disk (node/replication/op_log.py).
        self.sinks: list[Callable[[bytes], None]] = []

    @classmethod
    def from_facts(cls, genesis: Genesis, facts: Facts, heads: list[OpId], **limits: int) -> Replica:
        """A replica that starts from the facts of a snapshot instead of the ops behind them.

        The covered ops count as applied (their IDs, authors, seqs and depths are in the
        facts) but cannot be served to peers: their bytes are not here.
        """
        replica = cls(genesis, **limits)
        replica.facts = facts
        replica.limits = Limits.covering(facts, genesis.trusted)
        replica.chain = Chain(genesis, facts)
        replica._heads = set(heads)
        for op, (author, seq, _depth) in facts.ops.items():
            replica._seen_seq.setdefault((author, seq), op)
            if seq > replica._newest.get(author, (0, b""))[0]:
                replica._newest[author] = (seq, op)
        return replica

    # --- reading ------------------------------------------------------------------------------

    def __contains__(self, op: OpId) -> bool:
        """Is this op applied (or covered by the snapshot we started from)?"""
        return op in self.facts.ops

    def __len__(self) -> int:
        return len(self.facts.ops)

    @property
    def heads(self) -> list[OpId]:
        return sorted(self._heads)

    def is_rejected(self, op: OpId) -> bool:
        """Did this op fail validation here (remembered for the last `max_rejected` failures)?"""
        return op in self._rejected

    def get(self, op: OpId) -> bytes | None:
        return self._data.get(op)

    def op_ids(self) -> frozenset[OpId]:
        return frozenset(self.facts.ops)

    def wanted(self) -> list[OpId]:
        """Dependencies that waiting ops lack: what anti-entropy should ask peers for."""
        return sorted(self.pending.wanted())

    @property
    def state(self) -> RunState:
        """The run state summarised (recomputed after changes, then cached)."""
        if self._state is None:
            self._state = derive(self.chain, self.facts, self.genesis)
        return self._state

    def electorate(self, round_: int) -> frozenset[bytes]:
        """Who proposes and votes in round `round_`: the tip's electorate in its epoch now, or the
        electorate that certified a certified round (empty for a round past the tip)."""
        if round_ == self.chain.tip.round:
            return self.chain.tip.electorate
        certificate = self.chain.certificates.get(round_)
        return frozenset() if certificate is None else certificate.electorate

    def contributors(self, round_: int) -> frozenset[bytes]:
        """Who may commit a payload for round `round_` (the round under way: crdt/value.py's rule
        1): roster keys with a say, the fresh keys its slate draws, and admitted keys whose join
        is waiting (a value may admit them with their payload, and with the creator's admission of
        them); empty for another round."""
        tip = self.chain.tip
        if round_ != tip.round:
            return frozenset()
        membership = tip.membership
        say = {key for key, member in membership.roster.items() if member.say}
        admitted = membership.admitted | self.genesis.trusted
        if self.genesis.admission != "electorate":  # the creator's admissions come with the join they admit
            admitted |= {key for _op, author, key in self.facts.rows["admit"] if author == self.genesis.creator}
        joining = {key for key in self.joining() if key in admitted}
        return frozenset(say | set(membership.slate(tip.seed)) | joining)

    def joining(self) -> set[bytes]:
        """Keys on no roster, not banned, whose join (not stale: crdt/membership.py) waits for a value."""
        tip = self.chain.tip
        m = tip.membership
        keys: set[bytes] = set()
        for round_ in range(max(0, tip.round - JOIN_FRESH), tip.round + AHEAD + 1):
            keys.update(key for key in self.facts.in_round("join", round_) if key not in m.roster and key not in m.banned)
        return keys

    def commits(self, round_: int) -> dict[bytes, tuple[bytes, int]]:
        """author -> (payload ID, size) of round `round_`'s commitments, by authors with exactly one
        (two: an equivocation), neither banned nor proven to have equivocated. Reads the facts'
        per-round index: cheap enough to call on every poll."""
        banned = self.chain.tip.membership.banned
        commits = {}
        for author, said in self.facts.commits_in(round_).items():
            if len(said) == 1 and author not in banned and not self.facts.proven(author):
                (commits[author],) = said
        return commits

    def commit_ops(self, round_: int) -> dict[bytes, OpId]:
        """author -> the ID of its commit op for round `round_` (for authors with exactly one)."""
        return {author: next(iter(rows))[0] for author, rows in self.facts.in_round("commit", round_).items()
                if len(rows) == 1}

    def checkpoint_candidates(self, round_: int) -> tuple[Checkpoint, ...]:
        """The checkpoints of certified round `round_` its voters attested, most attested first."""
        return checkpoint_candidates(self.chain, self.facts, round_)

    def shard_results(self, round_: int, set_id: bytes) -> dict[int, dict[bytes, set[bytes]]]:
        """shard -> author -> the result hashes it signed for that shard of contributor set
        `set_id` in round `round_`, every author's (more than one hash: it equivocated, a ban)."""
        return self.facts.shard_results_in(round_, set_id)

    def disputes(self, round_: int, set_id: bytes) -> dict[tuple[bytes, int, bytes], set[bytes]]:
        """(member, shard, hash) -> the authors that disputed the result `hash` of that shard of
        contributor set `set_id` in round `round_` as `member`'s."""
        return self.facts.disputes_in(round_, set_id)

    def ban_reason(self, author: bytes) -> str | None:
        """Why the run bans `author` (or will, once a round names the proof), in words; None if it does not."""
        return ban_reason(self.facts, author, self.chain)

    # --- writing ------------------------------------------------------------------------------

    def add(self, data: bytes) -> Receipt:
        """Take one op from anywhere; raise `ProtocolError` if this op is invalid.

        A valid op is applied, or parked until its dependencies arrive. Ops that it releases
        and that turn out invalid are listed in `Receipt.rejected`, not raised. A rejection is
        remembered by op ID (and rejects the ops waiting on it) only once the seal proved who
        wrote the op: bytes that are no op, or a broken seal, say nothing about the content the
        ID names, and a copy with a good seal may still come.
        """
        wire = parse_wire(data)
        receipt = Receipt(wire.id)
        if receipt.id in self.facts.ops or receipt.id in self.pending:
            receipt.duplicate = True
            return receipt
        if receipt.id in self._rejected:
            raise _copy(self._rejected[receipt.id])
        op = decode_wire(wire, self.run_id, self._seals)
        try:
            self._take(op, receipt)
        except ProtocolError:
            self._reject_waiters(receipt.id, receipt)  # ops waiting for this one can never apply
            raise
        return receipt

    def _take(self, op: Op, receipt: Receipt) -> None:
        try:
            self._check_writer(op.author, op.type)
        except ProtocolError as error:
            raise self._reject(op.id, error) from None
        self._note_seq(op, receipt)
        if any(dep in self._rejected for dep in op.dependencies):
            raise self._reject(op.id, ProtocolError("invalid-parent", "a dependency of this op is invalid"))
        missing = {dep for dep in op.dependencies if dep not in self.facts.ops}
        if missing:
            receipt.waiting = True
            receipt.evicted = self.pending.park(op, missing)
            return
        self._apply(op, receipt)  # raises for this op itself
        receipt.applied.append(op.id)
        self._release(op.id, receipt)

    def create(self, identity: Identity, op_type: str, **fields: Any) -> bytes:
        """Write a new op as `identity`, on top of our heads, apply it and return its bytes."""
        return self.create_batch(identity, [(op_type, fields)])[0]

    def create_batch(self, identity: Identity, ops: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        """Write several ops as `identity` under one seal (one signature), apply them, return their bytes.

        The first op goes on top of our heads, each next one on top of the one before (its
        only parent), so the batch is one stretch of the author's chain. At most
        `MAX_SEAL_OPS` ops (`ValueError` beyond); every op is checked before any is sealed
        (`ProtocolError` if one breaks the genesis rules or the limits, limits.py).
        """
        author = identity.public_key
        seq, newest = self._newest.get(author, (0, None))
        parents = self._parents_for(newest)
        link, backing = None if newest is None else self.limits.link(newest), self.limits.backing(parents)
        contents = []
        for op_type, fields in ops:
            self._check_writer(author, op_type)
            content = op_content(author, self.run_id, f"crdt.{op_type}", parents, seq + 1, **fields)
            link = self.limits.next_link(op_type, fields, link, backing, author, len(content))
            backing = link.backing
            seq += 1
            contents.append(content)
            parents = [content_id(contents[-1])]
        sealed = seal_ops(identity, self.run_id, contents)
        for data in sealed:
            if self.add(data).id not in self.facts.ops:
                raise ProtocolError("not-applied", "our own op did not apply")
        return sealed

    def op(self, op_id_: OpId) -> Op | None:
        """The decoded op, if we hold its bytes."""
        data = self._data.get(op_id_)
        return None if data is None else decode_op(data, self.run_id, self._seals)

    # --- inside -------------------------------------------------------------------------------

    def _check_writer(self, author: bytes, op_type: str) -> None:
        """The genesis rule on who may write (hyperparameter changes: the keys it names)."""
        self.genesis.check_author(author, op_type)

    def _apply(self, op: Op, receipt: Receipt) -> None:
        """Check what depends on the causal past, then record the op; raise if invalid."""
        try:
            depth = self._depth_checking_seq(op)
            link = self.limits.check(op, self.facts.ops)
            convicts = None
            if op.type == "evidence":
                convicts = guilty_author(op.body["reason"], op.body["a"], op.body["b"], self.run_id)
        except ProtocolError as error:
            raise self._reject(op.id, error) from None
        doubles = self.facts.add(op, depth, convicts)
        self.limits.record(op.id, link)
        self._data[op.id] = op.data
        self._deps[op.id] = op.dependencies
        self._heads.difference_update(op.dependencies)
        self._heads.add(op.id)
        if op.seq > self._newest.get(op.author, (0, b""))[0]:
            self._newest[op.author] = (op.seq, op.id)
        self._state = None
        self.chain.on_row(op.type, REGISTRY[op.type].row(op, convicts))
        for earlier, _this in doubles:
            other = self.op(earlier)
            if other is not None:
                receipt.equivocations.append((other, op))
        for sink in self.sinks:
            sink(op.data)
        for listener in self.listeners:
            listener()

    def _depth_checking_seq(self, op: Op) -> int:
        """The op's depth in the DAG (1 + its deepest dependency); `ProtocolError` if its seq is wrong."""
        own_seq = deepest = 0
        for dep in op.dependencies:  # one pass: ops arrive by the thousand
            author, seq, depth = self.facts.ops[dep]
            if author == op.author and seq > own_seq:
                own_seq = seq
            deepest = max(deepest, depth)
        if op.seq != own_seq + 1:
            raise ProtocolError("bad-seq", f"seq {op.seq} should be {own_seq + 1}: one past the author's newest parent")
        return deepest + 1

    def _release(self, applied: OpId, receipt: Receipt) -> None:
        """Apply every waiting op that `applied` completes, and what those complete, in turn."""
        queue = [applied]
        while queue:
            for ready in self.pending.resolve(queue.pop()):
                try:
                    self._apply(ready, receipt)
                except ProtocolError as error:
                    receipt.rejected.append((ready.id, error))
                    self._reject_waiters(ready.id, receipt)
                    continue
                receipt.applied.append(ready.id)
                queue.append(ready.id)

    def _reject_waiters(self, invalid: OpId, receipt: Receipt) -> None:
        queue = [invalid]
        while queue:
            for op in self.pending.reject_waiters(queue.pop()):
                error = self._reject(op.id, ProtocolError("invalid-parent", "a dependency of this op is invalid"))
                receipt.rejected.append((op.id, error))
                queue.append(op.id)

    def _reject(self, op: OpId, error: ProtocolError) -> ProtocolError:
        # A copy: a raised error's traceback holds the frames that raised it, the op among them,
        # and a remembered rejection must cost its ID and a line of text, not the op.
        self._rejected[op] = _copy(error)
        if len(self._rejected) > self._max_rejected:
            self._rejected.popitem(last=False)
        return error

    def _note_seq(self, op: Op, receipt: Receipt) -> None:
        """Spot a second op at one author's `seq`: signed proof of a fork, even if it never applies."""
        first = self._seen_seq.setdefault((op.author, op.seq), op.id)
        if first != op.id:
            other = self._data.get(first) or getattr(self.pending.get(first), "data", None)
            if other is not None:
                receipt.equivocations.append((decode_op(other, self.run_id, self._seals), op))

    def _parents_for(self, own_newest: OpId | None) -> list[OpId]:
        """Our heads, at most MAX_PARENTS of them: our own newest op always, then the deepest."""
        heads = sorted(self._heads, key=lambda h: (-self.facts.ops[h][2], h))
        chosen = [own_newest] if own_newest is not None else []
        chosen += [h for h in heads if h != own_newest][: MAX_PARENTS - len(chosen)]
        return chosen

    # --- for anti-entropy ---------------------------------------------------------------------

    def ancestry(self, roots: list[OpId]) -> set[OpId]:
        """`roots` we hold and all their ancestors that we hold the edges of."""
        seen: set[OpId] = set()
        stack = [r for r in roots if r in self.facts.ops]
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(d for d in self._deps.get(current, ()) if d not in seen)
        return seen

    def difference(self, want: list[OpId], have: list[OpId]) -> list[OpId]:
        """Ops we can serve in the past of `want` (inclusive) and not in the past of `have`,
        parents first (by depth, then ID)."""
        need = self.ancestry(want) - self.ancestry(have)
        return [i for _depth, i in sorted((self.facts.ops[i][2], i) for i in need if i in self._data)]


def _copy(error: ProtocolError) -> ProtocolError:
    """`error` again, without a traceback (nor the frames it holds)."""
    return ProtocolError(error.code, error.reason)
