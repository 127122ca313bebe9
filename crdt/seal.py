"""Seals: one Ed25519 signature for a batch of ops, and a Merkle path per op to check it alone.

Ed25519 verification costs more than everything else an op costs together (docs/measurements.md),
so an author signs a *batch*: the Merkle root of the IDs of up to
`MAX_SEAL_OPS` ops it wrote, with their count. Every op carries the signature, its index in
the batch and the sibling hashes from its leaf up to the root (`path`), so it is still checked
with nothing but itself: hash up the path, verify the signature over the root. A replica
remembers the seals it verified (`SealCache`), so the other ops of a batch cost a few SHA-256
instead of a signature check. A batch of one is a plain signed op: root = its ID, empty path.

The tree is built bottom-up: pairs of nodes are hashed into their parent; an odd node at the
end of a level is carried up unchanged. Inner nodes are SHA-256(0x01 ‖ left ‖ right), leaves
are op IDs (SHA-256 of an op's content, a msgpack map, whose first byte is never 0x01), so an
inner node can never pass for an op. The signature covers a domain prefix, the run, the count
and the root: the count fixes the shape of the tree, hence the length of every valid path.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from locomesh.protocol import Identity, ProtocolError
from locomesh.protocol.identity import verify
from locomesh.protocol.kinds import MAX_SEAL_OPS

SEAL_DOMAIN = b"locomesh/crdt-seal/v1\x00"


def seal_message(run: bytes, count: int, root: bytes) -> bytes:
    """The bytes an author signs to seal `count` ops of `run` under `root`."""
    return SEAL_DOMAIN + run + count.to_bytes(8, "big") + root


def seal(identity: Identity, run: bytes, leaves: list[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """Sign a batch of op IDs: (signature, the Merkle path of each leaf, in order)."""
    if not 1 <= len(leaves) <= MAX_SEAL_OPS:
        raise ValueError(f"a seal covers 1 to {MAX_SEAL_OPS} ops, not {len(leaves)}")
    root, paths = merkle_paths(leaves)
    return identity.sign(seal_message(run, len(leaves), root)), paths


def merkle_paths(leaves: list[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """The root over `leaves` and, for each leaf, its siblings from the bottom up."""
    paths: list[list[bytes]] = [[] for _ in leaves]
    positions = list(range(len(leaves)))  # where each leaf's ancestor sits in the current level
    level = list(leaves)
    while len(level) > 1:
        for leaf, position in enumerate(positions):
            if position ^ 1 < len(level):
                paths[leaf].append(level[position ^ 1])
            positions[leaf] = position >> 1
        level = [_parent(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0], paths


def root_from_path(leaf: bytes, index: int, count: int, path: list[bytes]) -> bytes:
    """The root that `path` leads to from `leaf` at `index` of `count`; `ProtocolError` if malformed."""
    if not 0 <= index < count <= MAX_SEAL_OPS:
        raise ProtocolError("bad-seal", f"index {index} of a batch of {count} is out of range")
    node, position, width, used = leaf, index, count, 0
    while width > 1:
        if position ^ 1 < width:  # else this node is the odd one out, carried up unchanged
            if used == len(path):
                raise ProtocolError("bad-seal", "the Merkle path is too short")
            left, right = (path[used], node) if position & 1 else (node, path[used])
            node = _parent(left, right)
            used += 1
        position, width = position >> 1, (width + 1) >> 1
    if used != len(path):
        raise ProtocolError("bad-seal", "the Merkle path is too long")
    return node


def verify_seal(author: bytes, run: bytes, count: int, root: bytes, signature: bytes) -> None:
    """Return if `signature` by `author` seals (`run`, `count`, `root`); else `ProtocolError`."""
    verify(author, signature, seal_message(run, count, root))


class SealCache:
    """The seals verified lately, so each batch's signature is checked once (bounded, oldest out).

    The key is everything the signature covers plus the signature itself: an op that names a
    verified root with *another* signature is checked afresh, so no op with a broken seal is
    ever held (and served to peers) on the strength of a good one.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._verified: OrderedDict[tuple[bytes, bytes, int, bytes, bytes], None] = OrderedDict()

    def check(self, author: bytes, run: bytes, count: int, root: bytes, signature: bytes) -> None:
        """Return if `signature` by `author` seals (`run`, `count`, `root`); else `ProtocolError`."""
        key = (author, run, count, root, signature)
        if key in self._verified:
            return
        verify_seal(author, run, count, root, signature)
        self._verified[key] = None
        if len(self._verified) > self.max_entries:
            self._verified.popitem(last=False)


def _parent(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()
