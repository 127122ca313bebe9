"""The decoder under random and mutated bytes: nothing but ProtocolError, and no hang.

The quick runs here are in the default suite; `bench/protocol_fuzz.py` runs the
100,000-input campaign and `-m fuzz` runs these with far more examples: `FUZZ_EXAMPLES`
of them (20,000 unless the environment says otherwise; CI runs a shorter budget, `.ci/run`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locomesh.protocol import KINDS, ProtocolError, decode, decompress, encode, unpack

from .samples import sample_body

RUN = bytes(range(32))
LONG_EXAMPLES = 20_000


def fuzz_examples(environ: Mapping[str, str]) -> int:
    """The long fuzz run's budget: `FUZZ_EXAMPLES` if set (a positive integer), else LONG_EXAMPLES.

    Raises ValueError, naming the variable, for anything else: a typo must not pass as a short run."""
    text = environ.get("FUZZ_EXAMPLES", "").strip()
    if not text:
        return LONG_EXAMPLES
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"FUZZ_EXAMPLES must be a positive integer (examples per fuzz test), got {text!r:.40}")
    return int(text)


QUICK = settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(max_examples=fuzz_examples(os.environ), suppress_health_check=[HealthCheck.too_slow])


def _valid_messages() -> list[bytes]:
    from locomesh.protocol import Identity

    alice = Identity.from_seed(b"\x05" * 32)
    return [
        encode(alice, kind, sample_body(kind), run=RUN if KINDS[kind].run_scoped else b"")
        for kind in sorted(KINDS)
    ]


@st.composite
def mutated_messages(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(_valid_messages())))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "overwrite"]))
        index = draw(st.integers(0, max(0, len(data) - 1)))
        if action == "flip" and data:
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and data:
            del data[index : index + draw(st.integers(1, 8))]
        elif action == "truncate":
            del data[index:]
        elif action == "overwrite" and data:
            data[index] = draw(st.integers(0, 255))
    return bytes(data)


def _decode_or_protocol_error(data: bytes) -> None:
    try:
        message = decode(data, run=None)
    except ProtocolError:
        return
    assert message.encode() == data  # anything accepted is canonical and verified


@QUICK
@given(st.binary(max_size=2048))
def test_random_bytes_give_only_protocol_errors(data):
    _decode_or_protocol_error(data)


@QUICK
@given(mutated_messages())
def test_mutated_messages_give_only_protocol_errors(data):
    _decode_or_protocol_error(data)


@QUICK
@given(st.binary(max_size=512))
def test_random_bytes_to_unpack_and_decompress(data):
    for call in (lambda: unpack(data, max_size=4096), lambda: decompress(data, max_output=4096)):
        try:
            call()
        except ProtocolError:
            pass


@pytest.mark.fuzz
@LONG
@given(st.one_of(st.binary(max_size=4096), mutated_messages()))
def test_long_fuzz_of_the_decoder(data):
    _decode_or_protocol_error(data)


def test_the_fuzz_budget_comes_from_the_environment():
    assert fuzz_examples({}) == LONG_EXAMPLES
    assert fuzz_examples({"FUZZ_EXAMPLES": ""}) == LONG_EXAMPLES
    assert fuzz_examples({"FUZZ_EXAMPLES": "5000"}) == 5000
    for bad in ("0", "-3", "5e3", "many"):
        with pytest.raises(ValueError, match="FUZZ_EXAMPLES"):
            fuzz_examples({"FUZZ_EXAMPLES": bad})
