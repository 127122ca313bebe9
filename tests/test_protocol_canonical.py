"""Canonical msgpack, capped zstd and the schema language."""

from __future__ import annotations

import math

import msgpack
import pytest
import zstandard

from locomesh.protocol import ProtocolError, compress, decompress, pack, unpack
from locomesh.protocol.canonical import MAX_DEPTH
from locomesh.protocol.schema import Bool, Bytes, Float, Int, List, Map, OneOf, Scalar, Str, Struct

VALUES = [
    None, True, False, 0, -1, 127, 128, -33, 2**32, -(2**63), 2**64 - 1, 0.5, -1e300, "", "héllo",
    b"", b"\x00\xff", [], [1, [2, [3]]], {}, {"b": 1, "a": 2, "aa": {"z": None}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_round_trip_canonically(value):
    data = pack(value)
    assert unpack(data, max_size=1 << 20) == value
    assert pack(unpack(data, max_size=1 << 20)) == data


def test_map_keys_are_sorted_by_utf8_bytes():
    assert pack({"b": 1, "a": 2}) == pack({"a": 2, "b": 1})
    assert list(msgpack.unpackb(pack({"é": 1, "z": 2}))) == ["z", "é"]


@pytest.mark.parametrize(
    "value,code",
    [
        (math.nan, "not-finite"), (math.inf, "not-finite"), (2**64, "out-of-range"),
        (-(2**63) - 1, "out-of-range"), ({1: "x"}, "bad-key"), (object(), "bad-type"), ({"a"}, "bad-type"),
    ],
    ids=repr,
)
def test_values_without_a_canonical_form_are_refused(value, code):
    with pytest.raises(ProtocolError) as excinfo:
        pack(value)
    assert excinfo.value.code == code


def test_nesting_is_bounded():
    value: list = []
    for _ in range(MAX_DEPTH + 2):
        value = [value]
    with pytest.raises(ProtocolError, match="too-deep"):
        pack(value)
    with pytest.raises(ProtocolError):
        unpack(b"\x91" * 100_000 + b"\xc0", max_size=1 << 20)


@pytest.mark.parametrize(
    "data,code",
    [
        (b"\xc1", "malformed"),  # never-used msgpack byte
        (b"\xd4\x01\x00", "malformed"),  # extension type
        (b"\xcc\x05", "non-canonical"),  # 5 as uint8 instead of fixint
        (b"\xca\x3f\x00\x00\x00", "non-canonical"),  # float32 instead of float64
        (b"\x82\xa1b\x01\xa1a\x02", "non-canonical"),  # keys out of order
        (b"\x82\xa1a\x01\xa1a\x02", "non-canonical"),  # duplicate keys
        (b"\xa2\xff\xfe", "malformed"),  # invalid UTF-8
        (b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", "not-finite"),  # NaN
        (b"\x92\x01", "malformed"),  # truncated array
        (b"\xdd\xff\xff\xff\xff", "malformed"),  # array header claiming 4G items
        (b"\x01\x02", "trailing-bytes"),
        (b"\x81\x01\x02", "malformed"),  # integer map key
    ],
    ids=lambda v: v.hex() if isinstance(v, bytes) else v,
)
def test_bad_msgpack_is_rejected_with_a_code(data, code):
    with pytest.raises(ProtocolError) as excinfo:
        unpack(data, max_size=1 << 20)
    assert excinfo.value.code == code


def test_size_cap_is_checked_before_parsing():
    with pytest.raises(ProtocolError, match="too-large"):
        unpack(pack(b"x" * 100), max_size=50)


def test_zstd_round_trip_and_caps():
    data = bytes(range(256)) * 1000
    assert decompress(compress(data), max_output=len(data)) == data
    with pytest.raises(ProtocolError, match="too-large"):
        decompress(compress(data), max_output=len(data) - 1)


def test_zstd_bomb_is_refused_without_inflating():
    bomb = compress(b"\x00" * (256 * 1024 * 1024), level=19)
    assert len(bomb) < 100_000
    with pytest.raises(ProtocolError, match="too-large"):
        decompress(bomb, max_output=1 << 20)


@pytest.mark.parametrize(
    "frame,code",
    [
        (b"", "bad-compression"),
        (b"not zstd at all", "bad-compression"),
        (zstandard.ZstdCompressor(write_content_size=False).compress(b"abc"), "bad-compression"),
        (compress(b"abc" * 1000)[:-2], "truncated"),
        (compress(b"abc" * 1000) + b"\x00", "trailing-bytes"),
        (compress(b"abc") + compress(b"abc"), "trailing-bytes"),
    ],
    ids=["empty", "garbage", "no-size", "truncated", "trailing", "two-frames"],
)
def test_bad_zstd_frames_are_rejected(frame, code):
    with pytest.raises(ProtocolError) as excinfo:
        decompress(frame, max_output=1 << 20)
    assert excinfo.value.code == code


def test_every_corrupted_byte_gives_an_error_or_bounded_output():
    """Integrity is the signature's job; the decompressor's is never to crash or overrun."""
    original = bytes(range(256)) * 64
    frame = compress(original)
    outcomes = set()
    for index in range(len(frame)):
        corrupt = bytearray(frame)
        corrupt[index] ^= 0xFF
        try:
            out = decompress(bytes(corrupt), max_output=len(original))
        except ProtocolError as exc:
            outcomes.add(exc.code)
        else:
            assert len(out) <= len(original)
            outcomes.add("inflated")
    assert "bad-compression" in outcomes


SCHEMA = Struct(
    {
        "n": Int(0, 10), "x": Float(0.0, 1.0), "ok": Bool(), "blob": Bytes(2, 4), "name": Str(1, 5),
        "mode": OneOf(frozenset({"a", "b"})), "items": List(Int(), max_len=2), "cfg": Map(Scalar(), max_len=2),
    },
    optional=frozenset({"cfg"}),
)
GOOD = {"n": 3, "x": 0.5, "ok": True, "blob": b"ab", "name": "abc", "mode": "a", "items": [1]}


def test_schema_accepts_a_good_body():
    SCHEMA.check(GOOD)
    SCHEMA.check({**GOOD, "cfg": {"k": 1.5}})


@pytest.mark.parametrize(
    "change",
    [
        {"n": 11}, {"n": True}, {"n": "3"}, {"x": 2.0}, {"x": 1}, {"ok": 1}, {"blob": b"a"}, {"blob": "ab"},
        {"name": ""}, {"name": "toolong"}, {"mode": "c"}, {"items": [1, 2, 3]}, {"items": ["a"]},
        {"cfg": {"a": 1, "b": 2, "c": 3}}, {"cfg": {"a": [1]}}, {"cfg": {"": 1}}, {"extra": 1},
    ],
    ids=repr,
)
def test_schema_rejects_each_violation(change):
    with pytest.raises(ProtocolError) as excinfo:
        SCHEMA.check({**GOOD, **change})
    assert excinfo.value.code == "bad-field"


def test_schema_rejects_a_missing_field():
    body = dict(GOOD)
    del body["name"]
    with pytest.raises(ProtocolError, match="missing field 'name'"):
        SCHEMA.check(body)
