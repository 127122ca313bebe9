"""The pseudo-gradient codec: blockwise absmax quantization + zstd, and a strict decoder.

Payload bytes (what a peer sends, and what commitments hash):

    u16 big-endian header length ‖ header ‖ one zstd frame

The header is canonical msgpack ``{"block": B, "mode": m, "numel": n, "v": 1}``.
The frame inflates to the body:

- ``int8``: n/B (rounded up) float16 scales, little-endian, then n int8 codes in −127..127;
- ``int4``: the scales, then ⌈n/2⌉ bytes of signed 4-bit codes in −7..7, element 2i
  in the low nibble and 2i+1 in the high one (a last odd element leaves a zero nibble);
- ``fp32``: n little-endian float32 values (B is 0): the uncompressed baseline.

A block's scale is its absmax / 127 (int8) or / 7 (int4), rounded *up* to the
next float16, so every |x / scale| ≤ 127 (or 7) and nothing is clipped; the code
is x / scale rounded to nearest (ties to even). The error per element is at most
scale / 2, i.e. about absmax/254 for int8 and absmax/14 for int4 (a little more
where the float16 scale is subnormal, below 6.1e-5, absmax below about 7.8e-3
for int8).

Block size: 1024 by default. Scales then cost 2 bytes per 1024 elements (0.2 %
of int8, 0.4 % of int4) and whole blocks stay cache-friendly; smaller blocks
lower the error of int4 a little on heavy-tailed data (bench/codec_throughput.py
reports both), at the price of more scale bytes. The decoder takes any power
of two in [MIN_BLOCK, MAX_BLOCK], or exactly the run's block size when given.

Error feedback (`Encoder(error_feedback=True)`): the encoder adds the residual
of its last encoding (input − decode(payload)) to the next input, so nothing is
lost for good: the decoded outputs' running sum stays within one quantization
error of the inputs' running sum.

Decoding is exact elementwise NumPy (int → float32 is exact, then one rounded
multiply by the block's float32 scale), so every peer decodes the same bits.
Anything wrong in a payload raises `CodecError` (a `ProtocolError`) with a
code; the output of a payload that decodes is always finite (|code| ≤ 127 and
finite float16 scales ≤ 65504 bound every value by 8.4e6).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import zstandard

from locomesh.protocol import ProtocolError, compress_bound, decompress, pack, unpack

FORMAT_VERSION = 1
MODES = ("int8", "int4", "fp32")
DEFAULT_BLOCK = 1024
MIN_BLOCK = 32
MAX_BLOCK = 65536
FP16_MAX = 65504.0
DEFAULT_LEVEL = 1  # zstd level: quantized codes are near-random bytes, higher levels gain little
MAX_HEADER = 128

_LEVELS = {"int8": 127, "int4": 7}
_SLAB = MAX_BLOCK  # elements quantized at a time: a multiple of every block size, fits in L2
_HEADER_KEYS = {"v", "mode", "numel", "block"}


class CodecError(ProtocolError):
    """A payload that does not decode to a valid, finite vector of the expected size."""


def encode(x: np.ndarray, mode: str = "int8", *, block_size: int = DEFAULT_BLOCK, level: int = DEFAULT_LEVEL) -> bytes:
    """Encode float32 vector `x` without error feedback (see `Encoder` for the stateful form)."""
    return Encoder(mode, block_size=block_size, error_feedback=False, level=level).encode(x)


class Encoder:
    """Encodes one peer's successive pseudo-gradients; holds the error-feedback residual (local state).

    Encoding need not be bit-reproducible across machines (only decoding must),
    but it is deterministic on one machine. An input it cannot encode (NaN, too
    large for float16 scales) raises ValueError and leaves the residual as it
    was; an input of another size starts from a zero residual.
    """

    def __init__(
        self,
        mode: str = "int8",
        *,
        block_size: int = DEFAULT_BLOCK,
        error_feedback: bool = True,
        level: int = DEFAULT_LEVEL,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown codec mode {mode!r}; known: {MODES}")
        if mode != "fp32":
            _check_block_size(block_size)
        self.mode = mode
        self.block_size = block_size if mode != "fp32" else 0
        self.error_feedback = error_feedback and mode != "fp32"
        self._compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self.residual: np.ndarray | None = None  # input − decoded of the last encoding

    def encode(self, x: np.ndarray) -> bytes:
        """The payload for float32 vector `x` (plus the carried residual when error feedback is on)."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        return self.encode_shards(x, [(0, x.size)])[0]

    def encode_shards(self, x: np.ndarray, bounds: Sequence[tuple[int, int]]) -> list[bytes]:
        """One payload per range [start, stop) of `bounds` (ranges that tile `x` in order, each
        starting on a block boundary): payload k is the payload of x[start:stop] quantized alone,
        which is the same as that range of the whole vector's quantization, since no block
        straddles two ranges. The error-feedback residual is carried over the whole vector."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        _check_bounds(bounds, x.size, self.block_size)
        if self.mode == "fp32":
            if not np.isfinite(x).all():
                raise ValueError("cannot encode a non-finite vector")
            return self._assemble_shards(x.size, b"", x.astype("<f4", copy=False).view(np.uint8), bounds)
        if not self.error_feedback:
            return self._assemble_shards(x.size, *self._quantize(x, leftover=None), bounds)
        if self.residual is None or self.residual.size != x.size:  # first call, or another model
            self.residual = np.zeros(x.size, dtype=np.float32)
        target = self._plus_residual(x)
        scales, codes = self._quantize(target, leftover=target)  # target becomes y − decode(y) ...
        self.residual = target  # ... and the residual only once that worked
        return self._assemble_shards(x.size, scales, codes, bounds)

    def _plus_residual(self, x: np.ndarray) -> np.ndarray:
        """x + residual: written into the residual itself when the sum is sure to encode (finite and
        within the float16 scales' range), so the encoder holds one vector of the model's size, not
        two; otherwise into a new array, so that a failed encoding leaves the residual as it was."""
        bound = max(abs(float(x.max(initial=0.0))), abs(float(x.min(initial=0.0))))
        held = max(abs(float(self.residual.max(initial=0.0))), abs(float(self.residual.min(initial=0.0))))
        if bound + held <= 0.99 * FP16_MAX * _LEVELS[self.mode]:  # False for NaN or ±inf
            return np.add(x, self.residual, out=self.residual)
        return np.add(x, self.residual)

    def _quantize(self, y: np.ndarray, leftover: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The float16 block scales and the codes (int4: packed) of `y`, as bytes; if `leftover`
        is given, write y − dequantized(y) into it (it may be y)."""
        levels, block, numel = _LEVELS[self.mode], self.block_size, y.size
        blocks = -(-numel // block)
        codes = np.empty(numel + (numel % 2 if self.mode == "int4" else 0), dtype=np.int8)
        scales = np.empty(blocks, dtype="<f2")
        work = np.empty(_SLAB, dtype=np.float32)
        for start in range(0, numel, _SLAB):
            stop = min(start + _SLAB, numel)
            for lo, hi in _block_runs(start, stop, block):
                first = lo // block
                rows = (hi - lo + block - 1) // block
                width = (hi - lo) // rows
                part = y[lo:hi].reshape(rows, width)
                scratch = work[: hi - lo].reshape(rows, width)
                scale32 = _block_scales(part, levels, scratch, scales[first : first + rows])
                np.multiply(part, _inverse(scale32)[:, None], out=scratch)
                np.rint(scratch, out=scratch)
                np.copyto(codes[lo:hi].reshape(rows, width), scratch, casting="unsafe")
                if leftover is not None:
                    np.multiply(scratch, scale32[:, None], out=scratch)
                    np.subtract(part, scratch, out=leftover[lo:hi].reshape(rows, width))
        if self.mode == "int4":
            codes[numel:] = 0
            codes = _pack_nibbles(codes)
        return scales.view(np.uint8), codes.view(np.uint8)

    def _assemble_shards(self, numel: int, scales: np.ndarray | bytes, codes: np.ndarray,
                         bounds: Sequence[tuple[int, int]]) -> list[bytes]:
        return _assemble_shards(self._compressor, self.mode, self.block_size, numel, scales, codes, bounds)


def split_payload(payload: bytes, numel: int, bounds: Sequence[tuple[int, int]], *,
                  modes: tuple[str, ...] = MODES, block_size: int | None = None) -> list[bytes]:
    """A whole-vector payload cut into the payloads of the ranges `bounds` (as `encode_shards`
    would have made them). The header and the body's length are checked (`CodecError`); the
    values are not: each part is validated where it is decoded."""
    header, frame = _split(payload)
    mode, block = _check_header(header, numel, modes, block_size)
    _check_bounds(bounds, numel, block)
    body = np.frombuffer(_inflate(frame, _body_length(mode, numel, block)), dtype=np.uint8)
    scale_bytes = 0 if mode == "fp32" else 2 * -(-numel // block)
    compressor = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_content_size=True)
    return _assemble_shards(compressor, mode, block, numel, body[:scale_bytes], body[scale_bytes:], bounds)


def max_payload_size(mode: str, numel: int, block_size: int = DEFAULT_BLOCK) -> int:
    """The most bytes a payload of `numel` values in `mode` (quantized in blocks of `block_size`)
    can have: its header, and zstd's worst case for its body (bytes that do not compress)."""
    block = 0 if mode == "fp32" else block_size
    return 2 + len(_header(mode, numel, block)) + compress_bound(_body_length(mode, numel, block))


def _header(mode: str, numel: int, block: int) -> bytes:
    return pack({"v": FORMAT_VERSION, "mode": mode, "numel": numel, "block": block})


def decode(
    payload: bytes,
    expected_numel: int,
    *,
    modes: tuple[str, ...] = MODES,
    block_size: int | None = None,
    max_scale: float = FP16_MAX,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A float32 vector of `expected_numel` values from `payload`, or `CodecError`.

    `modes` are the modes accepted; `block_size`, when given, is the only block
    size accepted; scales above `max_scale` are refused. The decompressed body
    is never allowed to grow past its exact expected size. The values go into
    `out` (a float32 vector of `expected_numel`) when given, else into a new
    array; on `CodecError`, `out` may hold garbage.
    """
    if out is not None and (out.dtype != np.float32 or out.shape != (expected_numel,)):
        raise ValueError(f"out must be a float32 vector of {expected_numel} values")
    row = decode_row(payload, expected_numel, modes=modes, block_size=block_size, max_scale=max_scale)
    if isinstance(row, QuantizedRow):
        return row.dequantize(0, row.size, out)
    return row.copy() if out is None else _copied(row, out)


def decode_row(
    payload: bytes,
    expected_numel: int,
    *,
    modes: tuple[str, ...] = MODES,
    block_size: int | None = None,
    max_scale: float = FP16_MAX,
) -> np.ndarray | QuantizedRow:
    """`payload` checked exactly as `decode` checks it (same `CodecError`s), kept in the form an
    aggregator reads: a quantized payload as a `QuantizedRow` (1 byte a value, or 2 per 4-bit
    pair unpacked, instead of 4), an fp32 one as a read-only float32 vector over its body."""
    header, frame = _split(payload)
    mode, block = _check_header(header, expected_numel, modes, block_size)
    body = _inflate(frame, _body_length(mode, expected_numel, block))
    if mode == "fp32":
        values = np.frombuffer(body, dtype="<f4")
        if values.dtype != np.float32:  # a big-endian machine
            values = values.astype(np.float32)
        if not np.isfinite(values).all():
            raise CodecError("not-finite", "fp32 payload holds NaN or infinite values")
        return values
    blocks = -(-expected_numel // block)
    scales = _checked_scales(np.frombuffer(body, dtype="<f2", count=blocks), max_scale)
    raw = np.frombuffer(body, dtype=np.int8, offset=2 * blocks)
    codes = _unpack_nibbles(raw, expected_numel) if mode == "int4" else raw
    if codes.size and codes.min() < -_LEVELS[mode]:
        raise CodecError("bad-code", f"{mode} code outside −{_LEVELS[mode]}..{_LEVELS[mode]}")
    return QuantizedRow(codes, scales, block)


class QuantizedRow:
    """A decoded quantized payload held as its codes and float32 block scales.

    Slicing it (`row[start:stop]`) gives the float32 values of that range, computed for the
    range alone: the same bits `decode` gives (int8 → float32 is exact, then one rounded
    multiply by the block's scale). The aggregators read their rows slab by slab, so a
    round's contributions cost one byte a value while they are aggregated, not four.
    """

    __slots__ = ("codes", "scales", "block", "size")

    def __init__(self, codes: np.ndarray, scales: np.ndarray, block: int) -> None:
        self.codes, self.scales, self.block, self.size = codes, scales, block, codes.size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("a QuantizedRow is read by slices")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("a QuantizedRow is read by contiguous slices")
        return self.dequantize(start, max(start, stop))

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        values = self.dequantize(0, self.size)
        return values if dtype is None else values.astype(dtype, copy=False)

    def dequantize(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """The float32 values of [start, stop), into `out` (stop − start values) or a new array."""
        out = np.empty(stop - start, dtype=np.float32) if out is None else out
        block, position = self.block, start
        while position < stop:
            first = position // block
            if position % block == 0 and stop - position >= block:  # whole blocks: one broadcast multiply
                rows = (stop - position) // block
                end = position + rows * block
                np.multiply(self.codes[position:end].reshape(rows, block), self.scales[first : first + rows, None],
                            out=out[position - start : end - start].reshape(rows, block), dtype=np.float32)
            else:  # the part of one block at either end of the range
                end = min(stop, (first + 1) * block)
                np.multiply(self.codes[position:end], self.scales[first], out=out[position - start : end - start],
                            dtype=np.float32)
            position = end
        return out


def non_finite_payload(mode: str, value: float, numel: int, *, block_size: int = DEFAULT_BLOCK) -> bytes:
    """A payload laid out like `mode`'s whose values are all `value` (NaN or ±Inf): for testing rejection.

    Quantized modes carry `value` as every block's scale (codes all 1); fp32
    carries it raw. `decode` must refuse it.
    """
    compressor = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_content_size=True)
    if mode == "fp32":
        return _assemble(compressor, mode, 0, numel, np.full(numel, value, dtype="<f4").view(np.uint8))
    blocks = -(-numel // block_size)
    scales = np.full(blocks, value, dtype="<f2").view(np.uint8)
    code_bytes = (numel + 1) // 2 if mode == "int4" else numel
    codes = np.full(code_bytes, 0x11 if mode == "int4" else 1, dtype=np.uint8)
    return _assemble(compressor, mode, block_size, numel, np.concatenate([scales, codes]))


# -- encoding helpers ----------------------------------------------------------


def _check_bounds(bounds: Sequence[tuple[int, int]], numel: int, block: int) -> None:
    """`bounds` must tile [0, numel) in order, every range non-empty and starting on a block boundary."""
    position = 0
    for start, stop in bounds:
        if start != position or stop <= start or (block and start % block):
            raise ValueError(f"ranges must tile [0, {numel}) in order on block boundaries, got {list(bounds)[:4]}...")
        position = stop
    if position != numel:
        raise ValueError(f"ranges end at {position}, the vector has {numel} values")


def _assemble_shards(compressor: zstandard.ZstdCompressor, mode: str, block: int, numel: int,
                     scales: np.ndarray | bytes, codes: np.ndarray, bounds: Sequence[tuple[int, int]]) -> list[bytes]:
    """The payload of each range: its block scales, then its codes (fp32: its values). Ranges start
    on block boundaries, and so (blocks being even) on whole bytes of int4 codes."""
    scales = np.frombuffer(scales, dtype=np.uint8) if isinstance(scales, bytes) else scales
    payloads = []
    for start, stop in bounds:
        if mode == "fp32":
            body = codes[4 * start : 4 * stop]
        else:
            own_scales = scales[2 * (start // block) : 2 * -(-stop // block)]
            own_codes = codes[start // 2 : (stop + 1) // 2] if mode == "int4" else codes[start:stop]
            body = np.concatenate([own_scales, own_codes])
        payloads.append(_assemble(compressor, mode, block, stop - start, body))
    return payloads


def _assemble(compressor: zstandard.ZstdCompressor, mode: str, block: int, numel: int, body: np.ndarray | bytes) -> bytes:
    header = _header(mode, numel, block)
    return len(header).to_bytes(2, "big") + header + compressor.compress(memoryview(body))


def _check_block_size(block: int) -> None:
    if not (MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0):
        raise ValueError(f"block size must be a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}")


def _block_runs(start: int, stop: int, block: int):
    """[start, stop) as at most two runs of equal-width rows: the whole blocks, then a short last block."""
    whole = start + (stop - start) // block * block
    if whole > start:
        yield start, whole
    if stop > whole:
        yield whole, stop


def _block_scales(part: np.ndarray, levels: int, scratch: np.ndarray, scales16: np.ndarray) -> np.ndarray:
    """Per row of `part`: absmax / levels rounded up to float16 (written to `scales16`); returns them as float32."""
    np.abs(part, out=scratch)
    absmax = np.max(scratch, axis=1)
    if not np.isfinite(absmax).all():
        raise ValueError("cannot encode a non-finite vector")
    target = np.divide(absmax, np.float32(levels), dtype=np.float32)
    if (target > FP16_MAX).any():
        raise ValueError(f"values above {FP16_MAX * levels:g} do not fit float16 scales")
    half = target.astype(np.float16)
    short = half.astype(np.float32) < target
    half[short] = np.nextafter(half[short], np.float16(np.inf))
    scales16[:] = half
    return half.astype(np.float32)


def _inverse(scale32: np.ndarray) -> np.ndarray:
    safe = np.where(scale32 > 0, scale32, np.float32(1))
    return np.where(scale32 > 0, np.float32(1) / safe, np.float32(0)).astype(np.float32)


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    nibbles = codes.view(np.uint8)
    low = np.bitwise_and(nibbles[0::2], np.uint8(0x0F))
    return np.bitwise_or(low, np.left_shift(nibbles[1::2], np.uint8(4))).view(np.int8)


# -- decoding helpers ----------------------------------------------------------


def _split(payload: bytes) -> tuple[bytes, bytes]:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError("bad-type", f"payload must be bytes, got {type(payload).__name__}")
    payload = memoryview(payload).cast("B")
    if len(payload) < 2:
        raise CodecError("truncated", "payload too short for its header length")
    length = int.from_bytes(payload[:2], "big")
    if not 0 < length <= MAX_HEADER:
        raise CodecError("bad-header", f"header length {length} not in 1..{MAX_HEADER}")
    if len(payload) < 2 + length:
        raise CodecError("truncated", "payload ends inside its header")
    return bytes(payload[2 : 2 + length]), payload[2 + length :]


def _check_header(header: bytes, numel: int, modes: tuple[str, ...], block_size: int | None) -> tuple[str, int]:
    try:
        fields = unpack(header, max_size=MAX_HEADER)
    except ProtocolError as exc:
        raise CodecError("bad-header", f"header is not canonical msgpack ({exc.code}: {exc.reason})") from None
    if not isinstance(fields, dict) or set(fields) != _HEADER_KEYS:
        raise CodecError("bad-header", f"header must be a map with exactly the keys {sorted(_HEADER_KEYS)}")
    version, mode, count, block = (fields[key] for key in ("v", "mode", "numel", "block"))
    if type(version) is not int or version != FORMAT_VERSION:
        raise CodecError("bad-version", f"codec format version {version!r}, expected {FORMAT_VERSION}")
    if not isinstance(mode, str) or mode not in MODES or mode not in modes:
        raise CodecError("bad-mode", f"codec mode {mode!r} is not accepted here (accepted: {list(modes)})")
    if type(count) is not int or count != numel:
        raise CodecError("wrong-numel", f"payload holds {count!r} values, expected {numel}")
    if type(block) is not int:
        raise CodecError("bad-block", "block size must be an integer")
    if mode == "fp32":
        if block != 0:
            raise CodecError("bad-block", "fp32 payloads have block size 0")
    elif not (MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0):
        raise CodecError("bad-block", f"block size {block} is not a power of two in [{MIN_BLOCK}, {MAX_BLOCK}]")
    elif block_size is not None and block != block_size:
        raise CodecError("bad-block", f"block size {block}, the run uses {block_size}")
    return mode, block


def _body_length(mode: str, numel: int, block: int) -> int:
    if mode == "fp32":
        return 4 * numel
    codes = (numel + 1) // 2 if mode == "int4" else numel
    return 2 * -(-numel // block) + codes


def _inflate(frame: memoryview, length: int) -> bytes:
    try:
        body = decompress(frame, max_output=length)
    except ProtocolError as exc:
        raise CodecError(exc.code, exc.reason) from None
    if len(body) != length:
        raise CodecError("wrong-length", f"body is {len(body)} bytes, expected {length}")
    return body


def _checked_scales(scales16: np.ndarray, max_scale: float) -> np.ndarray:
    bits = scales16.view("<u2")
    if np.bitwise_and(bits, np.uint16(0x8000)).any():
        raise CodecError("bad-scale", "a block scale is negative")
    if np.equal(np.bitwise_and(bits, np.uint16(0x7C00)), np.uint16(0x7C00)).any():
        raise CodecError("bad-scale", "a block scale is NaN or infinite")
    scales = scales16.astype(np.float32)
    if (scales > np.float32(max_scale)).any():
        raise CodecError("bad-scale", f"a block scale is above {max_scale:g}")
    return scales


def _unpack_nibbles(packed: np.ndarray, numel: int) -> np.ndarray:
    codes = np.empty(2 * packed.size, dtype=np.int8)
    # Arithmetic shifts on int8 sign-extend each nibble.
    np.right_shift(np.left_shift(packed, np.int8(4)), np.int8(4), out=codes[0::2])
    np.right_shift(packed, np.int8(4), out=codes[1::2])
    if codes.size > numel and codes[numel] != 0:
        raise CodecError("bad-code", "the unused last nibble of an odd-length int4 payload must be zero")
    return codes[:numel]


def _copied(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.copyto(out, values)
    return out
