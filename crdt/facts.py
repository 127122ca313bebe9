"""The run state's facts: what the ops say, kept as sets that only grow.

Every op adds one row to its type's table (the row's shape is the type's: crdt/ops/); no fact is
ever removed or overwritten. Adding is set union (and the op index is keyed by op ID), so the
facts are a pure function of the op SET: any order of delivery, any topological order, duplicates
included, gives the same facts. What the rows mean for the run (the certified rounds, the
electorate, checkpoints, hyperparameters) is derived from them afterwards: crdt/chain.py builds
the certified history as rows arrive, crdt/view.py summarises it.

Beside the tables, `Facts` keeps indexes, each a pure function of the tables and updated as rows
are added, so the questions asked on every poll cost no scan of the whole log: rows by type,
round and author; referable ops by ID (what a round's value names); and the authors that
contradicted themselves: a fork (two ops at one place of an author's chain), or two statements
of one type at one place that differ (each type's `equivocation`: crdt/ops/base.py). Such an
author is *proven* to have equivocated; the ban takes effect in the electorate once a round's
value names the evidence (crdt/membership.py), but the proof is here at once.

The facts are also what a snapshot carries: `encode` gives their one canonical form, its
SHA-256 is the state hash that a quorum signs, and the facts of the ops covered by a snapshot
plus the facts of the ops after it are the facts of a full replay (union is associative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol.schema import Int, List, Map, Scalar

from .ops import REGISTRY, Op, OpId
from .ops.base import HASH, KEY, Row, thaw

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
_ROWS = 2**24
_OPS_ROW = Row((HASH, KEY, Int(1, 2**40), Int(1, 2**40)))  # (op ID, author, seq, depth)
# Types whose rows have a round: indexed by round and author.
_BY_ROUND = frozenset(name for name, entry in REGISTRY.items() if entry.custom_row is None and "round" in entry.fields)


@dataclass
class Facts:
    ops: dict[OpId, tuple[bytes, int, int]] = field(default_factory=dict)  # op -> (author, seq, depth)
    rows: dict[str, set[tuple]] = field(default_factory=lambda: {name: set() for name in REGISTRY})
    refs: dict[OpId, tuple[str, tuple]] = field(default_factory=dict)  # referable op -> (type, row)
    forked: set[bytes] = field(default_factory=set)  # two ops at one (author, seq)
    equivocated: set[bytes] = field(default_factory=set)  # two different statements at one place
    convicted: set[bytes] = field(default_factory=set)  # authors an evidence op convicts
    _chain: dict[tuple[bytes, int], OpId] = field(default_factory=dict, repr=False)
    _said: dict[tuple, dict[tuple, OpId | None]] = field(default_factory=dict, repr=False)  # place -> statement -> op
    _rounds: dict[str, dict[int, dict[bytes, set[tuple]]]] = field(
        default_factory=lambda: {name: {} for name in _BY_ROUND}, repr=False)

    def add(self, op: Op, depth: int, convicts: bytes | None = None) -> list[tuple[OpId, OpId]]:
        """Add the facts of one op; `convicts` is the author its (verified) evidence convicts.
        The pairs (earlier op, this op) of double statements it makes, for evidence."""
        self._index(op.id, op.author, op.seq, depth)
        return self._add_row(op.type, REGISTRY[op.type].row(op, convicts), op.id)

    # --- questions asked often -------------------------------------------------------------------

    def in_round(self, op_type: str, round_: int) -> dict[bytes, set[tuple]]:
        """author -> its rows of `op_type` naming round `round_`."""
        return self._rounds[op_type].get(round_, {})

    def commits_in(self, round_: int) -> dict[bytes, set[tuple[bytes, int]]]:
        """author -> the (hash, size) commitments it made for `round_` (more than one: it equivocated)."""
        return {a: {(row[3], row[4]) for row in rows} for a, rows in self.in_round("commit", round_).items()}

    def scores_in(self, round_: int) -> dict[bytes, set[tuple[tuple[bytes, ...], tuple[int, ...]]]]:
        """author -> the (authors, scores) it reported for `round_` (more than one: it equivocated)."""
        return {a: {(row[2], row[3]) for row in rows} for a, rows in self.in_round("score", round_).items()}

    def shard_results_in(self, round_: int, set_id: bytes) -> dict[int, dict[bytes, set[bytes]]]:
        """shard -> author -> the result hashes it signed for that shard of contributor set
        `set_id` in `round_` (more than one: it equivocated)."""
        results: dict[int, dict[bytes, set[bytes]]] = {}
        for author, rows in self.in_round("shard_result", round_).items():
            for _id, _author, _round, set_, shard, hash_ in rows:
                if set_ == set_id:
                    results.setdefault(shard, {}).setdefault(author, set()).add(hash_)
        return results

    def disputes_in(self, round_: int, set_id: bytes) -> dict[tuple[bytes, int, bytes], set[bytes]]:
        """(member, shard, hash) -> the authors that disputed the result `hash` that `member`
        signed (or, as far as these facts know, did not) for that shard of contributor set
        `set_id` in `round_`."""
        disputes: dict[tuple[bytes, int, bytes], set[bytes]] = {}
        for author, rows in self.in_round("dispute", round_).items():
            for _id, _author, _round, set_, shard, member, hash_ in rows:
                if set_ == set_id:
                    disputes.setdefault((member, shard, hash_), set()).add(author)
        return disputes

    def disputed_rounds(self) -> list[int]:
        return sorted(self._rounds["dispute"])

    def disputed_sets(self, round_: int) -> list[bytes]:
        return sorted({row[3] for rows in self.in_round("dispute", round_).values() for row in rows})

    @property
    def attests(self) -> set[tuple[bytes, int, bytes, int]]:
        """(author, round, checkpoint ID, size): a checkpoint op counts as its author's attestation."""
        return self.rows["checkpoint"] | self.rows["attest"]

    def statements_at(self, place: tuple | None) -> set[tuple]:
        """The statements made at `place` ((type, author, key values): `OpType.place`)."""
        return set(self._said.get(place, {})) if place is not None else set()

    def proven(self, author: bytes) -> bool:
        """Do these facts prove that `author` equivocated (a fork, a double statement, evidence)?"""
        return author in self.forked or author in self.equivocated or author in self.convicted

    # --- the indexes ----------------------------------------------------------------------------

    def _index(self, op_id: OpId, author: bytes, seq: int, depth: int) -> None:
        self.ops[op_id] = (author, seq, depth)
        other = self._chain.setdefault((author, seq), op_id)
        if other != op_id:
            self.forked.add(author)

    def _add_row(self, op_type: str, row: tuple, op_id: OpId | None = None) -> list[tuple[OpId, OpId]]:
        entry = REGISTRY[op_type]
        self.rows[op_type].add(row)
        if entry.referable:
            self.refs[row[0]] = (op_type, row)
        if op_type == "evidence":
            self.convicted.add(row[2])
        if op_type in _BY_ROUND:
            author = entry.column(row, "author")
            self._rounds[op_type].setdefault(entry.column(row, "round"), {}).setdefault(author, set()).add(row)
        place = entry.place(row)
        if place is None:
            return []
        said = self._said.setdefault(place, {})
        said.setdefault(entry.statement(row), op_id)
        if len(said) < 2:
            return []
        self.equivocated.add(place[1])
        earlier = next((other for statement, other in said.items() if other not in (None, op_id)), None)
        return [] if earlier is None or op_id is None else [(earlier, op_id)]

    # --- the canonical form (snapshots) ------------------------------------------------------

    def encode(self) -> bytes:
        """The one byte form of these facts; its SHA-256 is the snapshot state hash."""
        encoded: dict[str, Any] = {"ops": sorted([i, a, s, d] for i, (a, s, d) in self.ops.items())}
        for name, rows in sorted(self.rows.items()):
            if rows:
                encoded[name] = sorted([thaw(value) for value in row] for row in rows)
        return pack(encoded)

    @classmethod
    def decode(cls, data: bytes) -> Facts:
        """Facts from `encode`'s output, or `ProtocolError` for anything else."""
        raw = unpack(data, max_size=MAX_SNAPSHOT_BYTES)
        if not isinstance(raw, dict) or "ops" not in raw or not set(raw) <= {"ops", *REGISTRY}:
            raise ProtocolError("bad-field", "facts: a map of ops and the tables of op types")
        List(_OPS_ROW, max_len=_ROWS).check(raw["ops"], "facts.ops")
        facts = cls()
        for op_id, author, seq, depth in raw["ops"]:
            facts._index(op_id, author, seq, depth)
        for name, rows in raw.items():
            if name == "ops":
                continue
            List(REGISTRY[name].row_spec, max_len=_ROWS).check(rows, f"facts.{name}")
            for row in rows:
                if name == "hparams":
                    Map(Scalar(), max_len=64).check(unpack(row[3], max_size=64 * 1024), "facts.hparams")
                facts._add_row(name, tuple(tuple(value) if isinstance(value, list) else value for value in row))
        if facts.encode() != data:
            raise ProtocolError("non-canonical", "snapshot facts are not in their canonical order")
        return facts

