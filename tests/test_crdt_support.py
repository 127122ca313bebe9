"""Helpers shared by the crdt tests (this module holds no tests itself)."""

from __future__ import annotations

import hashlib

import msgpack

from locomesh.crdt import Genesis, Replica, Value
from locomesh.crdt.ops import parse_wire
from locomesh.node.agreement.proposing import own_value
from locomesh.protocol import Identity, pack
from locomesh.protocol.runs import sign_manifest

H1, H2, CKPT = b"\x11" * 32, b"\x22" * 32, b"\xcc" * 32


def keys(n: int, offset: int = 0) -> list[Identity]:
    """n deterministic identities."""
    return [Identity.from_seed((offset + i + 1).to_bytes(4, "big") * 8) for i in range(n)]


def genesis(creator: Identity, **manifest) -> Genesis:
    """A run created by `creator` (open, nobody admitted at genesis unless the test says so)."""
    manifest.setdefault("hparams", {"outer_lr": 0.7, "inner_steps": 100})
    return Genesis.from_manifest(sign_manifest(creator, task="synthetic", created=1_700_000_000, **manifest))


def joined_replica(members: list[Identity], **manifest) -> Replica:
    """A replica of a run created by members[0] in which every member has joined for round 1
    (the others admitted at genesis, unless the test gives `admitted`: a say once round 1 admits
    their joins)."""
    manifest.setdefault("admitted", [member.public_key for member in members[1:]])
    replica = Replica(genesis(members[0], **manifest))
    for member in members:
        replica.create(member, "join", round=1)
    return replica


def certify(replica: Replica, identities: list[Identity], state: bytes = H1, *, contributors: list[Identity] | None = None,
            attempt: int = 0) -> Value:
    """Certify the replica's next round: `contributors` (default: every identity that may
    contribute) commit if they have not, the attempt's proposer proposes the value of the commits
    (with the joins waiting and the precommits of the round before: `own_value`), and every member
    of the round's electorate among `identities` precommits it with `state`. The value."""
    chain = replica.chain
    round_ = chain.tip.round
    by_key = {identity.public_key: identity for identity in identities}
    may = replica.contributors(round_)
    for identity in contributors if contributors is not None else [i for i in identities if i.public_key in may]:
        if identity.public_key not in replica.commit_ops(round_):
            replica.create(identity, "commit", round=round_, hash=hashlib.sha256(identity.public_key).digest(), size=10)
    value = own_value(chain, replica.facts, set(replica.commit_ops(round_)))
    assert value is not None, "no valid value: too few commits of members with a say"
    epoch = chain.tip.epoch.number
    replica.create(by_key[chain.proposer(attempt)], "proposal", round=round_, epoch=epoch, attempt=attempt, valid=0,
                   **value.fields())
    for key in sorted(chain.tip.electorate):
        if key in by_key:
            replica.create(by_key[key], "precommit", round=round_, epoch=epoch, attempt=attempt, value=value.id,
                           state=state)
    assert chain.round == round_, "the round was not certified"
    return value


def attempt_proposed_by(replica: Replica, identities: list[Identity]) -> int:
    """The first attempt of the replica's next round whose proposer is among `identities` (for
    `certify` when some members are gone: each one gone costs an attempt)."""
    among = {identity.public_key for identity in identities}
    chain = replica.chain
    return next(a for a in range(len(chain.tip.electorate)) if chain.proposer(a) in among)


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
