"""One op of the run-state log: signed content whose hash is its ID, sealed in a batch.

An op on the wire is a canonical msgpack array

    [content, count, index, path, sig]

- `content` is the canonical msgpack of {v, kind, run, author, body}: an envelope without its
  signature, of one of the `crdt.*` op kinds (the registry, crdt/ops/). Its body carries `parents`
  (IDs of the ops the author had as heads, sorted and distinct), `seq` (one more than the
  author's own newest op among its dependencies, or 1) and the fields of its type.
- The op ID is SHA-256 of `content`, so an op names its whole causal past by hash (Kleppmann &
  Howard, "Making CRDTs Byzantine Fault Tolerant", PaPoC 2022).
- `count`, `index`, `path`, `sig` are the seal (seal.py): the author's signature over the Merkle
  root of the IDs of the `count` ops it sealed together, and this op's path to that root.

The ID names the content alone, so an author can chain several ops before sealing them (each
names the one before as parent) and sign the batch once. The same content under two seals is
the same op: a seal only proves who wrote it.

Decoding an op checks everything that depends on the op alone: size caps, canonical bytes, the
wire shape, kind, run, schema, sorted parents, and the seal. What depends on the causal past
(the `seq` rule) is checked by the replica once the dependencies are present.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

from locomesh.protocol import Identity, ProtocolError, canonical
from locomesh.protocol.identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE
from locomesh.protocol.kinds import MAX_SEAL_OPS, MAX_SEALED_OP, RUN_ID_SIZE

from ..seal import SealCache, root_from_path, seal, verify_seal
from .base import require_sorted
from . import OP_KINDS, REGISTRY

OpId = bytes
OP_VERSION = 1
MAX_OP_WIRE = MAX_SEALED_OP
_CONTENT_FIELDS = frozenset({"author", "body", "kind", "run", "v"})
_MAX_PATH = MAX_SEAL_OPS.bit_length()


@dataclass(frozen=True, slots=True)
class Op:
    """A decoded op whose seal was checked."""

    id: OpId
    kind: str
    author: bytes
    seq: int
    parents: tuple[OpId, ...]
    body: dict[str, Any]
    data: bytes  # the whole op as it travels: content and seal
    # The ops that must be present before this one applies: its parents, and the op IDs its
    # type's `refs` fields name (a snapshot's frontier, a proposal's value: crdt/ops/base.py).
    dependencies: tuple[OpId, ...]

    @property
    def type(self) -> str:
        """The op type without the `crdt.` prefix: "join", "prevote", ..."""
        return self.kind[5:]


@dataclass(frozen=True, slots=True)
class Wire:
    """An op's bytes split into content and seal, nothing checked beyond the shape."""

    content: bytes
    count: int
    index: int
    path: list[bytes]
    sig: bytes
    data: bytes  # all of it
    id: OpId  # SHA-256 of the content


def content_id(content: bytes) -> OpId:
    return hashlib.sha256(content).digest()


def op_id(data: bytes) -> OpId:
    """The ID of the op in `data`, or `ProtocolError` if `data` is not shaped like an op."""
    return parse_wire(data).id


def parse_wire(data: bytes) -> Wire:
    """Split an op's bytes into content and seal; `ProtocolError` if they are not an op's shape."""
    raw = _unpack(data, MAX_OP_WIRE)
    if not isinstance(raw, list) or len(raw) != 5:
        raise ProtocolError("bad-op", "an op is [content, count, index, path, sig]")
    content, count, index, path, sig = raw
    if not isinstance(content, bytes) or not isinstance(sig, bytes) or len(sig) != SIGNATURE_SIZE:
        raise ProtocolError("bad-op", "content must be bytes and sig a 64-byte signature")
    if type(count) is not int or type(index) is not int or not isinstance(path, list) or len(path) > _MAX_PATH:
        raise ProtocolError("bad-seal", "count and index must be integers, path a short list")
    for node in path:
        if type(node) is not bytes or len(node) != 32:
            raise ProtocolError("bad-seal", "a Merkle path is made of 32-byte hashes")
    _require_canonical(raw, data, has_maps=False)
    return Wire(content, count, index, path, sig, data, content_id(content))


def decode_op(data: bytes, run: bytes, seals: SealCache | None = None) -> Op:
    """Parse and check one op of run `run` (content, then seal), or raise `ProtocolError`.

    `seals` remembers verified seals, so the other ops of a batch skip the signature check.
    """
    return decode_wire(parse_wire(data), run, seals)


def decode_wire(wire: Wire, run: bytes, seals: SealCache | None = None) -> Op:
    """`decode_op` for bytes already split by `parse_wire`."""
    op_id_ = wire.id
    kind, author, body = _check_content(wire.content, run)
    root = root_from_path(op_id_, wire.index, wire.count, wire.path)
    if seals is not None:
        seals.check(author, run, wire.count, root, wire.sig)
    else:
        verify_seal(author, run, wire.count, root, wire.sig)
    parents = tuple(body["parents"])
    named = REGISTRY[kind[5:]].dependencies(body)
    dependencies = tuple(sorted(set(parents) | set(named))) if named else parents
    return Op(op_id_, kind, author, body["seq"], parents, body, wire.data, dependencies)


def op_content(author: bytes, run: bytes, kind: str, parents: list[OpId], seq: int, **fields: Any) -> bytes:
    """The canonical content of a new op; `parents` (and the ID lists its type keeps sorted) are
    sorted here."""
    if kind not in OP_KINDS:
        raise ProtocolError("unexpected-kind", f"{kind!r} is not an op kind")
    entry = REGISTRY[kind[5:]]
    body = {"parents": sorted(set(parents)), "seq": seq, **fields}
    paired = {name for pair in entry.paired for name in pair}
    for name in entry.sorted_lists:
        if isinstance(body.get(name), list) and name not in paired:  # a paired list's order is the caller's
            body[name] = sorted(set(body[name]))
    entry.kind.body.check(body)  # we never seal junk
    entry.check_body(body)
    content = canonical.pack({"author": author, "body": body, "kind": kind, "run": run, "v": OP_VERSION})
    _check_size(kind, content)
    return content


def seal_ops(identity: Identity, run: bytes, contents: list[bytes]) -> list[bytes]:
    """Sign a batch of op contents (all by `identity`) at once; the ops on the wire, in order."""
    sig, paths = seal(identity, run, [content_id(c) for c in contents])
    count = len(contents)
    return [canonical.pack([c, count, index, path, sig]) for index, (c, path) in enumerate(zip(contents, paths))]


def encode_op(identity: Identity, run: bytes, kind: str, parents: list[OpId], seq: int, **fields: Any) -> bytes:
    """Write and seal one op on its own (a batch of one)."""
    return seal_ops(identity, run, [op_content(identity.public_key, run, kind, parents, seq, **fields)])[0]


def _check_content(content: bytes, run: bytes) -> tuple[str, bytes, dict[str, Any]]:
    raw = _unpack(content, REGISTRY["evidence"].max_size)
    if not isinstance(raw, dict) or raw.keys() != _CONTENT_FIELDS:
        raise ProtocolError("bad-op", "op content is a map of exactly author, body, kind, run, v")
    author, body, kind, run_id, version = raw["author"], raw["body"], raw["kind"], raw["run"], raw["v"]
    if type(version) is not int or version != OP_VERSION:
        raise ProtocolError("bad-version", f"op version {version!r} is not {OP_VERSION}")
    if not isinstance(kind, str) or kind not in OP_KINDS:
        raise ProtocolError("unexpected-kind", f"{str(kind)[:64]!r} is not an op kind")
    _check_size(kind, content)
    if not isinstance(run_id, bytes) or len(run_id) != RUN_ID_SIZE or run_id != run:
        raise ProtocolError("wrong-run", "the op belongs to another run")
    if not isinstance(author, bytes) or len(author) != PUBLIC_KEY_SIZE:
        raise ProtocolError("bad-op", f"author must be a {PUBLIC_KEY_SIZE}-byte Ed25519 key")
    entry = REGISTRY[kind[5:]]
    entry.kind.body.check(body)
    _require_canonical(raw, content)
    require_sorted(tuple(body["parents"]), "parents")
    entry.check_body(body)
    return kind, author, body


# Canonical bytes, checked fast. `canonical.unpack` decodes, re-encodes through a Python walk of
# the value and compares. Ops are the one message that arrives by the ten thousand, so they
# take a shortcut with the same result: once the value's shape is checked (by the wire shape
# or by the kind's schema), every leaf is an int, bytes, str, bool, None or a finite float, for
# which msgpack's own encoding *is* the canonical one (shortest ints, bin for bytes, float64);
# what is left is the key order of each map. So: msgpack decode, check the shape, re-encode in
# C, compare, and check that every map's keys are sorted.


def _unpack(data: bytes, max_size: int) -> Any:
    """msgpack-decode `data` (no extension types, string keys); not yet known to be canonical."""
    if not isinstance(data, bytes):
        raise ProtocolError("bad-type", f"expected bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise ProtocolError("too-large", f"{len(data)} bytes is over the cap of {max_size}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except msgpack.ExtraData:
        raise ProtocolError("trailing-bytes", "bytes follow the encoded value") from None
    except ProtocolError:
        raise
    except (ValueError, msgpack.UnpackException, RecursionError) as exc:
        raise ProtocolError("malformed", f"not valid msgpack: {str(exc)[:120]}") from None


def _require_canonical(value: Any, data: bytes, *, has_maps: bool = True) -> None:
    """`data` is the one encoding of `value`, a value whose shape is already checked."""
    if msgpack.packb(value, use_bin_type=True) != data:
        raise ProtocolError("non-canonical", "the value does not re-encode to the same bytes")
    if has_maps and not _keys_sorted(value):
        raise ProtocolError("non-canonical", "map keys are not in canonical order")


def _keys_sorted(mapping: dict) -> bool:
    """Are the keys of `mapping`, and of the maps inside it, in canonical order?"""
    if list(mapping) != sorted(mapping):  # str keys (checked): code point order is UTF-8 byte order
        return False
    for item in mapping.values():
        kind = type(item)
        if kind is dict and not _keys_sorted(item):
            return False
        # Schema lists hold items of one spec: if the first is no map, none is.
        if kind is list and item and type(item[0]) is dict and not all(map(_keys_sorted, item)):
            return False
    return True


def _refuse_ext(code: int, _data: bytes) -> None:
    raise ProtocolError("malformed", f"msgpack extension type {code} is not allowed")


def _check_size(kind: str, content: bytes) -> None:
    cap = REGISTRY[kind[5:]].max_size
    if len(content) > cap:
        raise ProtocolError("too-large", f"{kind} content of {len(content)} bytes is over its cap of {cap}")

