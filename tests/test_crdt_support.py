"""Helpers shared by the crdt tests (this module holds no tests itself)."""

from __future__ import annotations

import msgpack

from locomesh.crdt import Genesis, Replica
from locomesh.crdt.ops import parse_wire
from locomesh.protocol import Identity, pack
from locomesh.protocol.runs import sign_manifest

H1, H2, CKPT = b"\x11" * 32, b"\x22" * 32, b"\xcc" * 32


def keys(n: int, offset: int = 0) -> list[Identity]:
    """n deterministic identities."""
    return [Identity.from_seed((offset + i + 1).to_bytes(4, "big") * 8) for i in range(n)]


def genesis(creator: Identity, **manifest) -> Genesis:
    """A run created by `creator`; every member weighs in quorums from its join (`influence`
    "joined") unless the test says otherwise: most tests here are not about earned influence."""
    manifest.setdefault("hparams", {"outer_lr": 0.7, "inner_steps": 100})
    manifest.setdefault("influence", "joined")
    return Genesis.from_manifest(sign_manifest(creator, task="synthetic", created=1_700_000_000, **manifest))


def joined_replica(members: list[Identity], **manifest) -> Replica:
    """A replica of a run created by members[0] in which every member has joined for round 1."""
    replica = Replica(genesis(members[0], **manifest))
    for member in members:
        replica.create(member, "join", round=1)
    return replica


def in_causal_order(replica: Replica) -> list[bytes]:
    """Every op the replica holds, parents before children."""
    order = sorted(replica.op_ids(), key=lambda i: (replica.facts.ops[i][2], i))
    return [replica.get(i) for i in order]


def rewrap(data: bytes, content: bytes | None = None, **seal) -> bytes:
    """The op with its content and/or seal fields replaced (the old signature kept unless given)."""
    wire = parse_wire(data)
    fields = {"count": wire.count, "index": wire.index, "path": wire.path, "sig": wire.sig, **seal}
    return pack([content or wire.content, fields["count"], fields["index"], fields["path"], fields["sig"]])


def content_of(data: bytes) -> dict:
    return msgpack.unpackb(parse_wire(data).content, raw=False)


def reordered(data: bytes) -> bytes:
    """The same op with its content's keys in reverse order: same value, non-canonical bytes."""
    return rewrap(data, msgpack.packb(dict(reversed(content_of(data).items())), use_bin_type=True))
