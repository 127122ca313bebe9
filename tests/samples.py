"""A valid sample body for every registered message kind, built from its schema.

Tests use it to round-trip every kind, so a kind added anywhere is tested here
without anyone writing its sample by hand.
"""

from __future__ import annotations

from typing import Any

from locomesh.protocol import KINDS
from locomesh.protocol.schema import (
    Bool, Bytes, Float, Int, List, Map, Nullable, OneOf, Scalar, Spec, Str, Struct,
)


def sample_body(kind: str) -> dict[str, Any]:
    return sample(KINDS[kind].body)


def sample(spec: Spec) -> Any:
    """A small value that satisfies `spec`, with one item in every list that allows it."""
    if isinstance(spec, Struct):
        return {name: sample(field) for name, field in spec.fields.items()}
    if isinstance(spec, Int):
        return max(spec.min, min(spec.max, 1))
    if isinstance(spec, Float):
        return max(spec.min, min(spec.max, 0.5))
    if isinstance(spec, Bool):
        return True
    if isinstance(spec, Bytes):
        return bytes(i % 251 + 1 for i in range(max(spec.min_len, min(spec.max_len, 8))))
    if isinstance(spec, Str):
        return "s" * max(spec.min_len, min(spec.max_len, 3))
    if isinstance(spec, OneOf):
        return sorted(spec.values)[0]
    if isinstance(spec, Scalar):
        return 3
    if isinstance(spec, Nullable):
        return sample(spec.inner)
    if isinstance(spec, List):
        return [sample(spec.item)] * max(spec.min_len, min(spec.max_len, 1))
    if isinstance(spec, Map):
        return {"key": sample(spec.value)} if spec.max_len else {}
    raise TypeError(f"no sample for {spec!r}")
