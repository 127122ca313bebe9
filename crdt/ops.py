"""One op of the run-state log: a signed envelope whose hash is its ID.

An op is an envelope of one of the `crdt.*` op kinds (protocol/kinds.py). Its body carries
`parents` (IDs of the ops the author had as heads, sorted and distinct), `seq` (one more than
the author's own newest op among its dependencies, or 1) and the fields of its type. The op ID
is SHA-256 of the envelope bytes, so an op names its whole causal past by hash (Kleppmann &
Howard, "Making CRDTs Byzantine Fault Tolerant", PaPoC 2022): one valid signature, one ID.

Decoding an op checks everything that depends on the op alone: canonical bytes, kind, size
cap, run, schema, signature, sorted parents. What depends on the causal past (the `seq` rule)
is checked by the replica once the dependencies are present.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from locomesh.protocol import Envelope, Identity, ProtocolError, decode, encode
from locomesh.protocol.kinds import CRDT_EVIDENCE, CRDT_OP_KINDS

OpId = bytes
MAX_OP_ENVELOPE = CRDT_EVIDENCE.max_size


@dataclass(frozen=True, slots=True)
class Op:
    """A decoded, signature-checked op."""

    id: OpId
    kind: str
    author: bytes
    seq: int
    parents: tuple[OpId, ...]
    body: dict[str, Any]
    data: bytes

    @property
    def type(self) -> str:
        """The op type without the `crdt.` prefix: "join", "vote", ..."""
        return self.kind[5:]

    @property
    def dependencies(self) -> tuple[OpId, ...]:
        """The ops that must be present before this one applies: its parents, and for a
        snapshot the frontier it covers (so a snapshot never precedes what it summarises)."""
        if self.kind == "crdt.snapshot":
            return tuple(sorted(set(self.parents) | set(self.body["frontier"])))
        return self.parents


def op_id(data: bytes) -> OpId:
    return hashlib.sha256(data).digest()


def decode_op(data: bytes, run: bytes) -> Op:
    """Parse and verify one op of run `run`, or raise `ProtocolError`."""
    if len(data) > MAX_OP_ENVELOPE:
        raise ProtocolError("too-large", f"an op of {len(data)} bytes is over the cap of {MAX_OP_ENVELOPE}")
    envelope = decode(data, run=run, kinds=CRDT_OP_KINDS)
    return _from_envelope(envelope, data)


def encode_op(identity: Identity, run: bytes, kind: str, parents: list[OpId], seq: int, **fields: Any) -> bytes:
    """Sign a new op; `parents` are sorted here, as the format demands."""
    body = {"parents": sorted(set(parents)), "seq": seq, **fields}
    if kind == "crdt.snapshot":
        body["frontier"] = sorted(set(body["frontier"]))
    return encode(identity, kind, body, run=run)


def _from_envelope(envelope: Envelope, data: bytes) -> Op:
    body = envelope.body
    parents = tuple(body["parents"])
    _require_sorted(parents, "parents")
    if envelope.kind == "crdt.snapshot":
        _require_sorted(tuple(body["frontier"]), "frontier")
    return Op(op_id(data), envelope.kind, envelope.author, body["seq"], parents, body, data)


def _require_sorted(ids: tuple[bytes, ...], name: str) -> None:
    # One op, one encoding: a list of IDs that could be reordered would give the same op
    # two IDs, so only the strictly ascending order is accepted.
    if any(a >= b for a, b in zip(ids, ids[1:])):
        raise ProtocolError("bad-op", f"{name} must be sorted and distinct")
