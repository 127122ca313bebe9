"""Canonical msgpack: one value, one encoding.

Signatures and content hashes are computed over bytes, so every value must have
exactly one byte form. The rules:

- maps have string keys, sorted by their UTF-8 bytes, no duplicates;
- integers use the shortest msgpack form (what msgpack-python emits);
- floats are always float64 and finite; strings are UTF-8 `str`, blobs are `bin`;
- no extension types, no trailing bytes, nesting at most `MAX_DEPTH` deep.

`unpack` enforces them the simple way: decode, re-encode, and demand the same
bytes. A value that does not round-trip is rejected, whatever the reason.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from .errors import ProtocolError

MAX_DEPTH = 16

Value = Any  # None | bool | int | float | str | bytes | list[Value] | dict[str, Value]


def pack(value: Value) -> bytes:
    """Encode `value` canonically. Raises `ProtocolError` for values with no canonical form."""
    return msgpack.packb(_canonicalise(value, 0), use_bin_type=True)


def unpack(data: bytes, *, max_size: int) -> Value:
    """Decode canonical msgpack of at most `max_size` bytes, or raise `ProtocolError`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("bad-type", f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise ProtocolError("too-large", f"{len(data)} bytes is over the cap of {max_size}")
    if not data:
        raise ProtocolError("truncated", "empty input")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_refuse_ext,
        )
    except msgpack.ExtraData:
        raise ProtocolError("trailing-bytes", "bytes follow the encoded value") from None
    except ProtocolError:
        raise
    except (ValueError, msgpack.UnpackException, RecursionError) as exc:
        raise ProtocolError("malformed", f"not valid msgpack: {_describe(exc)}") from None
    try:
        again = pack(value)
    except RecursionError:
        raise ProtocolError("too-deep", f"nesting deeper than {MAX_DEPTH}") from None
    if again != data:
        raise ProtocolError("non-canonical", "the value does not re-encode to the same bytes")
    return value


def _canonicalise(value: Value, depth: int) -> Value:
    if depth > MAX_DEPTH:
        raise ProtocolError("too-deep", f"nesting deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise ProtocolError("out-of-range", "integer does not fit 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError("not-finite", "floats must be finite")
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return [_canonicalise(item, depth + 1) for item in value]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ProtocolError("bad-key", "map keys must be strings")
        keys = sorted(value, key=lambda k: k.encode("utf-8", "surrogatepass"))
        return {key: _canonicalise(value[key], depth + 1) for key in keys}
    raise ProtocolError("bad-type", f"{type(value).__name__} has no canonical encoding")


def _refuse_ext(code: int, data: bytes) -> None:
    raise ProtocolError("malformed", f"msgpack extension type {code} is not allowed")


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
