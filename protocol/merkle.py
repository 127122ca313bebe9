"""A Merkle tree over a list of byte strings, as Certificate Transparency builds it (RFC 9162 §2.1).

A contribution in sharded exchange commits to one root over its shards' hashes; anyone holding one
shard, its index, the shard count and the audit path (log2 of the count hashes) can check that shard
against the root without seeing the others.

Leaves and inner nodes are hashed with different prefixes (0x00, 0x01), so no inner node can pass
for a leaf (the second-preimage attack on plain Merkle trees), and the tree over n leaves splits at
the largest power of two below n, so every count has one shape. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from .errors import ProtocolError

HASH_SIZE = 32
MAX_LEAVES = 1 << 20  # far above any shard count
MAX_PATH = (MAX_LEAVES - 1).bit_length()  # the deepest tree's audit path: 20 hashes


class MerkleError(ProtocolError):
    """A leaf that does not belong under the root, or a malformed audit path."""


def leaf_hash(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(b"\x00" + bytes(data)).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """The root over `leaf_hashes` (each `leaf_hash` of one leaf), in order."""
    if not 0 < len(leaf_hashes) <= MAX_LEAVES:
        raise ValueError(f"a Merkle tree has 1..{MAX_LEAVES} leaves, got {len(leaf_hashes)}")
    return _subtree_root(list(leaf_hashes))


def _subtree_root(hashes: list[bytes]) -> bytes:
    if len(hashes) == 1:
        return hashes[0]
    split = _split_point(len(hashes))
    return _node_hash(_subtree_root(hashes[:split]), _subtree_root(hashes[split:]))


def audit_path(leaf_hashes: Sequence[bytes], index: int) -> list[bytes]:
    """The sibling hashes from leaf `index` up to the root: what `verify` needs beside the leaf."""
    if not 0 <= index < len(leaf_hashes):
        raise ValueError(f"leaf {index} of {len(leaf_hashes)}")
    hashes, path = list(leaf_hashes), []
    while len(hashes) > 1:
        split = _split_point(len(hashes))
        if index < split:
            path.append(_subtree_root(hashes[split:]))
            hashes = hashes[:split]
        else:
            path.append(_subtree_root(hashes[:split]))
            hashes, index = hashes[split:], index - split
    return path[::-1]  # leaf to root


def verify(leaf: bytes, index: int, count: int, path: Sequence[bytes], expected_root: bytes) -> None:
    """Returns if `leaf` (the hash of leaf `index` of `count`) and `path` lead to `expected_root`;
    `MerkleError` otherwise (a wrong leaf, index, count or path length)."""
    if not 0 <= index < count <= MAX_LEAVES:
        raise MerkleError("bad-index", f"leaf {index} of {count} is not in a tree of 1..{MAX_LEAVES} leaves")
    if len(path) > MAX_PATH:  # before anything walks it: a peer's list may be any length
        raise MerkleError("bad-path", f"an audit path has at most {MAX_PATH} hashes, got {len(path)}")
    if any(not isinstance(h, bytes) or len(h) != HASH_SIZE for h in path):
        raise MerkleError("bad-path", f"an audit path holds {HASH_SIZE}-byte hashes")
    # RFC 9162 §2.1.3.2: walk up, the last node of a level being promoted when it has no sibling.
    node, last, value, steps = index, count - 1, leaf, iter(path)
    for sibling in steps:
        if last == 0:
            raise MerkleError("bad-path", "the audit path is longer than the tree is deep")
        if node % 2 == 1 or node == last:
            value = _node_hash(sibling, value)
            if node % 2 == 0:  # promoted without a sibling until it is a right child
                while node % 2 == 0 and node != 0:
                    node, last = node >> 1, last >> 1
        else:
            value = _node_hash(value, sibling)
        node, last = node >> 1, last >> 1
    if last != 0:
        raise MerkleError("bad-path", "the audit path is shorter than the tree is deep")
    if value != expected_root:
        raise MerkleError("wrong-root", "the leaf and its audit path do not lead to the committed root")


def _split_point(n: int) -> int:
    """The largest power of two below n (n ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)
