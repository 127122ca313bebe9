"""Compaction: a quorum-certified snapshot of the facts, and starting a replica from one.

A snapshot covers the down-set of a frontier (the frontier ops and all their ancestors). Its
state hash is SHA-256 of the canonical facts of exactly those ops (facts.py). Members who
computed the same facts each sign a `crdt.snapshot` op naming (state hash, frontier, op count);
more than 2/3 of the electorate, as the snapshot's own facts certify it, make it certified.

A newcomer given the facts bytes and the certificate ops checks the hash and the quorum on its
own, starts from the facts, and fetches only the ops after the frontier. Facts are a union, so
snapshot plus later ops is the same state as a full replay; the tests check exactly that.

The state hash itself is a claim: a replica that holds the ops can recompute it
(`facts_of_downset`), and an honest member signs only a snapshot it recomputed.
"""

from __future__ import annotations

import hashlib

from locomesh.protocol import ProtocolError

from .evidence import guilty_author
from .facts import Facts
from .genesis import Genesis
from .ops import OpId, decode_op
from .replica import Replica
from .chain import Chain
from .quorum import is_quorum


def facts_of_downset(replica: Replica, frontier: list[OpId]) -> Facts:
    """The facts of `frontier` and its ancestors, recomputed from the op bytes we hold."""
    covered = replica.ancestry(frontier)
    facts = Facts()
    for op_id in sorted(covered, key=lambda i: (replica.facts.ops[i][2], i)):
        op = replica.op(op_id)
        if op is None:
            raise ProtocolError("compacted", "part of this frontier's past is only known from a snapshot")
        convicts = None
        if op.type == "evidence":
            convicts = guilty_author(op.body["reason"], op.body["a"], op.body["b"], replica.run_id)
        facts.add(op, replica.facts.ops[op_id][2], convicts)
    return facts


def snapshot_fields(replica: Replica, frontier: list[OpId] | None = None) -> tuple[dict, bytes]:
    """The body fields of a snapshot op over `frontier` (default: our heads), and the facts bytes."""
    frontier = sorted(frontier if frontier is not None else replica.heads)
    facts = facts_of_downset(replica, frontier)
    encoded = facts.encode()
    state = hashlib.sha256(encoded).digest()
    fields = {"state": state, "frontier": frontier, "ops": len(facts.ops)}  # one fact row per covered op
    return fields, encoded


def load_snapshot(genesis: Genesis, facts_bytes: bytes, certificate: list[bytes], **limits: int) -> Replica:
    """A replica started from certified snapshot facts; `ProtocolError` if the proof fails.

    The certificate ops are added to the new replica too (they wait if their own parents lie
    after the frontier), so the replica ends up holding the same ops as its peers.
    """
    facts = Facts.decode(facts_bytes)
    state = hashlib.sha256(facts_bytes).digest()
    ops = [decode_op(data, genesis.run_id) for data in certificate]
    claims = {(op.type, op.body.get("state"), tuple(op.body.get("frontier", ())), op.body.get("ops")) for op in ops}
    if len(claims) != 1 or len(ops) != len({op.author for op in ops}):
        raise ProtocolError("bad-snapshot", "a certificate is snapshot ops by distinct authors naming one snapshot")
    ((op_type, claimed, frontier, count),) = claims
    if op_type != "snapshot":
        raise ProtocolError("bad-snapshot", "a certificate is made of snapshot ops")
    if claimed != state or count != len(facts.ops) or not set(frontier) <= facts.ops.keys():
        raise ProtocolError("bad-snapshot", "the facts do not match the snapshot the certificate names")
    electorate = Chain(genesis, facts).tip.electorate
    signers = {op.author for op in ops} & electorate
    if not is_quorum(len(signers), len(electorate)):
        raise ProtocolError("bad-snapshot", f"{len(signers)} of {len(electorate)} members of the electorate "
                                            "signed: not a quorum")
    replica = Replica.from_facts(genesis, facts, list(frontier), **limits)
    for data in certificate:
        replica.add(data)
    return replica
