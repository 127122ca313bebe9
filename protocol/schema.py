"""A small schema language for message bodies: fields, types, bounds.

A spec checks a decoded value and raises `ProtocolError("bad-field", ...)` with
the path of the first offending field. Specs are plain frozen dataclasses so a
kind's schema reads like a table:

    Struct({"round": Int(0, 2**40), "hash": Bytes(32, 32)}, optional={"note"})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import ProtocolError

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1


def _fail(path: str, problem: str) -> ProtocolError:
    return ProtocolError("bad-field", f"{path or 'body'}: {problem}")


class Spec:
    def check(self, value: Any, path: str = "") -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    min: int = INT64_MIN
    max: int = UINT64_MAX

    def check(self, value: Any, path: str = "") -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(path, f"expected an integer, got {type(value).__name__}")
        if not self.min <= value <= self.max:
            raise _fail(path, f"{value} is outside [{self.min}, {self.max}]")


@dataclass(frozen=True)
class Float(Spec):
    min: float = -math.inf
    max: float = math.inf

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, float):
            raise _fail(path, f"expected a float, got {type(value).__name__}")
        if not (math.isfinite(value) and self.min <= value <= self.max):
            raise _fail(path, f"{value} is outside [{self.min}, {self.max}]")


@dataclass(frozen=True)
class Bool(Spec):
    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, bool):
            raise _fail(path, f"expected a boolean, got {type(value).__name__}")


@dataclass(frozen=True)
class Bytes(Spec):
    min_len: int = 0
    max_len: int = 1024

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, bytes):
            raise _fail(path, f"expected bytes, got {type(value).__name__}")
        if not self.min_len <= len(value) <= self.max_len:
            raise _fail(path, f"{len(value)} bytes is outside [{self.min_len}, {self.max_len}]")


@dataclass(frozen=True)
class Str(Spec):
    min_len: int = 0
    max_len: int = 256

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, str):
            raise _fail(path, f"expected a string, got {type(value).__name__}")
        if not self.min_len <= len(value) <= self.max_len:
            raise _fail(path, f"{len(value)} characters is outside [{self.min_len}, {self.max_len}]")


@dataclass(frozen=True)
class OneOf(Spec):
    """A string from a fixed set."""

    values: frozenset[str]

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, str) or value not in self.values:
            raise _fail(path, f"{value!r} is not one of {sorted(self.values)}")


@dataclass(frozen=True)
class Scalar(Spec):
    """None, a boolean, a 64-bit integer, a finite float or a short string: config values."""

    max_len: int = 256

    def check(self, value: Any, path: str = "") -> None:
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, int):
            return Int().check(value, path)
        if isinstance(value, float):
            return Float().check(value, path)
        if isinstance(value, str):
            return Str(0, self.max_len).check(value, path)
        raise _fail(path, f"expected a scalar, got {type(value).__name__}")


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec

    def check(self, value: Any, path: str = "") -> None:
        if value is not None:
            self.inner.check(value, path)


@dataclass(frozen=True)
class List(Spec):
    item: Spec
    max_len: int
    min_len: int = 0

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, list):
            raise _fail(path, f"expected a list, got {type(value).__name__}")
        if not self.min_len <= len(value) <= self.max_len:
            raise _fail(path, f"{len(value)} items is outside [{self.min_len}, {self.max_len}]")
        for index, item in enumerate(value):
            self.item.check(item, f"{path}[{index}]")


@dataclass(frozen=True)
class Map(Spec):
    """A map with free string keys, all values of one spec."""

    value: Spec
    max_len: int
    key: Spec = Str(1, 64)

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, dict):
            raise _fail(path, f"expected a map, got {type(value).__name__}")
        if len(value) > self.max_len:
            raise _fail(path, f"{len(value)} entries is over {self.max_len}")
        for key, item in value.items():
            self.key.check(key, f"{path}.<key>")
            self.value.check(item, f"{path}.{key}")


@dataclass(frozen=True)
class Struct(Spec):
    """A map with named fields; every field required unless named in `optional`; no others."""

    fields: dict[str, Spec]
    optional: frozenset[str] = field(default_factory=frozenset)

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, dict):
            raise _fail(path, f"expected a map, got {type(value).__name__}")
        unknown = value.keys() - self.fields.keys()
        if unknown:
            raise _fail(path, f"unknown field {sorted(unknown)[0]!r}")
        for name, spec in self.fields.items():
            if name in value:
                spec.check(value[name], f"{path}.{name}" if path else name)
            elif name not in self.optional:
                raise _fail(path, f"missing field {name!r}")
