"""The pseudo-gradient codec: round trips, error bounds, error feedback, and every way decoding refuses."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from locomesh.protocol import ProtocolError, pack
from locomesh.training.codec import (
    FP16_MAX,
    CodecError,
    Encoder,
    QuantizedRow,
    decode,
    decode_row,
    encode,
    non_finite_payload,
)

NUMEL = 5000  # not a multiple of any block size, odd for int4's last nibble: exercises the tails
BLOCK = 256


def pseudo_gradient(seed: int, numel: int = NUMEL) -> np.ndarray:
    """Heavy-tailed, with blocks of very different magnitude, like a real Δ across layers."""
    rng = np.random.default_rng(seed)
    magnitudes = np.repeat(10.0 ** rng.uniform(-4, 0, size=-(-numel // 300)), 300)[:numel]
    return (rng.standard_t(df=3, size=numel) * magnitudes).astype(np.float32)


def per_block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    padded = np.zeros(-(-x.size // block) * block, dtype=np.float32)
    padded[: x.size] = np.abs(x)
    return np.repeat(padded.reshape(-1, block).max(axis=1), block)[: x.size]


def build(mode: str, numel: int, block: int, body: bytes, *, header: dict | None = None) -> bytes:
    """A payload assembled by hand, to reach the decoder's checks one at a time."""
    fields = {"v": 1, "mode": mode, "numel": numel, "block": block} if header is None else header
    head = pack(fields)
    return len(head).to_bytes(2, "big") + head + zstandard.ZstdCompressor(write_content_size=True).compress(body)


def int8_body(numel: int, block: int, scale: float = 0.5, code: int = 1) -> bytes:
    blocks = -(-numel // block)
    return np.full(blocks, scale, dtype="<f2").tobytes() + np.full(numel, code, dtype=np.int8).tobytes()


def header_of(payload: bytes) -> bytes:
    return payload[: 2 + int.from_bytes(payload[:2], "big")]


def corrupt_frame(payload: bytes) -> bytes:
    """Keep the frame header and the block structure, scramble what the first block holds."""
    head = header_of(payload)
    frame = bytearray(payload[len(head) :])
    frame[12:40] = bytes(range(200, 228))
    return head + bytes(frame)


# -- round trips and error bounds --------------------------------------------------


@pytest.mark.parametrize("mode, levels", [("int8", 127), ("int4", 7)])
def test_quantized_round_trip_error_is_half_a_step(mode, levels):
    x = pseudo_gradient(1)
    decoded = decode(encode(x, mode, block_size=BLOCK), NUMEL, block_size=BLOCK)
    assert decoded.dtype == np.float32 and decoded.shape == x.shape
    # Scale = absmax/levels rounded up to float16: at most 2**-10 relative above, or a subnormal step.
    step = np.maximum(per_block_absmax(x, BLOCK) / levels * (1 + 2.0**-10), 2.0**-24)
    assert np.all(np.abs(x - decoded) <= step / 2 * (1 + 1e-6))


def test_fp32_round_trip_is_exact():
    x = pseudo_gradient(2)
    assert np.array_equal(decode(encode(x, "fp32"), NUMEL).view(np.uint32), x.view(np.uint32))


def test_zero_vector_and_single_element():
    assert not decode(encode(np.zeros(100, np.float32), "int8", block_size=32), 100).any()
    one = np.array([-3.5], dtype=np.float32)
    assert decode(encode(one, "int4", block_size=32), 1)[0] == -3.5


def test_encoding_is_deterministic():
    x = pseudo_gradient(3)
    assert encode(x, "int8") == encode(x, "int8")


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_error_feedback_keeps_running_sums_together(mode):
    """Σ decoded − Σ inputs is exactly the residual left in the encoder: one step's error, not r steps'."""
    encoder = Encoder(mode, block_size=BLOCK, error_feedback=True)
    plain = Encoder(mode, block_size=BLOCK, error_feedback=False)
    inputs = np.zeros(NUMEL, np.float64)
    with_feedback = np.zeros(NUMEL, np.float64)
    without = np.zeros(NUMEL, np.float64)
    x = pseudo_gradient(4)
    for _ in range(30):  # the same Δ every round: the bias without feedback adds up
        inputs += x
        with_feedback += decode(encoder.encode(x), NUMEL)
        without += decode(plain.encode(x), NUMEL)
    drift = np.abs(with_feedback - inputs)
    assert np.allclose(drift, np.abs(encoder.residual), rtol=1e-4, atol=1e-6)
    # The residual is at most half a step of the block's scale (inputs + residual ≤ 2·|x| per block).
    bound = np.maximum(2 * per_block_absmax(x, BLOCK) / {"int8": 127, "int4": 7}[mode], 2.0**-24)
    assert np.all(drift <= bound)
    assert np.linalg.norm(with_feedback - inputs) < 0.2 * np.linalg.norm(without - inputs)


def test_a_refused_input_leaves_the_residual_alone():
    encoder = Encoder("int8", block_size=BLOCK, error_feedback=True)
    encoder.encode(pseudo_gradient(7))
    kept = encoder.residual.copy()
    with pytest.raises(ValueError):
        encoder.encode(np.full(NUMEL, np.inf, np.float32))
    assert np.array_equal(encoder.residual, kept)


def test_encoder_refuses_what_it_cannot_represent():
    with pytest.raises(ValueError):
        encode(np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError):
        encode(np.array([1e10], np.float32))  # scale 1e10/127 > float16's max
    with pytest.raises(ValueError):
        Encoder("int8", block_size=1000)
    with pytest.raises(ValueError):
        Encoder("int3")


# -- every way decoding refuses ----------------------------------------------------


def test_codec_error_is_a_protocol_error():
    assert issubclass(CodecError, ProtocolError)


def good_int8() -> bytes:
    return encode(pseudo_gradient(5), "int8", block_size=BLOCK)


REJECTIONS = {
    "wrong-numel": lambda: (good_int8(), NUMEL + 1),
    "truncated-payload": lambda: (good_int8()[:-7], NUMEL),
    "truncated-header": lambda: (good_int8()[:5], NUMEL),
    "empty": lambda: (b"", NUMEL),
    "trailing-bytes": lambda: (good_int8() + b"\x00", NUMEL),
    "nan-scale": lambda: (non_finite_payload("int8", float("nan"), NUMEL, block_size=BLOCK), NUMEL),
    "inf-scale": lambda: (non_finite_payload("int8", float("inf"), NUMEL, block_size=BLOCK), NUMEL),
    "int4-nan-scale": lambda: (non_finite_payload("int4", float("nan"), NUMEL, block_size=BLOCK), NUMEL),
    "fp32-inf": lambda: (non_finite_payload("fp32", float("inf"), NUMEL), NUMEL),
    "negative-scale": lambda: (build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK, scale=-0.5)), NUMEL),
    "negative-zero-scale": lambda: (build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK, scale=-0.0)), NUMEL),
    "code-minus-128": lambda: (build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK, code=-128)), NUMEL),
    "int4-code-minus-8": lambda: (build("int4", 4, 32, np.float16(1).tobytes() + bytes([0x18, 0x11])), 4),
    "int4-dirty-pad-nibble": lambda: (build("int4", 3, 32, np.float16(1).tobytes() + bytes([0x11, 0x71])), 3),
    "wrong-mode": lambda: (encode(pseudo_gradient(5), "int4", block_size=BLOCK), NUMEL, {"modes": ("int8",)}),
    "unknown-mode": lambda: (build("int2", NUMEL, BLOCK, int8_body(NUMEL, BLOCK)), NUMEL),
    "block-not-power-of-two": lambda: (build("int8", NUMEL, 1000, int8_body(NUMEL, 1000)), NUMEL),
    "block-too-small": lambda: (build("int8", NUMEL, 16, int8_body(NUMEL, 16)), NUMEL),
    "block-not-the-runs": lambda: (encode(pseudo_gradient(5), "int8", block_size=512), NUMEL, {"block_size": BLOCK}),
    "fp32-with-block": lambda: (build("fp32", 4, 32, bytes(16)), 4),
    "bad-version": lambda: (build("int8", 4, 32, int8_body(4, 32), header={"v": 2, "mode": "int8", "numel": 4, "block": 32}), 4),
    "extra-header-key": lambda: (
        build("int8", 4, 32, int8_body(4, 32), header={"v": 1, "mode": "int8", "numel": 4, "block": 32, "x": 0}),
        4,
    ),
    "bool-numel": lambda: (
        build("int8", 4, 32, int8_body(4, 32), header={"v": 1, "mode": "int8", "numel": True, "block": 32}), 1
    ),
    "header-not-a-map": lambda: (build("int8", 4, 32, int8_body(4, 32), header=[1, "int8", 4, 32]), 4),
    "header-garbage": lambda: (b"\x00\x03\xc1\xc1\xc1" + good_int8()[40:], NUMEL),
    "header-length-zero": lambda: (b"\x00\x00" + good_int8(), NUMEL),
    "short-body": lambda: (build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK)[:-1]), NUMEL),
    "long-body": lambda: (build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK) + b"\x00"), NUMEL),
    "zstd-bomb": lambda: (build("int8", NUMEL, BLOCK, bytes(50_000_000)), NUMEL),
    "not-zstd": lambda: (header_of(good_int8()) + b"garbage" * 10, NUMEL),
    "corrupt-frame": lambda: (corrupt_frame(good_int8()), NUMEL),
    "not-bytes": lambda: ("a string", NUMEL),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_decoder_rejects(case):
    payload, numel, *options = REJECTIONS[case]()
    with pytest.raises(CodecError) as caught:
        decode(payload, numel, **(options[0] if options else {}))
    assert caught.value.code and caught.value.reason


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_the_row_decoder_rejects_what_the_decoder_rejects(case):
    payload, numel, *options = REJECTIONS[case]()
    with pytest.raises(CodecError) as caught:
        decode_row(payload, numel, **(options[0] if options else {}))
    with pytest.raises(CodecError) as expected:
        decode(payload, numel, **(options[0] if options else {}))
    assert caught.value.code == expected.value.code


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_row_gives_the_decoded_bits_for_any_range(mode):
    payload = encode(pseudo_gradient(3), mode, block_size=BLOCK)
    decoded = decode(payload, NUMEL, block_size=BLOCK)
    row = decode_row(payload, NUMEL, block_size=BLOCK)
    assert isinstance(row, QuantizedRow) and row.size == len(row) == NUMEL
    assert row.codes.itemsize == 1  # a byte a value while it waits to be aggregated
    ranges = [(0, NUMEL), (0, BLOCK), (BLOCK, 3 * BLOCK), (7, 9), (BLOCK - 1, BLOCK + 1), (NUMEL - 3, NUMEL), (5, 5)]
    rng = np.random.default_rng(4)
    ranges += [tuple(sorted(rng.integers(0, NUMEL + 1, 2))) for _ in range(20)]
    for start, stop in ranges:
        assert row[start:stop].view(np.uint32).tolist() == decoded[start:stop].view(np.uint32).tolist()
    assert np.asarray(row).view(np.uint32).tolist() == decoded.view(np.uint32).tolist()
    with pytest.raises(TypeError):
        row[3]


def test_an_fp32_row_is_its_values():
    x = pseudo_gradient(5)
    row = decode_row(encode(x, "fp32"), NUMEL)
    assert isinstance(row, np.ndarray) and row.dtype == np.float32
    assert row.view(np.uint32).tolist() == x.view(np.uint32).tolist()


def test_scale_above_configured_max_is_rejected():
    payload = build("int8", NUMEL, BLOCK, int8_body(NUMEL, BLOCK, scale=FP16_MAX))
    assert np.isfinite(decode(payload, NUMEL)).all()  # the largest finite float16 scale is allowed...
    with pytest.raises(CodecError, match="bad-scale"):
        decode(payload, NUMEL, max_scale=100.0)  # ...unless the run sets a lower bound


def test_bomb_is_refused_before_inflating():
    with pytest.raises(CodecError) as caught:
        decode(build("int8", 64, 32, bytes(1 << 30)), 64)
    assert caught.value.code == "too-large"


@settings(max_examples=200)
@given(
    mode=st.sampled_from(["int8", "int4", "fp32"]),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 20),
)
def test_mutated_payloads_give_codec_errors_or_finite_vectors(mode, edits, cut):
    numel = 300
    payload = bytearray(encode(pseudo_gradient(6, numel), mode, block_size=64))
    for position, value in edits:
        payload[position % len(payload)] = value
    if cut:
        del payload[-cut:]
    try:
        decoded = decode(bytes(payload), numel)
    except ProtocolError as error:
        assert isinstance(error, CodecError)
        return
    assert decoded.dtype == np.float32 and decoded.shape == (numel,) and np.isfinite(decoded).all()


def test_the_residual_is_updated_in_place_unless_the_sum_might_not_encode():
    """The encoder holds one residual vector: input + residual is written into it when it surely
    encodes, and into a new array near float16's limit (where a refusal must leave it alone)."""
    encoder = Encoder("int8", block_size=BLOCK, error_feedback=True)
    encoder.encode(pseudo_gradient(7))
    residual = encoder.residual
    encoder.encode(pseudo_gradient(8))
    assert encoder.residual is residual
    near_limit = np.full(NUMEL, 0.995 * 65504 * 127, np.float32)
    payload = encoder.encode(near_limit)
    assert encoder.residual is not residual  # the checked path
    assert np.allclose(decode(payload, NUMEL), near_limit, rtol=1e-2)
