"""The run state's facts: what the ops say, kept as sets that only grow.

Every op adds facts; no fact is ever removed or overwritten. Adding is set union (and the op
index is keyed by op ID), so the facts are a pure function of the op SET: any order of delivery,
any topological order, duplicates included, gives the same facts. Everything a user sees
(members, rounds, checkpoints, bans) is derived from the facts afterwards, in `view.py`; that
is where bans take effect, so an op by an author banned later keeps its place in the DAG while
its effects are dropped.

The facts are also what a snapshot carries: `encode` gives their one canonical form, its
SHA-256 is the state hash that a quorum signs, and the facts of the ops covered by a snapshot
plus the facts of the ops after it are the facts of a full replay (union is associative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol.schema import Bytes, Int, List, Map, Scalar, Spec, Struct

from .ops import Op, OpId

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024

_ROWS = 2**24


@dataclass(frozen=True)
class _Row(Spec):
    """A list of fixed length whose items each have their own spec (a table row)."""

    columns: tuple[Spec, ...]

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, list) or len(value) != len(self.columns):
            raise ProtocolError("bad-field", f"{path}: expected a row of {len(self.columns)} items")
        for index, (item, spec) in enumerate(zip(value, self.columns)):
            spec.check(item, f"{path}[{index}]")


def _table(*columns: Spec) -> List:
    return List(_Row(columns), max_len=_ROWS)


_hash, _int = Bytes(32, 32), Int(0, 2**50)
_FACTS_SCHEMA = Struct(
    {
        "ops": _table(_hash, _hash, Int(1, 2**40), _int),
        "joins": _table(_hash, Int(1, 2**40), _int),
        "leaves": _table(_hash, Int(1, 2**40), _int),
        "votes": _table(_hash, _int, _hash),
        "attests": _table(_hash, _int, _hash, _int),
        "hparams": _table(_int, _hash, _hash, Bytes(1, 64 * 1024)),
        "convicted": List(_hash, max_len=_ROWS),
        "snapshots": _table(_hash, _hash, List(_hash, max_len=64, min_len=1), _int),
    }
)


@dataclass
class Facts:
    ops: dict[OpId, tuple[bytes, int, int]] = field(default_factory=dict)  # id -> (author, seq, depth)
    joins: set[tuple[bytes, int, int]] = field(default_factory=set)  # (author, seq, round)
    leaves: set[tuple[bytes, int, int]] = field(default_factory=set)  # (author, seq, round)
    votes: set[tuple[bytes, int, bytes]] = field(default_factory=set)  # (author, round, hash)
    attests: set[tuple[bytes, int, bytes, int]] = field(default_factory=set)  # (author, round, id, size)
    hparams: set[tuple[int, OpId, bytes, bytes]] = field(default_factory=set)  # (round, op, author, packed changes)
    convicted: set[bytes] = field(default_factory=set)  # authors convicted by evidence ops
    # (author, state hash, frontier, op count)
    snapshots: set[tuple[bytes, bytes, tuple[OpId, ...], int]] = field(default_factory=set)
    # Derived index, kept incrementally: one op per (author, seq) unless the author forked.
    _chain: dict[tuple[bytes, int], OpId] = field(default_factory=dict, repr=False)
    forked: set[bytes] = field(default_factory=set)

    def add(self, op: Op, depth: int, convicts: bytes | None = None) -> None:
        """Add the facts of one op; `convicts` is the author its (verified) evidence convicts."""
        self._index(op.id, op.author, op.seq, depth)
        body, author = op.body, op.author
        match op.type:
            case "join":
                self.joins.add((author, op.seq, body["round"]))
            case "leave":
                self.leaves.add((author, op.seq, body["round"]))
            case "vote":
                self.votes.add((author, body["round"], body["hash"]))
            case "checkpoint" | "attest":
                self.attests.add((author, body["round"], body["id"], body["size"]))
            case "hparams":
                self.hparams.add((body["round"], op.id, author, pack(body["changes"])))
            case "snapshot":
                self.snapshots.add((author, body["state"], tuple(body["frontier"]), body["ops"]))
            case "evidence":
                assert convicts is not None, "evidence is verified before its facts are added"
                self.convicted.add(convicts)

    def _index(self, op_id: OpId, author: bytes, seq: int, depth: int) -> None:
        self.ops[op_id] = (author, seq, depth)
        other = self._chain.setdefault((author, seq), op_id)
        if other != op_id:
            self.forked.add(author)

    # --- the canonical form (snapshots) ------------------------------------------------------

    def encode(self) -> bytes:
        """The one byte form of these facts; its SHA-256 is the snapshot state hash."""
        return pack(
            {
                "ops": sorted([i, a, s, d] for i, (a, s, d) in self.ops.items()),
                "joins": sorted(list(row) for row in self.joins),
                "leaves": sorted(list(row) for row in self.leaves),
                "votes": sorted(list(row) for row in self.votes),
                "attests": sorted(list(row) for row in self.attests),
                "hparams": sorted(list(row) for row in self.hparams),
                "convicted": sorted(self.convicted),
                "snapshots": sorted([a, s, list(f), n] for a, s, f, n in self.snapshots),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Facts:
        """Facts from `encode`'s output, or `ProtocolError` for anything else."""
        raw = unpack(data, max_size=MAX_SNAPSHOT_BYTES)
        _FACTS_SCHEMA.check(raw, "facts")
        facts = cls()
        for op_id, author, seq, depth in raw["ops"]:
            facts._index(op_id, author, seq, depth)
        facts.joins = {tuple(row) for row in raw["joins"]}
        facts.leaves = {tuple(row) for row in raw["leaves"]}
        facts.votes = {tuple(row) for row in raw["votes"]}
        facts.attests = {tuple(row) for row in raw["attests"]}
        facts.hparams = {tuple(row) for row in raw["hparams"]}
        for row in raw["hparams"]:
            Map(Scalar(), max_len=64).check(unpack(row[3], max_size=64 * 1024), "facts.hparams")
        facts.convicted = set(raw["convicted"])
        facts.snapshots = {(a, s, tuple(f), n) for a, s, f, n in raw["snapshots"]}
        if facts.encode() != data:
            raise ProtocolError("non-canonical", "snapshot facts are not in their canonical order")
        return facts
