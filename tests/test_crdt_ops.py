"""The op format and run IDs: what one op must be, checked without any causal past."""

from __future__ import annotations

import base64
import hashlib

import msgpack
import pytest
from locomesh.crdt import Genesis, Replica, decode_op, encode_op, op_id
from locomesh.crdt.ops import parse_wire, seal_ops
from locomesh.protocol import ProtocolError, encode, pack
from locomesh.protocol.runs import format_run_id, parse_run_id, run_id, short_run_id, sign_manifest

from .test_crdt_support import H1, content_of, genesis, joined_replica, keys, reordered, rewrap

ALICE, BOB, CAROL = keys(3)


def test_run_id_is_the_hash_of_the_signed_manifest_and_has_a_short_form():
    manifest = sign_manifest(ALICE, task="synthetic", created=5)
    run = run_id(manifest)
    assert run == hashlib.sha256(manifest).digest() == Genesis.from_manifest(manifest).run_id
    text = format_run_id(run)
    assert len(text) == 52 and text == text.lower()
    assert short_run_id(run) == text[:16]
    assert parse_run_id(text) == parse_run_id(text.upper()) == parse_run_id(run.hex()) == run
    with pytest.raises(ProtocolError, match="bad-run-id"):
        parse_run_id(text[:16])


def test_a_run_id_is_taken_only_whole_and_canonical_or_as_a_unique_known_prefix():
    first, second = (run_id(sign_manifest(ALICE, task="synthetic", created=created)) for created in (5, 6))
    text = format_run_id(first)
    assert text[-1] in "aq"  # 52 characters carry 260 bits: the last 4 are always zero
    typo = text[:-1] + {"a": "b", "q": "r"}[text[-1]]  # decodes to the same bytes
    with pytest.raises(ProtocolError, match="no run ID ends in"):
        parse_run_id(typo)
    assert parse_run_id(text[:16], [first, second]) == first == parse_run_id(text[:8].upper(), [second, first])
    with pytest.raises(ProtocolError, match="no run this node knows starts with"):
        parse_run_id(text[:16], [second])
    with pytest.raises(ProtocolError, match="is not a run ID"):
        parse_run_id(text[:7], [first])  # too short to be a prefix
    with pytest.raises(ProtocolError, match="is not a run ID"):
        parse_run_id("not-a-run-id", [first])
    shared = text[:8]
    twin = base64.b32decode((shared + "a" * 44).upper() + "====")[:32]  # another ID with the same 8 first characters
    with pytest.raises(ProtocolError, match="starts 2 known runs"):
        parse_run_id(shared, [first, twin])


def test_genesis_rejects_anything_but_a_signed_manifest():
    with pytest.raises(ProtocolError):
        Genesis.from_manifest(encode(ALICE, "node.ping", {"nonce": b"12345678"}))
    manifest = sign_manifest(ALICE, task="synthetic", created=5)
    with pytest.raises(ProtocolError, match="bad-signature"):
        envelope = msgpack.unpackb(manifest, raw=False)
        envelope["body"]["seed"] = 1  # changed after signing
        Genesis.from_manifest(msgpack.packb(envelope, use_bin_type=True))


def test_op_id_is_the_hash_of_thecontent_of():
    run = genesis(ALICE).run_id
    data = encode_op(ALICE, run, "crdt.vote", [], 1, round=1, hash=H1)
    op = decode_op(data, run)
    assert op.id == op_id(data) == hashlib.sha256(parse_wire(data).content).digest()
    assert (op.type, op.seq, op.author, op.parents, op.data) == ("vote", 1, ALICE.public_key, (), data)


def _forge(data: bytes, **changes) -> bytes:
    """Re-encode an op's content with some fields changed and the old seal kept."""
    content = content_of(data)
    for path, value in changes.items():
        target = content
        *outer, last = path.split("__")
        for name in outer:
            target = target[name]
        target[last] = value
    return rewrap(data, msgpack.packb(content, use_bin_type=True))


def _sealed(run: bytes, kind: str, body: dict, *, run_in_content: bytes | None = None) -> bytes:
    """An op sealed by ALICE whose content is packed as given (no checks: for malformed content)."""
    content = pack({"author": ALICE.public_key, "body": body, "kind": kind, "run": run_in_content or run, "v": 1})
    return seal_ops(ALICE, run, [content])[0]


def _long_count(data: bytes) -> bytes:
    """The op with its seal's count (1) written in a 3-byte form: same value, other bytes."""
    wire = parse_wire(data)
    return b"\x95" + pack(wire.content) + b"\xcd\x00\x01" + pack(wire.index) + pack(wire.path) + pack(wire.sig)


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda d, run: _forge(d, body__round=2), "bad-signature"),  # changed after sealing
        (lambda d, run: _forge(d, author=BOB.public_key), "bad-signature"),  # claimed by another key
        (lambda d, run: rewrap(d, sig=bytes(64)), "bad-signature"),
        (lambda d, run: rewrap(d, index=1), "bad-seal"),  # index past the count
        (lambda d, run: rewrap(d, path=[H1]), "bad-seal"),  # a batch of one has no path
        (lambda d, run: rewrap(d, count=2), "bad-seal"),  # two leaves need a sibling hash
        (lambda d, run: rewrap(d, count=2, path=[H1]), "bad-signature"),  # a shape the author did not sign
        (lambda d, run: rewrap(d, sig=bytes(63)), "bad-op"),
        (lambda d, run: pack(content_of(d)), "bad-op"),  # bare content, no seal
        (lambda d, run: d + b"\x00", "trailing-bytes"),
        (lambda d, run: d[:-1], "malformed"),
        (lambda d, run: reordered(d), "non-canonical"),
        (lambda d, run: rewrap(d, content=parse_wire(d).content.replace(b"\xa3seq\x01", b"\xa3seq\xcd\x00\x01")),
         "non-canonical"),  # seq 1 in a 3-byte form
        (lambda d, run: _long_count(d), "non-canonical"),
        (lambda d, run: encode_op(ALICE, b"\x01" * 32, "crdt.vote", [], 1, round=1, hash=H1), "wrong-run"),
        (lambda d, run: _sealed(run, "crdt.vote", {"parents": [], "seq": 1, "round": 1, "hash": H1},
                                run_in_content=b"\x01" * 32), "wrong-run"),
        (lambda d, run: _sealed(run, "node.ping", {"nonce": b"12345678"}), "unexpected-kind"),
        (lambda d, run: _sealed(run, "crdt.vote", {"parents": [H1, b"\x00" * 32], "seq": 1, "round": 1, "hash": H1}),
         "bad-op"),  # parents not sorted: one op would have two IDs
        (lambda d, run: _sealed(run, "crdt.vote", {"parents": [H1] * 2, "seq": 1, "round": 1, "hash": H1}), "bad-op"),
        (lambda d, run: _forge(d, body__round=0), "bad-field"),  # round 0 is the genesis: nobody votes for it
        (lambda d, run: _forge(d, v=2), "bad-version"),
        (lambda d, run: _forge(d, body__parents=[bytes([i]) * 32 for i in range(200)]), "too-large"),
    ],
)
def test_bad_ops_are_rejected_with_a_typed_error(mutate, code):
    run = genesis(ALICE).run_id
    good = encode_op(ALICE, run, "crdt.vote", [], 1, round=1, hash=H1)
    bad = mutate(good, run)
    with pytest.raises(ProtocolError) as caught:
        decode_op(bad, run)
    assert caught.value.code == code


def test_too_many_parents_and_oversized_blobs_are_rejected():
    run = genesis(ALICE).run_id
    parents = sorted(hashlib.sha256(bytes([i])).digest() for i in range(65))
    body = {"parents": parents, "seq": 1, "round": 1, "hash": H1}
    with pytest.raises(ProtocolError, match="bad-field"):
        encode(ALICE, "crdt.vote", body, run=run)  # our own encoder refuses too
    with pytest.raises(ProtocolError, match="too-large"):
        decode_op(b"\x00" * 100_000, run)


def test_admission_and_hparam_writers_are_enforced_per_op():
    closed = genesis(ALICE, allowlist=[BOB.public_key])
    replica = Replica(closed)
    replica.create(ALICE, "join", round=1)  # the creator is always admitted
    replica.create(BOB, "join", round=1)
    intruder = encode_op(CAROL, closed.run_id, "crdt.join", [], 1, round=1)
    with pytest.raises(ProtocolError, match="not-admitted"):
        replica.add(intruder)
    with pytest.raises(ProtocolError, match="not-writer"):
        replica.create(BOB, "hparams", round=2, changes={"outer_lr": 9.0})
    replica.create(ALICE, "hparams", round=2, changes={"outer_lr": 0.5})
    assert replica.state.hparam_schedule == ((2, {"outer_lr": 0.5}),)
    assert sorted(replica.state.members) == sorted([ALICE.public_key, BOB.public_key])


def test_seq_must_extend_the_authors_own_chain():
    replica = joined_replica([ALICE, BOB])
    run = replica.run_id
    alice_join = min(replica.op_ids(), key=lambda i: replica.facts.ops[i][2])
    parents = replica.heads + [alice_join]  # an honest author lists its own newest op
    for wrong_seq in (1, 3):  # the join at seq 1 is among the parents, so 2 is the only right value
        bad = encode_op(ALICE, run, "crdt.vote", parents, wrong_seq, round=1, hash=H1)
        with pytest.raises(ProtocolError, match="bad-seq"):
            replica.add(bad)
    good = encode_op(ALICE, run, "crdt.vote", parents, 2, round=1, hash=H1)
    assert replica.add(good).applied == [op_id(good)]
