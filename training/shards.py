"""Sharded exchange, the arithmetic side: the parameter vector cut into shards, one payload per
shard, a Merkle commitment over them, and the outer step assembled from per-shard aggregates.

In `allgather` exchange every peer fetches every payload and aggregates the whole vector. In
`sharded` exchange the vector is cut into block-aligned ranges (`ShardLayout`); a contributor
encodes its pseudo-gradient as one codec payload per shard (`Encoder.encode_shards`: the same
quantization, cut where no block straddles two shards) and commits to the Merkle root over their
hashes (`ShardedPayload`), so each shard can be fetched and checked on its own (`check_shard`).
The contributor's shards travel and are stored as one payload (`frame_shards`; `unframe_shards`
reads it back, bounded by the run's per-shard limits before anything is copied).
Shard s is aggregated from every accepted author's shard-s payload, centred on shard s of the
previous aggregate (`aggregate_shard`: `OuterStep.aggregate_range`, the same bit-exact arithmetic);
the shard aggregates, laid end to end, are the round's aggregate, and the cap and momentum step
follow as in allgather (`OuterStep.apply_aggregate`). So whoever computes a shard, every peer that
assembles the same shard aggregates gets the same θ_{r+1}, and any peer can recompute any shard
from the committed payloads to check a result (`shard_result_hash`).

Coordinate-wise aggregators (mean, coordinate median, trimmed mean) give the same bits sharded or
not; CenteredClip, the geometric median and Krum weigh each contribution by its distance over the
shard instead of the whole vector (bench/byzantine.py --exchange compares the two).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from locomesh.protocol import merkle

from .codec import CodecError, Encoder, max_payload_size
from .exact import F32
from .outer import Author, EmptyRoundError, OuterResult, OuterStep, author_key

DEFAULT_SHARD_VALUES = 1 << 20  # 1M values: 1 MiB of int8 codes; a 25M model has 25 shards
_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class ShardLayout:
    """`numel` values cut into ranges of `shard_values` (rounded up to whole codec blocks); the
    last shard takes the rest."""

    numel: int
    shard_values: int = DEFAULT_SHARD_VALUES
    block: int = 1024  # the codec's block size (fp32: any; blocks only align the cuts)

    def __post_init__(self) -> None:
        if self.numel < 1 or self.shard_values < 1 or self.block < 1:
            raise ValueError("a layout needs positive numel, shard size and block")
        whole_blocks = -(-self.shard_values // self.block) * self.block
        object.__setattr__(self, "shard_values", whole_blocks)

    @property
    def count(self) -> int:
        return -(-self.numel // self.shard_values)

    @cached_property
    def bounds(self) -> list[tuple[int, int]]:
        """[start, stop) of every shard, in order."""
        return [(start, min(start + self.shard_values, self.numel)) for start in range(0, self.numel, self.shard_values)]

    def size(self, index: int) -> int:
        start, stop = self.bounds[index]
        return stop - start


class ShardedPayload:
    """One contributor's shard payloads and the Merkle commitment over them."""

    def __init__(self, shards: Sequence[bytes]) -> None:
        self.shards = list(shards)
        self.leaves = [merkle.leaf_hash(shard) for shard in self.shards]
        self.root = merkle.root(self.leaves)

    @classmethod
    def encode(cls, encoder: Encoder, delta: np.ndarray, layout: ShardLayout) -> "ShardedPayload":
        return cls(encoder.encode_shards(delta, layout.bounds))

    def proof(self, index: int) -> list[bytes]:
        """The audit path that ties shard `index` to `root`."""
        return merkle.audit_path(self.leaves, index)

    @property
    def nbytes(self) -> int:
        return sum(len(shard) for shard in self.shards)


def check_shard(shard: bytes, index: int, layout: ShardLayout, root: bytes, proof: Sequence[bytes], *, codec: str) -> None:
    """Returns if `shard` is shard `index` of the payload committed to by `root`: no larger than the
    run's codec allows for that shard (`CodecError` "too-large", checked before it is hashed) and
    tied to the root by `proof` (`merkle.MerkleError`). Its values are checked when it is decoded."""
    if not 0 <= index < layout.count:
        raise merkle.MerkleError("bad-index", f"shard {index} of a layout with {layout.count}")
    limit = max_payload_size(codec, layout.size(index), layout.block)
    if len(shard) > limit:
        raise CodecError("too-large", f"shard {index} is {len(shard)} bytes, at most {limit} in this run")
    merkle.verify(merkle.leaf_hash(shard), index, layout.count, proof, root)


def aggregate_shard(
    outer: OuterStep, layout: ShardLayout, index: int, shards: Mapping[Author, bytes], *,
    out: np.ndarray | None = None, bucket_seed: bytes = b"",
) -> tuple[np.ndarray, list[Author], dict[Author, CodecError]]:
    """Shard `index`'s aggregate from every author's payload of that shard (keyed by author), as
    `outer` would compute it for its own state: (values, accepted, rejected). Raises as `OuterStep.step`."""
    start, stop = layout.bounds[index]
    values = np.empty(stop - start, dtype=F32) if out is None else out
    accepted, rejected = outer.aggregate_range(shards, start, stop, out=values, bucket_seed=bucket_seed)
    return values, accepted, rejected


def shard_result_hash(run_round: int, index: int, values: np.ndarray) -> bytes:
    """What an aggregator signs for its result of shard `index` in round `run_round`: SHA-256 over
    both and the little-endian float32 bytes of the values."""
    digest = hashlib.sha256(b"locomesh shard result" + run_round.to_bytes(8, "big") + index.to_bytes(4, "big"))
    digest.update(memoryview(np.ascontiguousarray(values, dtype="<f4")).cast("B"))
    return digest.digest()


def sharded_step(outer: OuterStep, layout: ShardLayout, payloads: Mapping[Author, Sequence[bytes]], *,
                 bucket_seed: bytes = b"") -> OuterResult:
    """One outer step with every shard aggregated here (what the committees compute between them),
    from each author's shard payloads (keyed by author, in layout order). An author is accepted
    if every one of its shards was; raises `EmptyRoundError` if some shard has no valid payload."""
    if layout.numel != outer.numel:
        raise ValueError(f"the layout covers {layout.numel} values, θ has {outer.numel}")
    g = np.empty(layout.numel, dtype=F32)
    rejected: dict[Author, CodecError] = {}
    for index, (start, stop) in enumerate(layout.bounds):
        shards = {author: parts[index] if len(parts) == layout.count else b"" for author, parts in payloads.items()}
        _, _, refused = aggregate_shard(outer, layout, index, shards, out=g[start:stop], bucket_seed=bucket_seed)
        for author, error in refused.items():
            rejected.setdefault(author, error)
    if len(rejected) == len(payloads):
        raise EmptyRoundError(rejected)
    accepted = sorted((author for author in payloads if author not in rejected), key=author_key)
    return outer.apply_aggregate(g, accepted, rejected)


# -- one bytes object for a contributor's shard payloads ---------------------------------------------
# A sharded payload travels and is stored as one payload (what the participation already carries):
#   u32 count ‖ count × u32 length ‖ the shards' bytes in order  (big-endian lengths)


def frame_shards(shards: Sequence[bytes]) -> bytes:
    """The shards, in order, as one bytes object (`unframe` reads it back)."""
    return b"".join([_U32.pack(len(shards)), *(_U32.pack(len(shard)) for shard in shards), *shards])


def shard_limits(layout: ShardLayout, codec: str) -> list[int]:
    """The most bytes each shard payload of `layout` can have in a run with `codec`."""
    return [max_payload_size(codec, layout.size(index), layout.block) for index in range(layout.count)]


def max_framed_size(limits: Sequence[int]) -> int:
    """The most bytes a framed payload whose shards are at most `limits` can have."""
    return _U32.size * (1 + len(limits)) + sum(limits)


def unframe_shards(data: bytes, layout: ShardLayout, *, codec: str) -> list[bytes]:
    """The shard payloads of a framed payload of `layout` in a run with `codec` (`unframe`)."""
    return unframe(data, shard_limits(layout, codec))


def unframe(data: bytes, limits: Sequence[int]) -> list[bytes]:
    """The shards framed in `data`: exactly len(limits) of them, shard i at most limits[i] bytes,
    the lengths adding up to the data; anything else is a `CodecError` "bad-frame". Everything is
    checked against the header before a shard is copied out."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError("bad-frame", f"a framed payload must be bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    count = len(limits)
    header = _U32.size * (1 + count)
    if len(view) > max_framed_size(limits):
        raise CodecError("bad-frame", f"a framed payload of {len(view)} bytes, at most {max_framed_size(limits)} here")
    if len(view) < header or _U32.unpack_from(view, 0)[0] != count:
        raise CodecError("bad-frame", f"a framed payload must hold {count} shards")
    lengths = [_U32.unpack_from(view, _U32.size * (1 + index))[0] for index in range(count)]
    for index, (length, limit) in enumerate(zip(lengths, limits)):
        if length > limit:
            raise CodecError("bad-frame", f"shard {index} is {length} bytes, at most {limit} here")
    if header + sum(lengths) != len(view):
        raise CodecError("bad-frame", f"the shards' lengths add up to {sum(lengths)}, the frame holds {len(view) - header}")
    shards, position = [], header
    for length in lengths:
        shards.append(bytes(view[position:position + length]))
        position += length
    return shards
