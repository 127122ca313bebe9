"""The participant's side of sharded exchange, as functions of its outer state and encoder
(`Participant` delegates here; the arithmetic is training/shards.py's).

- a contribution is the codec's payload cut at the run's shard bounds and framed as one payload
  (`encode_framed`);
- a committee member aggregates one shard from every contributor's payload of it
  (`shards.aggregate_shard`) and hands the values on as little-endian float32 bytes
  (`result_to_bytes`, `result_from_bytes`);
- every peer lays the round's shard results end to end and takes the outer step with them
  (`apply_results`): with the same results, the same θ_{r+1} as the peer that computed them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .codec import CodecError, Encoder
from .exact import F32
from .outer import Author, EmptyRoundError, OuterResult, OuterStep, author_key
from .shards import ShardLayout, frame_shards


def layout_of(outer: OuterStep, shard_values: int) -> ShardLayout:
    """The run's shards: θ's values cut every `shard_values` (rounded up to the codec's blocks)."""
    return ShardLayout(outer.numel, shard_values, outer.config.block_size)


def encode_framed(encoder: Encoder, delta: np.ndarray, layout: ShardLayout) -> bytes:
    """`delta`'s payload (error feedback as for a whole one) cut into `layout`'s shards, framed."""
    return frame_shards(encoder.encode_shards(delta, layout.bounds))


def checked_index(layout: ShardLayout, index: int) -> int:
    """`index` if it names a shard of `layout`, else `ValueError` (a negative one too: no wrapping)."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < layout.count:
        raise ValueError(f"shard {index!r:.20} of a layout with {layout.count}")
    return index


def result_to_bytes(values: np.ndarray) -> bytes:
    """A shard result as it travels: its values as little-endian float32."""
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def result_from_bytes(layout: ShardLayout, index: int, data: bytes) -> np.ndarray:
    """The values of shard `index` from `result_to_bytes`'s bytes (a copy of our own);
    `ValueError` unless they are exactly the shard's size and finite (no aggregate is otherwise)."""
    expected = 4 * layout.size(checked_index(layout, index))
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != expected:
        raise ValueError(f"a result of shard {index} is {expected} bytes")
    values = np.frombuffer(data, dtype="<f4").astype(F32, copy=True)
    if not np.isfinite(values).all():
        raise ValueError(f"a result of shard {index} holds non-finite values")
    return values


def apply_results(outer: OuterStep, layout: ShardLayout, results: Sequence[np.ndarray], accepted: Sequence[Author],
                  rejected: Mapping[Author, CodecError]) -> OuterResult:
    """The outer step with the shard results laid end to end as the aggregate (the accepted in
    canonical order). `EmptyRoundError` with nothing accepted, `ValueError` for results that do not
    fit the layout or are not finite; the state is unchanged when it raises."""
    if not accepted:
        raise EmptyRoundError(dict(rejected))
    if len(results) != layout.count:
        raise ValueError(f"{len(results)} shard results, the layout has {layout.count} shards")
    g = np.empty(layout.numel, dtype=F32)  # the step keeps it as the previous aggregate
    for index, ((start, stop), values) in enumerate(zip(layout.bounds, results)):
        values = np.asarray(values)
        if values.dtype != F32 or values.shape != (stop - start,):
            raise ValueError(f"the result of shard {index} is {values.dtype} {values.shape}, "
                             f"the shard {stop - start} float32 values")
        g[start:stop] = values
    if not np.isfinite(g).all():
        raise ValueError("a shard result holds non-finite values")
    return outer.apply_aggregate(g, sorted(accepted, key=author_key), dict(rejected))
