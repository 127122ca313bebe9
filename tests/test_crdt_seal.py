"""Seals: one signature per batch of ops, a Merkle path per op, each op still checked alone."""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest

from locomesh.crdt import Replica, decode_op, op_id
from locomesh.crdt import seal as seal_module
from locomesh.crdt.ops import op_content, parse_wire, seal_ops
from locomesh.crdt.seal import merkle_paths, root_from_path
from locomesh.protocol import ProtocolError
from locomesh.protocol.kinds import MAX_SEAL_OPS

from .test_crdt_support import H1, content_of, in_causal_order, joined_replica, keys, rewrap

A, B = keys(2)
COMMIT = {"round": 1, "hash": H1, "size": 1}
TWO_OPS = [("commit", COMMIT), ("attest", {"round": 1, "id": H1, "size": 1})]


def _leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(bytes([i])).digest() for i in range(n)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13, 64, MAX_SEAL_OPS])
def test_every_leaf_climbs_its_path_to_the_root(count):
    leaves = _leaves(count)
    root, paths = merkle_paths(leaves)
    if count == 1:  # a batch of one is a plain signed op: the root is its ID
        assert (root, paths) == (leaves[0], [[]])
    for index, (leaf, path) in enumerate(zip(leaves, paths)):
        assert len(path) <= (count - 1).bit_length()
        assert root_from_path(leaf, index, count, path) == root
        if count > 1:  # the same path from another place, or for another leaf, leads elsewhere
            assert root_from_path(leaves[(index + 1) % count], index, count, path) != root


def test_malformed_paths_are_refused():
    leaves = _leaves(5)
    _root, paths = merkle_paths(leaves)
    for index, count, path in [(5, 5, paths[0]), (-1, 5, paths[0]), (0, 5, paths[0][:-1]),
                               (0, 5, paths[0] + [H1]), (0, MAX_SEAL_OPS + 1, paths[0])]:
        with pytest.raises(ProtocolError, match="bad-seal"):
            root_from_path(leaves[0], index, count, path)


def test_a_batch_costs_one_signature_check_and_its_ops_apply_in_any_order(monkeypatch):
    source = joined_replica([A, B])
    batch = source.create_batch(A, [("attest", {"round": i // 4, "id": bytes([i]) * 32, "size": i}) for i in range(10)])
    assert [content_of(d)["body"]["seq"] for d in batch] == list(range(2, 12))  # one stretch of A's chain
    calls = []
    real_verify = seal_module.verify
    monkeypatch.setattr(seal_module, "verify", lambda *args: calls.append(1) or real_verify(*args))

    ops = in_causal_order(source)
    shuffled = ops[:]
    random.Random(7).shuffle(shuffled)
    replica = Replica(source.genesis)
    for data in shuffled:
        replica.add(data)
    assert replica.facts.encode() == source.facts.encode()
    assert len(calls) == len(ops) - len(batch) + 1  # the joins are sealed alone; the batch once
    for data in batch:  # and every op of the batch still stands alone
        assert decode_op(data, source.run_id).id == op_id(data)


def test_a_broken_seal_is_refused_without_poisoning_the_real_op():
    source = joined_replica([A])
    first, second = source.create_batch(A, TWO_OPS)
    replica = Replica(source.genesis)
    for data in in_causal_order(source)[:1]:
        replica.add(data)
    assert replica.add(second).waiting  # waits for `first`
    forged = rewrap(first, sig=bytes(64))
    with pytest.raises(ProtocolError, match="bad-signature"):
        replica.add(forged)
    assert not replica.is_rejected(op_id(first)) and op_id(second) in replica.pending
    receipt = replica.add(first)
    assert receipt.applied == [op_id(first), op_id(second)]


def test_a_verified_root_does_not_vouch_for_another_signature():
    source = joined_replica([A])
    first, second = source.create_batch(A, TWO_OPS)
    replica = Replica(source.genesis)
    replica.add(in_causal_order(source)[0])
    replica.add(first)  # the seal (root, signature) is now verified
    wire = parse_wire(second)
    other_sig = bytes([wire.sig[0] ^ 1]) + wire.sig[1:]
    with pytest.raises(ProtocolError, match="bad-signature"):
        replica.add(rewrap(second, sig=other_sig))
    assert replica.add(second).applied == [op_id(second)]


def test_the_same_content_under_two_seals_is_one_op():
    replica = joined_replica([A])
    content = op_content(A.public_key, replica.run_id, "crdt.commit", replica.heads, 2, **COMMIT)
    alone = seal_ops(A, replica.run_id, [content])[0]
    other = op_content(A.public_key, replica.run_id, "crdt.commit", replica.heads, 2, round=2, hash=H1, size=1)
    paired = seal_ops(A, replica.run_id, [other, content])[1]
    assert alone != paired and op_id(alone) == op_id(paired)
    replica.add(alone)
    assert replica.add(paired).duplicate


def test_batches_are_bounded_and_hold_one_authors_ops():
    replica = joined_replica([A, B])
    with pytest.raises(ValueError, match="a seal covers"):  # not a ProtocolError: every op is valid
        replica.create_batch(A, [("prevote", {"round": 1, "epoch": 0, "attempt": attempt, "value": H1})
                                 for attempt in range(MAX_SEAL_OPS + 1)])
    before = replica.op_ids()
    with pytest.raises(ProtocolError, match="not-writer"):  # B may not change hyperparameters: nothing is written
        replica.create_batch(B, [("commit", COMMIT), ("hparams", {"round": 2, "changes": {"x": 1}})])
    assert replica.op_ids() == before
    content = op_content(B.public_key, replica.run_id, "crdt.commit", replica.heads, 2, **COMMIT)
    with pytest.raises(ProtocolError, match="bad-signature"):
        replica.add(seal_ops(A, replica.run_id, [content])[0])  # B's op sealed by A


def test_nested_maps_must_be_in_canonical_order_too():
    replica = joined_replica([A])
    data = replica.create(A, "hparams", round=2, changes={"a": 1, "b": 2})
    content = content_of(data)
    content["body"]["changes"] = {"b": 2, "a": 1}
    bad = seal_ops(A, replica.run_id, [msgpack.packb(content, use_bin_type=True)])[0]
    with pytest.raises(ProtocolError, match="non-canonical"):
        decode_op(bad, replica.run_id)
