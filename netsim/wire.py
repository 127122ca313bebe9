"""Shape checks for the simulator's own small protocols (peer exchange, flood).

Frames are canonical msgpack maps (`locomesh.protocol.pack/unpack`). A peer
may be Byzantine, so every decoded frame is checked against the field types
its protocol expects before anything reads it; a mismatch is a
`ProtocolError("bad-shape")`, which the guarded handler counts and answers by
resetting the stream.
"""

from __future__ import annotations

from typing import Any

from locomesh.protocol import ProtocolError, unpack


def decode_map(frame: bytes, fields: dict[str, type], *, max_size: int) -> dict[str, Any]:
    """Unpack `frame` and check it is a map with exactly `fields`, each of its type."""
    value = unpack(frame, max_size=max_size)
    if not isinstance(value, dict) or set(value) != set(fields):
        raise ProtocolError("bad-shape", f"expected a map with fields {sorted(fields)}")
    for name, kind in fields.items():
        if not isinstance(value[name], kind) or (kind is int and isinstance(value[name], bool)):
            raise ProtocolError("bad-shape", f"field {name!r} must be {kind.__name__}")
    return value


def expect_list(value: Any, *, item: type, length: int | None = None, max_items: int) -> list[Any]:
    """Check `value` is a list of at most `max_items` items of type `item` (of `length` if given)."""
    if not isinstance(value, list) or len(value) > max_items or (length is not None and len(value) != length):
        raise ProtocolError("bad-shape", f"expected a list of at most {max_items} items")
    if not all(isinstance(v, item) for v in value):
        raise ProtocolError("bad-shape", f"list items must be {item.__name__}")
    return value
