"""Arithmetic whose every operation is specified, so every CPU gets the same bits.

The outer step must turn the same contributions into bit-identical parameters on
every honest peer (docs/architecture.md, "Training"). Plain torch does not: on
this machine, with identical inputs, `(X * w[:, None]).sum(0)` and `X.T @ w`
over 16 rows give other bits under `ATEN_CPU_CAPABILITY=default` than under
`=avx2`, and `X.sum()` and `torch.dot` change between 1 and 2 threads
(tests/test_outer_determinism.py shows it; beware that `torch.randn` itself
changes with the capability, which makes even elementwise ops look unstable).
What *is* stable:

- one NumPy ufunc per IEEE operation (add, subtract, multiply, divide, sqrt,
  abs, minimum, maximum, comparisons) with explicit dtypes: each result is the
  correctly rounded value, whatever SIMD width computes it;
- a reduction over the *rows* of a C-contiguous 2-D array (`np.add.reduce(a,
  axis=0)`): NumPy adds row after row into the output lane by lane, an
  elementwise add per row, in row order;
- elementwise minimum and maximum, hence sorting along the contribution axis
  with a sorting network (aggregators.sorting_network), once -0.0 has been made
  +0.0 (the two compare equal, so which one a minimum returns is not defined).

What is *not* specified, and never used here: `np.sum`/`np.dot`/`np.linalg.norm`
over a long vector (pairwise blocking that depends on the build and the SIMD
width), BLAS, fused multiply-add, transcendental functions, anything from torch.

The one long reduction, `fixed_sum`, is defined exactly as follows (`LANES` and
`ROWS` are fixed constants, part of the protocol):

1. the terms (float32) are zero-padded to a multiple of CHUNK = ROWS * LANES;
2. each chunk is viewed as (ROWS, LANES) and its rows are added in order, in
   float32, giving LANES lane sums per chunk;
3. the lane sums of all chunks are added in chunk order, lane by lane, in
   float64;
4. the LANES float64 lane totals are folded in halves (lane i += lane i + h)
   until one is left.

Float32 inside a chunk keeps the hot loop at full SIMD speed; a chunk adds only
ROWS = 16 terms per lane, so its relative error stays below 16 * 2**-24 (about
1e-6) in the worst case, and everything beyond it is float64. Terms that are
products (`squared_norm`, `dot`) are rounded to float32 first, one correctly
rounded multiply each.

Because step 3 only ever adds the next chunk, a long vector (or k of them at
once) can be summed slab by slab with `LaneSums`, never holding more than a slab
of terms; every sum here is computed that way.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

LANES = 1024
ROWS = 16
CHUNK = ROWS * LANES  # 16384 terms
SLAB = 4 * CHUNK  # elements per cache-sized piece of work (a multiple of CHUNK)

F32 = np.float32
F64 = np.float64


def as_flat_f32(x: np.ndarray, *, what: str = "vector") -> np.ndarray:
    """Return `x` if it is a 1-D, C-contiguous float32 array, else raise ValueError."""
    if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim != 1 or not x.flags.c_contiguous:
        raise ValueError(f"{what} must be a 1-D C-contiguous float32 numpy array")
    return x


def slabs(numel: int, size: int = SLAB):
    """Yield (start, stop) pieces of [0, numel), each `size` long but the last; `size` % CHUNK == 0."""
    assert size % CHUNK == 0
    for start in range(0, numel, size):
        yield start, min(start + size, numel)


def chunk_lane_sums(terms: np.ndarray) -> np.ndarray:
    """Steps 1-2 of `fixed_sum` for float32 `terms` of shape (k, m): lane sums of shape (k, chunks, LANES).

    `terms` must start on a chunk boundary of the vectors they are part of. They
    are zero-padded here (a copy only when m is not a multiple of CHUNK).
    """
    k, m = terms.shape
    padded = -(-m // CHUNK) * CHUNK
    if padded != m:
        grown = np.zeros((k, padded), dtype=F32)
        grown[:, :m] = terms
        terms = grown
    # Reducing the ROWS axis adds row after row, lane by lane, in row order.
    return np.add.reduce(terms.reshape(k, padded // CHUNK, ROWS, LANES), axis=2, dtype=F32)


class LaneSums:
    """`fixed_sum` of k vectors at once, fed slab by slab from the start: steps 3-4 kept incremental."""

    def __init__(self, k: int) -> None:
        self._lanes = np.zeros((k, LANES), dtype=F64)
        self._ragged = False

    def add(self, terms: np.ndarray) -> None:
        """Add the next m float32 terms of each vector, shape (k, m); only the last call may have m % CHUNK != 0."""
        assert not self._ragged, "only the last piece may end off a chunk boundary"
        self._ragged = terms.shape[1] % CHUNK != 0
        sums = chunk_lane_sums(terms)
        for chunk in range(sums.shape[1]):  # chunk after chunk, lane by lane, in float64
            np.add(self._lanes, sums[:, chunk], out=self._lanes, dtype=F64)

    def add_squares(self, diff: np.ndarray) -> None:
        """Square (k, m) float32 `diff` in place, one rounded multiply each, and add the squares."""
        np.multiply(diff, diff, out=diff)
        self.add(diff)

    def finish(self) -> list[float]:
        """The k sums: the lane totals folded in halves (lane i += lane i + h)."""
        lanes = self._lanes.copy()
        half = LANES
        while half > 1:
            half //= 2
            np.add(lanes[:, :half], lanes[:, half : 2 * half], out=lanes[:, :half])
        return [float(total) for total in lanes[:, 0]]


def fixed_sum(terms: np.ndarray) -> float:
    """The sum of a float32 vector in the fixed order described at the top of this module."""
    return _one_vector_sum(terms, lambda piece, out: np.copyto(out, piece))


def squared_norm(x: np.ndarray) -> float:
    """‖x‖², each square rounded to float32, summed by `fixed_sum`."""
    return _one_vector_sum(x, lambda piece, out: np.multiply(piece, piece, out=out))


def norm(x: np.ndarray) -> float:
    """‖x‖ = the correctly rounded float64 square root of `squared_norm(x)`."""
    return math.sqrt(squared_norm(x))


def dot(x: np.ndarray, y: np.ndarray) -> float:
    """⟨x, y⟩, each product rounded to float32, summed by `fixed_sum`."""
    if x.shape != y.shape:
        raise ValueError("dot of vectors of different sizes")
    return _one_vector_sum(np.stack([x, y]), lambda pair, out: np.multiply(pair[0], pair[1], out=out))


def _one_vector_sum(source: np.ndarray, terms_of) -> float:
    """fixed_sum of terms_of(slab of source) over the last axis of `source`, slab by slab."""
    if source.dtype != F32:
        raise ValueError("exact sums take float32 arrays")
    sums = LaneSums(1)
    buffer = np.empty((1, SLAB), dtype=F32)
    for start, stop in slabs(source.shape[-1]):
        piece = buffer[:, : stop - start]
        terms_of(source[..., start:stop], piece[0])
        sums.add(piece)
    return sums.finish()[0]


def read_slab(vector: np.ndarray, start: int, stop: int, scratch: np.ndarray) -> np.ndarray:
    """vector[start:stop] as float32 values: a view of a float32 array, or a row held in another
    form (`codec.QuantizedRow`) dequantized into `scratch` (stop − start values)."""
    if isinstance(vector, np.ndarray):
        return vector[start:stop]
    return vector.dequantize(start, stop, scratch)


def squared_distances(rows: Sequence[np.ndarray], center: np.ndarray) -> list[float]:
    """‖rows[i] − center‖² for every row, each difference and square a float32 op, summed by `fixed_sum`.

    Works slab by slab (no temporary the size of the rows); the bits equal
    `squared_norm(np.subtract(row, center, dtype=float32))`.
    """
    sums = LaneSums(len(rows))
    diff = np.empty((len(rows) + 1, SLAB), dtype=F32)  # the last row holds the centre's slab
    for start, stop in slabs(center.size):
        part = diff[:, : stop - start]
        middle = read_slab(center, start, stop, part[-1])
        for i, row in enumerate(rows):
            np.subtract(read_slab(row, start, stop, part[i]), middle, out=part[i])
        part = part[:-1]
        sums.add_squares(part)
    return sums.finish()


def linear_combination(
    vectors: Sequence[np.ndarray], weights: Sequence[float], out: np.ndarray | None = None
) -> np.ndarray:
    """Σ_i float32(weights[i])·vectors[i] in float32: each product rounded, then added in the given order.

    Vectors whose weight is exactly 0 are skipped: their terms are ±0, which
    can change nothing but the sign of a zero, and every zero of the result is
    made +0.0.
    """
    out = np.empty(vectors[0].size, dtype=F32) if out is None else out
    for start, stop, combined, _ in _combination_by_slab(vectors, weights, read_all=False):
        out[start:stop] = combined
    return out


def combination_dots(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> list[float]:
    """With d = linear_combination(vectors, weights): [⟨vectors[i], d⟩ for every i] + [‖d‖²].

    One pass: d is built slab by slab (the same bits as `linear_combination`)
    and dotted while the slab is in cache, never stored whole. Each product is
    rounded to float32 and summed by `fixed_sum`, as in `dot`.
    """
    k = len(vectors)
    sums = LaneSums(k + 1)
    scratch = np.empty((k + 1, SLAB), dtype=F32)
    for start, stop, combined, values in _combination_by_slab(vectors, weights, read_all=True):
        products = scratch[:, : stop - start]
        for i, value in enumerate(values):
            np.multiply(value, combined, out=products[i])
        np.multiply(combined, combined, out=products[k])
        sums.add(products)
    return sums.finish()


def _combination_by_slab(vectors: Sequence[np.ndarray], weights: Sequence[float], *, read_all: bool):
    """Yield (start, stop, the combination's slab, the vectors' slabs as float32) slab by slab.
    Each vector is read once per slab (a quantized row dequantized once); with `read_all` False
    only those with a weight other than 0 are read (the others' slabs are None)."""
    weights32 = [F32(w) for w in weights]
    if len(weights32) != len(vectors):
        raise ValueError("one weight per vector")
    used = [i for i, w in enumerate(weights) if w != 0.0]
    wanted = range(len(vectors)) if read_all else used
    read = np.empty((len(vectors), SLAB), dtype=F32)
    products = np.empty((max(1, len(used)), SLAB), dtype=F32)
    combined = np.empty(SLAB, dtype=F32)
    for start, stop in slabs(vectors[0].size):
        values: list[np.ndarray | None] = [None] * len(vectors)
        for i in wanted:
            values[i] = read_slab(vectors[i], start, stop, read[i, : stop - start])
        part, here = products[:, : stop - start], combined[: stop - start]
        for row, i in zip(part, used):
            np.multiply(values[i], weights32[i], out=row)
        np.add.reduce(part[: len(used)], axis=0, dtype=F32, out=here)  # row after row; no terms: zeros
        yield start, stop, canonical_zeros(here, out=here), values


def canonical_zeros(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x + 0.0: turns -0.0 into +0.0 (round-to-nearest) and leaves every other value as it is.

    Sorting and min/max cannot tell -0.0 from +0.0, so which one they return
    depends on the implementation; after this there is only one zero.
    """
    return np.add(x, F32(0.0), out=out, dtype=F32)


def mean_rows(rows: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """(rows[0] + rows[1] + ... ) / len(rows) in float32, added in the given order, divided once."""
    if not rows:
        raise ValueError("mean of no rows")
    out = np.empty(rows[0].size, dtype=F32) if out is None else out
    scratch = np.empty(min(SLAB, rows[0].size), dtype=F32)
    for start, stop in slabs(rows[0].size):
        acc, read = out[start:stop], scratch[: stop - start]
        np.add(read_slab(rows[0], start, stop, read), F32(0.0), out=acc)
        for row in rows[1:]:
            np.add(acc, read_slab(row, start, stop, read), out=acc)
        np.divide(acc, F32(len(rows)), out=acc)
    return out


def scale(x: np.ndarray, factor: float, out: np.ndarray | None = None) -> np.ndarray:
    """x * float32(factor), one rounded multiply per element."""
    return np.multiply(x, F32(factor), out=out, dtype=F32)


def params_hash(theta: np.ndarray) -> str:
    """Hex SHA-256 of the little-endian float32 bytes of `theta` (hashed in place, no copy)."""
    return hashlib.sha256(np.ascontiguousarray(theta, dtype="<f4").data).hexdigest()


def content_key(x: np.ndarray) -> bytes:
    """SHA-256 of an array's little-endian float32 bytes: an order key that ignores arrival order."""
    return hashlib.sha256(np.ascontiguousarray(x, dtype="<f4").data).digest()
