"""The inputs of `protocol_fuzz.py`: valid messages of every kind, and the ways to break them.

Every generator takes the corpus and a `random.Random` and returns bytes; the
campaign's input number i is `make_case(corpus, seed, i)`, a pure function of
(seed, i), so any input can be rebuilt from its index. The generators:

- random bytes, alone or behind a map header;
- byte-level mutations of valid envelopes (bit flips, insertions, deletions,
  truncations, msgpack type bytes and 4-byte length fields swapped in), and
  splices of two envelopes;
- structural mutations of decoded envelopes (a field replaced, removed, added,
  wrapped or retyped), re-encoded canonically and, half the time, re-signed so
  the body schemas are reached past the signature;
- non-canonical encodings of valid envelopes (wide integers, long length
  headers, unsorted or duplicate map keys, float32);
- hostile shapes (nesting bombs, 4 GiB length prefixes, extension types, NaN
  and infinities), alone or planted as a field of a real envelope;
- zstd frames: bombs, frames with no content size, corrupted, concatenated,
  behind a skippable frame, or cut short.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass
from typing import Any, Callable

import zstandard

from locomesh.protocol import KINDS, Identity, ProtocolError, compress, pack, unpack
from locomesh.protocol.envelope import signing_bytes
from locomesh.protocol.schema import Bool, Bytes, Float, Int, List, Map, Nullable, OneOf, Scalar, Spec, Str, Struct

RUN = bytes(range(32))
OTHER_RUN = bytes(32)

# --- valid material to mutate ---------------------------------------------------------------------


def random_body(spec: Spec, rng: random.Random) -> Any:
    """A random value that satisfies `spec`, small enough to keep messages under a few KiB."""
    if isinstance(spec, Struct):
        present = [name for name in spec.fields if name not in spec.optional or rng.random() < 0.5]
        return {name: random_body(spec.fields[name], rng) for name in present}
    if isinstance(spec, Int):
        near_min = rng.randint(spec.min, min(spec.max, spec.min + 1000))
        return rng.choice([spec.min, spec.max, near_min, rng.randint(spec.min, spec.max)])
    if isinstance(spec, Float):
        low, high = max(spec.min, -1e6), min(spec.max, 1e6)
        return rng.uniform(low, high)
    if isinstance(spec, Bool):
        return rng.random() < 0.5
    if isinstance(spec, Bytes):
        return rng.randbytes(rng.randint(spec.min_len, min(spec.max_len, spec.min_len + 48)))
    if isinstance(spec, Str):
        return random_text(rng, rng.randint(spec.min_len, min(spec.max_len, spec.min_len + 24)))
    if isinstance(spec, OneOf):
        return rng.choice(sorted(spec.values))
    if isinstance(spec, Scalar):
        scalars = [None, True, rng.randint(-(2**63), 2**64 - 1), rng.uniform(-1e9, 1e9), random_text(rng, rng.randint(0, 16))]
        return rng.choice(scalars)
    if isinstance(spec, Nullable):
        return None if rng.random() < 0.3 else random_body(spec.inner, rng)
    if isinstance(spec, List):
        count = rng.randint(spec.min_len, min(spec.max_len, spec.min_len + 3))
        return [random_body(spec.item, rng) for _ in range(count)]
    if isinstance(spec, Map):
        count = rng.randint(0, min(spec.max_len, 3))
        return {random_text(rng, rng.randint(1, 12)) or "k": random_body(spec.value, rng) for _ in range(count)}
    raise TypeError(f"no generator for {spec!r}")


def random_text(rng: random.Random, length: int) -> str:
    alphabet = "abcxyz019 ._-/éß漢🙂\x00\x7f"
    return "".join(rng.choice(alphabet) for _ in range(length))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Any msgpack-able value (not always canonical: it may hold NaN), for replacing fields."""
    choice = rng.randrange(12 if depth < 3 else 9)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        edges = [0, 1, -1, 127, 128, 255, 256, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1]
        return rng.choice(edges + [rng.randint(-(2**63), 2**64 - 1)])
    if choice == 3:
        return rng.choice([0.0, -0.0, 1.0, 1.5, 1e308, 5e-324, float("nan"), float("inf"), -float("inf")])
    if choice in (4, 5):
        return random_text(rng, rng.choice([0, 1, 31, 32, rng.randint(0, 300)]))
    if choice in (6, 7, 8):
        return rng.randbytes(rng.choice([0, 1, 31, 32, 33, 64, 65, rng.randint(0, 300)]))
    if choice in (9, 10):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_text(rng, rng.randint(0, 8)): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


@dataclass
class Corpus:
    """Identities, valid envelopes of every kind, and zstd frames: the raw material of mutations."""

    identities: list[Identity]
    envelopes: list[bytes]
    frames: list[bytes]
    bombs: list[bytes]

    @classmethod
    def build(cls, seed: int) -> Corpus:
        rng = random.Random(f"corpus:{seed}")
        identities = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(4)]
        envelopes = []
        for kind_name in sorted(KINDS):
            kind = KINDS[kind_name]
            for _ in range(4):
                body = random_body(kind.body, rng)
                try:
                    fields = {"v": 1, "kind": kind_name, "run": RUN if kind.run_scoped else b"", "body": body}
                    envelopes.append(_sign_fields(rng.choice(identities), fields))
                except ProtocolError:
                    continue  # a random body over the kind's size cap; others of the kind remain
        frames = [compress(rng.randbytes(n) if n % 2 else bytes(n)) for n in (0, 1, 100, 4097, 70000)]
        frames.append(compress(b"abc" * 50000, level=19))
        bombs = [
            compress(bytes(64 << 20)),  # 64 MiB of zeros in a few KiB, content size declared
            zstandard.ZstdCompressor(write_content_size=False).compress(bytes(8 << 20)),  # no content size
            _streamed(bytes(1 << 20)),  # a streaming frame: no content size either
        ]
        return cls(identities, envelopes, frames, bombs)


def _streamed(data: bytes) -> bytes:
    stream = zstandard.ZstdCompressor().compressobj()
    return stream.compress(data) + stream.flush()


def _sign_fields(identity: Identity, fields: dict[str, Any]) -> bytes:
    """Encode an envelope from `fields`, signed by `identity`, with no schema check (that is the point)."""
    fields = {**fields, "author": identity.public_key}
    signed = signing_bytes(fields["v"], fields["kind"], fields["run"], fields["author"], fields["body"])
    fields["sig"] = identity.sign(signed)
    return pack(fields)


# --- byte-level mutations --------------------------------------------------------------------------

ODD_FLOATS = [b"\xcb" + struct.pack(">d", x) for x in (math.nan, math.inf, -math.inf)] + [
    b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x01",  # a NaN with a payload
    b"\xca\x7f\xc0\x00\x00",  # float32 NaN
    b"\xca\x3f\x80\x00\x00",  # float32 1.0: finite, but not the canonical float64
]

TYPE_BYTES = bytes(
    [0x80, 0x81, 0x86, 0x8F, 0x90, 0x91, 0x9F, 0xA0, 0xA1, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9,
     0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD,
     0xDE, 0xDF, 0xE0, 0xFF, 0x00, 0x7F]
)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 4, 8])):
        i = rng.randrange(len(buf) + 1)
        op = rng.randrange(7)
        if op == 0 and i < len(buf):
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 2:
            del buf[i : i + rng.randint(1, 8)]
        elif op == 3:
            del buf[i:]
        elif op == 4 and i < len(buf):
            buf[i] = rng.randrange(256)
        elif op == 5 and i < len(buf):
            buf[i] = rng.choice(TYPE_BYTES)
        elif op == 6 and i + 4 <= len(buf):
            buf[i : i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00", b"\x80\x00\x00\x00"])
    return bytes(buf)


def splice(a: bytes, b: bytes, rng: random.Random) -> bytes:
    return a[: rng.randint(0, len(a))] + b[rng.randint(0, len(b)) :]


# --- structural mutations --------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, prefix + (index,))
    return found


def mutate_structure(fields: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Replace, retype, remove or add one node somewhere in a decoded envelope."""
    path = rng.choice(_paths(fields)[1:])
    parent = fields
    for step in path[:-1]:
        parent = parent[step]
    key, old = path[-1], parent[path[-1]]
    op = rng.randrange(6)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
    elif op == 1 and isinstance(parent, dict):
        parent[random_text(rng, rng.randint(0, 6))] = random_value(rng)
    elif op == 2:
        parent[key] = [old] if rng.random() < 0.5 else {"x": old}
    elif op == 3:
        parent[key] = _retype(old, rng)
    else:
        parent[key] = random_value(rng)
    return fields


def _retype(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        as_bytes = value.to_bytes(8, "big", signed=True) if -(2**63) <= value < 2**63 else b""
        return rng.choice([float(value), str(value), as_bytes, -value - 1, value + 1])
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    return None


def structural_case(corpus: Corpus, rng: random.Random) -> bytes:
    fields = unpack(rng.choice(corpus.envelopes), max_size=1 << 23)
    for _ in range(rng.choice([1, 1, 2, 3])):
        fields = mutate_structure(fields, rng)
    identity = rng.choice(corpus.identities)
    try:
        if rng.random() < 0.5 and {"v", "kind", "run", "body"} <= fields.keys():
            return _sign_fields(identity, fields)
        return pack(fields)
    except (ProtocolError, UnicodeEncodeError):
        return canonical_like(fields, rng, 0.0)  # NaN and friends: still send them, as bytes


# --- non-canonical and hostile encodings -------------------------------------------------------------


def canonical_like(value: Any, rng: random.Random, p: float) -> bytes:
    """msgpack for `value`, each node encoded non-canonically with probability `p`.

    With p == 0 the bytes are canonical when the value has a canonical form.
    """
    out = bytearray()
    _emit(value, rng, p, out)
    return bytes(out)


def _emit(value: Any, rng: random.Random, p: float, out: bytearray) -> None:
    odd = rng.random() < p
    if value is None:
        out += b"\xc0"
    elif isinstance(value, bool):
        out += b"\xc3" if value else b"\xc2"
    elif isinstance(value, int):
        out += _int(value, odd, rng)
    elif isinstance(value, float):
        fits_float32 = not math.isfinite(value) or abs(value) <= 3.4e38
        out += (b"\xca" + struct.pack(">f", value)) if odd and fits_float32 else (b"\xcb" + struct.pack(">d", value))
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out += _length(raw, (0xA0, 32), (0xD9, 0xDA, 0xDB), odd, rng) + raw
    elif isinstance(value, bytes):
        out += _length(value, None, (0xC4, 0xC5, 0xC6), odd, rng) + value
    elif isinstance(value, list):
        out += _length(value, (0x90, 16), (None, 0xDC, 0xDD), odd, rng)
        for item in value:
            _emit(item, rng, p, out)
    elif isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]).encode("utf-8", "surrogatepass"))
        if odd and items:
            if rng.random() < 0.5:
                rng.shuffle(items)
            else:
                items.insert(rng.randrange(len(items) + 1), rng.choice(items))  # a duplicate key
        out += _length(items, (0x80, 16), (None, 0xDE, 0xDF), odd, rng)
        for key, item in items:
            _emit(key, rng, p, out)
            _emit(item, rng, p, out)


_INT_FORMS = (  # msgpack code, struct format, range
    (0xCC, ">B", 0, 2**8), (0xCD, ">H", 0, 2**16), (0xCE, ">I", 0, 2**32), (0xCF, ">Q", 0, 2**64),
    (0xD0, ">b", -(2**7), 2**7), (0xD1, ">h", -(2**15), 2**15), (0xD2, ">i", -(2**31), 2**31), (0xD3, ">q", -(2**63), 2**63),
)


def _int(value: int, wide: bool, rng: random.Random) -> bytes:
    forms = []
    if 0 <= value < 128:
        forms.append(bytes([value]))
    if -32 <= value < 0:
        forms.append(struct.pack(">b", value))
    for code, fmt, low, high in _INT_FORMS:
        if low <= value < high:
            forms.append(bytes([code]) + struct.pack(fmt, value))
    if not forms:  # past 64 bits: msgpack has no form, so send the low 64 bits
        return b"\xcf" + struct.pack(">Q", value % 2**64)
    forms.sort(key=len)
    return rng.choice(forms) if wide else forms[0]


def _length(items: Any, fixed: tuple[int, int] | None, wide_codes: tuple, odd: bool, rng: random.Random) -> bytes:
    """A length header: the shortest that fits, or (when `odd`) a longer one that also fits."""
    n = len(items)
    forms = []
    if fixed and n < fixed[1]:
        forms.append(bytes([fixed[0] | n]))
    for code, fmt, limit in zip(wide_codes, (">B", ">H", ">I"), (2**8, 2**16, 2**32)):
        if code is not None and n < limit:
            forms.append(bytes([code]) + struct.pack(fmt, n))
    return rng.choice(forms) if odd else forms[0]


def noncanonical_case(corpus: Corpus, rng: random.Random) -> bytes:
    return canonical_like(unpack(rng.choice(corpus.envelopes), max_size=1 << 23), rng, rng.choice([0.02, 0.1, 0.3]))


def hostile_case(corpus: Corpus, rng: random.Random) -> bytes:
    """Shapes meant to exhaust or confuse a parser, alone or planted inside a real envelope."""
    kind = rng.randrange(6)
    if kind == 0:  # nesting bomb
        depth = rng.choice([17, 64, 1000, 100_000])
        return (b"\x91" * depth + b"\xc0") if rng.random() < 0.5 else (b"\x81\xa1k" * depth + b"\xc0")
    if kind == 1:  # a 4 GiB (or just too long) length prefix with a few bytes behind it
        code = rng.choice([0xDB, 0xC6, 0xDD, 0xDF, 0xC9, 0xDA, 0xC5, 0xDC, 0xDE])
        width = 4 if code in (0xDB, 0xC6, 0xDD, 0xDF, 0xC9) else 2
        length = rng.choice([2 ** (8 * width) - 1, 2 ** (8 * width - 1), rng.randrange(2 ** (8 * width))])
        return bytes([code]) + length.to_bytes(width, "big") + rng.randbytes(rng.randint(0, 16))
    if kind == 2:  # an extension type, alone or as a field
        ext = bytes([rng.choice([0xD4, 0xD5, 0xD6, 0xD7, 0xD8])]) + bytes([rng.randrange(256)]) + rng.randbytes(16)
        ext = ext[: 2 + {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}[ext[0]]]
        return ext if rng.random() < 0.3 else _plant(corpus, rng, ext)
    if kind == 3:  # NaN, infinities, float32
        return _plant(corpus, rng, rng.choice(ODD_FLOATS))
    if kind == 4:  # a nesting bomb planted as a field
        return _plant(corpus, rng, b"\x91" * rng.choice([16, 17, 500]) + b"\xc0")
    return _plant(corpus, rng, bytes([rng.choice([0xC4, 0xD9, 0xDC])]) + b"\xff")  # a length past the end


def _plant(corpus: Corpus, rng: random.Random, raw: bytes) -> bytes:
    """A real envelope with one field's encoding replaced by `raw` bytes."""
    fields = unpack(rng.choice(corpus.envelopes), max_size=1 << 23)
    marker = b"\xa7MARKER!"
    target = rng.choice(["v", "kind", "run", "author", "sig", "body"])
    if target == "body" and fields["body"] and rng.random() < 0.7:
        fields["body"][rng.choice(sorted(fields["body"]))] = "MARKER!"
    else:
        fields[target] = "MARKER!"
    return pack(fields).replace(marker, raw, 1)


# --- zstd frames ---------------------------------------------------------------------------------------


def zstd_case(corpus: Corpus, rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(corpus.bombs)
    if kind == 1:
        return rng.choice(corpus.frames)
    if kind == 2:  # corrupted, most often in the header where sizes and flags live
        frame = bytearray(rng.choice(corpus.frames + corpus.bombs))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(min(len(frame), 18)) if rng.random() < 0.6 else rng.randrange(len(frame))
            frame[i] ^= 1 << rng.randrange(8)
        return bytes(frame)
    if kind == 3:
        return mutate_bytes(rng.choice(corpus.frames), rng)
    if kind == 4:  # two frames back to back, or a skippable frame first
        a, b = rng.choice(corpus.frames), rng.choice(corpus.frames)
        return a + b if rng.random() < 0.5 else b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip" + a
    if kind == 5:
        return b"\x28\xb5\x2f\xfd" + rng.randbytes(rng.randint(0, 64))
    return rng.choice(corpus.frames)[: rng.randint(0, 20)]


# --- the cases -------------------------------------------------------------------------------------------


def random_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 2, 8, rng.randint(0, 64), rng.randint(0, 512), rng.randint(0, 4096)]))


@dataclass(frozen=True)
class Case:
    target: str  # "decode", "unpack" or "decompress"
    generator: str
    data: bytes
    run: bytes | None = None  # the run `decode` is told to expect


def make_case(corpus: Corpus, seed: int, index: int) -> Case:
    """Input number `index` of the campaign with `seed`: a pure function of the two."""
    rng = random.Random(f"{seed}:{index}")
    roll = rng.random()
    expected_run = rng.choice([None, None, RUN, OTHER_RUN])
    for threshold, target, generator, build in GENERATORS:
        if roll < threshold:
            return Case(target, generator, build(corpus, rng), expected_run if target == "decode" else None)
    raise AssertionError("generator weights must end at 1.0")


def _weights(table: list[tuple[float, str, str, Callable[[Corpus, random.Random], bytes]]]) -> list:
    total, cumulative = sum(w for w, *_ in table), 0.0
    out = []
    for weight, target, name, build in table:
        cumulative += weight / total
        out.append((cumulative, target, name, build))
    out[-1] = (1.0, *out[-1][1:])
    return out


GENERATORS = _weights([
    (8, "decode", "random-bytes", lambda c, r: random_bytes(r)),
    (3, "decode", "random-after-map-header", lambda c, r: b"\x86" + random_bytes(r)),
    (4, "decode", "valid", lambda c, r: r.choice(c.envelopes)),
    (22, "decode", "byte-mutation", lambda c, r: mutate_bytes(r.choice(c.envelopes), r)),
    (4, "decode", "splice", lambda c, r: splice(r.choice(c.envelopes), r.choice(c.envelopes), r)),
    (22, "decode", "structural", structural_case),
    (10, "decode", "non-canonical", noncanonical_case),
    (10, "decode", "hostile", hostile_case),
    (3, "unpack", "random-bytes", lambda c, r: random_bytes(r)),
    (4, "unpack", "random-value", lambda c, r: canonical_like(random_value(r), r, r.choice([0.0, 0.0, 0.2]))),
    (3, "unpack", "byte-mutation", lambda c, r: mutate_bytes(canonical_like(random_value(r), r, 0.0), r)),
    (2, "unpack", "hostile", hostile_case),
    (5, "decompress", "zstd", zstd_case),
])
