"""The op format and run IDs: what one op must be, checked without any causal past."""

from __future__ import annotations

import base64
import hashlib

import msgpack
import pytest
from locomesh.crdt import Genesis, InvalidValue, Replica, Value, decode_op, encode_op, op_id
from locomesh.crdt.ops import MAX_OP_WIRE, parse_wire, seal_ops
from locomesh.protocol import ProtocolError, encode, pack
from locomesh.protocol.runs import format_run_id, parse_run_id, run_id, short_run_id, sign_manifest

from .test_crdt_support import H1, certify, content_of, genesis, joined_replica, keys, reordered, rewrap

ALICE, BOB, CAROL = keys(3)
COMMIT = {"round": 1, "hash": H1, "size": 1}


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
    data = encode_op(ALICE, run, "crdt.commit", [], 1, **COMMIT)
    op = decode_op(data, run)
    assert op.id == op_id(data) == hashlib.sha256(parse_wire(data).content).digest()
    assert (op.type, op.seq, op.author, op.parents, op.data) == ("commit", 1, ALICE.public_key, (), data)


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
        (lambda d, run: encode_op(ALICE, b"\x01" * 32, "crdt.commit", [], 1, **COMMIT), "wrong-run"),
        (lambda d, run: _sealed(run, "crdt.commit", {"parents": [], "seq": 1, **COMMIT}, run_in_content=b"\x01" * 32),
         "wrong-run"),
        (lambda d, run: _sealed(run, "node.ping", {"nonce": b"12345678"}), "unexpected-kind"),
        (lambda d, run: _sealed(run, "crdt.commit", {"parents": [H1, b"\x00" * 32], "seq": 1, **COMMIT}),
         "bad-op"),  # parents not sorted: one op would have two IDs
        (lambda d, run: _sealed(run, "crdt.commit", {"parents": [H1] * 2, "seq": 1, **COMMIT}), "bad-op"),
        (lambda d, run: _forge(d, body__round=0), "bad-field"),  # round 0 is the genesis: nobody commits to it
        (lambda d, run: _forge(d, v=2), "bad-version"),
        (lambda d, run: _forge(d, body__parents=[bytes([i]) * 32 for i in range(200)]), "too-large"),
    ],
)
def test_bad_ops_are_rejected_with_a_typed_error(mutate, code):
    run = genesis(ALICE).run_id
    good = encode_op(ALICE, run, "crdt.commit", [], 1, **COMMIT)
    bad = mutate(good, run)
    with pytest.raises(ProtocolError) as caught:
        decode_op(bad, run)
    assert caught.value.code == code


def test_too_many_parents_and_oversized_blobs_are_rejected():
    run = genesis(ALICE).run_id
    parents = sorted(hashlib.sha256(bytes([i])).digest() for i in range(65))
    body = {"parents": parents, "seq": 1, **COMMIT}
    with pytest.raises(ProtocolError, match="bad-field"):
        encode(ALICE, "crdt.commit", body, run=run)  # our own encoder refuses too
    with pytest.raises(ProtocolError, match="too-large"):
        decode_op(b"\x00" * (MAX_OP_WIRE + 1), run)


def test_admission_and_hparam_writers_are_enforced():
    """In a run that admits only the keys its creator admitted, a join of another key is a valid op
    (it proves nothing wrong) that no value may admit, until the creator admits the key; a
    hyperparameter change by a key the genesis does not name is refused as an op."""
    closed = genesis(ALICE, admission="creator", admitted=[BOB.public_key])
    replica = Replica(closed)
    replica.create(ALICE, "join", round=1)  # the creator is always admitted
    replica.create(BOB, "join", round=1)
    intruder = encode_op(CAROL, closed.run_id, "crdt.join", [], 1, round=1)
    replica.add(intruder)
    replica.create(ALICE, "commit", round=1, hash=H1, size=1)
    forced = Value(1, tuple(replica.commit_ops(1).values()), (op_id(intruder),))
    with pytest.raises(InvalidValue, match="cannot be admitted"):
        replica.chain.read(forced)
    with pytest.raises(ProtocolError, match="not-writer"):
        replica.create(BOB, "hparams", round=2, changes={"outer_lr": 9.0})
    replica.create(ALICE, "hparams", round=2, changes={"outer_lr": 0.5})
    assert replica.state.hparam_schedule == ((2, {"outer_lr": 0.5}),)
    assert op_id(intruder) not in certify(replica, [ALICE, BOB]).members
    assert sorted(replica.state.members) == sorted([ALICE.public_key, BOB.public_key])
    assert sorted(replica.state.electorate) == sorted([ALICE.public_key, BOB.public_key])
    replica.create(ALICE, "admit", key=CAROL.public_key)
    assert op_id(intruder) in certify(replica, [ALICE, BOB]).members
    assert CAROL.public_key in replica.state.electorate


def test_seq_must_extend_the_authors_own_chain():
    replica = joined_replica([ALICE, BOB])
    run = replica.run_id
    alice_join = min(replica.op_ids(), key=lambda i: replica.facts.ops[i][2])
    parents = replica.heads + [alice_join]  # an honest author lists its own newest op
    for wrong_seq in (1, 3):  # the join at seq 1 is among the parents, so 2 is the only right value
        bad = encode_op(ALICE, run, "crdt.commit", parents, wrong_seq, **COMMIT)
        with pytest.raises(ProtocolError, match="bad-seq"):
            replica.add(bad)
    good = encode_op(ALICE, run, "crdt.commit", parents, 2, **COMMIT)
    assert replica.add(good).applied == [op_id(good)]
