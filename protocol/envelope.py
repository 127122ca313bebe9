"""The signed envelope every application message travels in.

    {v, kind, run, author, body, sig}   in canonical msgpack

`sig` is the author's Ed25519 signature over `SIGNING_DOMAIN` followed by the
canonical encoding of `[v, kind, run, author, body]`. The domain prefix keeps a
signature made for an envelope from ever being valid as anything else we sign.

`decode` checks, in this order, and stops at the first failure with a
`ProtocolError`: the global size cap, canonical msgpack, the envelope's shape,
the protocol version, the kind, the kind's size cap, the run, the body's schema,
and last (it is the expensive step) the signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import canonical
from .errors import ProtocolError
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, peer_id_from_public_key, verify
from .kinds import RUN_ID_SIZE, lookup, max_envelope_size

VERSION = 1
SIGNING_DOMAIN = b"locomesh/envelope/v1\x00"
_FIELDS = frozenset({"v", "kind", "run", "author", "body", "sig"})


@dataclass(frozen=True)
class Envelope:
    kind: str
    run: bytes
    author: bytes
    body: dict[str, Any]
    sig: bytes
    v: int = VERSION

    @property
    def author_peer_id(self) -> str:
        return peer_id_from_public_key(self.author)

    def encode(self) -> bytes:
        return canonical.pack(
            {"v": self.v, "kind": self.kind, "run": self.run, "author": self.author, "body": self.body, "sig": self.sig}
        )


def signing_bytes(v: int, kind: str, run: bytes, author: bytes, body: dict[str, Any]) -> bytes:
    return SIGNING_DOMAIN + canonical.pack([v, kind, run, author, body])


def sign(identity: Identity, kind: str, body: dict[str, Any], *, run: bytes = b"") -> Envelope:
    """Make a signed envelope; the body is checked against its kind first, so we never send junk."""
    message_kind = lookup(kind)
    _check_run(message_kind.run_scoped, run, expected=None)
    message_kind.body.check(body)
    author = identity.public_key
    sig = identity.sign(signing_bytes(VERSION, kind, run, author, body))
    envelope = Envelope(kind, run, author, body, sig)
    size = len(envelope.encode())
    if size > message_kind.max_size:
        raise ProtocolError("too-large", f"{kind} of {size} bytes is over its cap of {message_kind.max_size}")
    return envelope


def encode(identity: Identity, kind: str, body: dict[str, Any], *, run: bytes = b"") -> bytes:
    """`sign` then encode: the bytes to put on the wire."""
    return sign(identity, kind, body, run=run).encode()


def decode(data: bytes, *, run: bytes | None = None, kinds: frozenset[str] | None = None) -> Envelope:
    """Parse and verify one envelope, or raise `ProtocolError`.

    `run`, when given, is the only run this message may belong to (run-scoped
    kinds only); `kinds`, when given, is the set of kinds the caller accepts.
    """
    raw = canonical.unpack(data, max_size=max_envelope_size())
    if not isinstance(raw, dict) or raw.keys() != _FIELDS:
        raise ProtocolError("bad-envelope", "an envelope is a map of exactly v, kind, run, author, body, sig")
    v, kind, run_id, author, body, sig = (raw[name] for name in ("v", "kind", "run", "author", "body", "sig"))
    if type(v) is not int or v != VERSION:  # 1.0 and True equal 1, but are other bytes
        raise ProtocolError("bad-version", f"protocol version {v!r} is not {VERSION}")
    if not isinstance(kind, str):
        raise ProtocolError("bad-envelope", "kind must be a string")
    if kinds is not None and kind not in kinds:
        raise ProtocolError("unexpected-kind", f"{kind[:64]!r} is not expected here")
    message_kind = lookup(kind)
    if len(data) > message_kind.max_size:
        raise ProtocolError("too-large", f"{kind} of {len(data)} bytes is over its cap of {message_kind.max_size}")
    if not isinstance(author, bytes) or len(author) != PUBLIC_KEY_SIZE:
        raise ProtocolError("bad-envelope", f"author must be a {PUBLIC_KEY_SIZE}-byte Ed25519 key")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_SIZE:
        raise ProtocolError("bad-envelope", f"sig must be {SIGNATURE_SIZE} bytes")
    _check_run(message_kind.run_scoped, run_id, expected=run)
    message_kind.body.check(body)
    verify(author, sig, signing_bytes(v, kind, run_id, author, body))
    return Envelope(kind, run_id, author, body, sig, v)


def _check_run(run_scoped: bool, run_id: Any, *, expected: bytes | None) -> None:
    if not isinstance(run_id, bytes):
        raise ProtocolError("bad-envelope", "run must be bytes")
    if not run_scoped:
        if run_id:
            raise ProtocolError("wrong-run", "this kind belongs to no run, but names one")
        return
    if len(run_id) != RUN_ID_SIZE:
        raise ProtocolError("wrong-run", f"a run ID has {RUN_ID_SIZE} bytes, not {len(run_id)}")
    if expected is not None and run_id != expected:
        raise ProtocolError("wrong-run", "message belongs to another run")
