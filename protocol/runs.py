"""Run IDs: the SHA-256 of a run's signed genesis manifest, and the short form people read.

The full ID is 32 bytes; people see it as lowercase base32 without padding (52 characters),
and `short_run_id` keeps the first 16 of those (80 bits) for logs and tables. Only the full
form identifies a run: a short form is a label, never a lookup key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable

from typing import Any

from .envelope import Envelope, decode, encode
from .errors import ProtocolError
from .identity import Identity
from .kinds import RUN_ID_SIZE, RUN_MANIFEST

_BASE32 = frozenset("abcdefghijklmnopqrstuvwxyz234567")
MIN_PREFIX_CHARS = 8  # 40 bits: enough to tell apart the runs any one node knows
SHORT_ID_CHARS = 16


def run_id(manifest_bytes: bytes) -> bytes:
    """The run ID of a signed `run.manifest` envelope: SHA-256 of exactly those bytes."""
    return hashlib.sha256(manifest_bytes).digest()


def sign_manifest(
    creator: Identity,
    *,
    task: str,
    created: int,
    name: str = "",
    task_config: dict[str, Any] | None = None,
    seed: int = 0,
    hparams: dict[str, Any] | None = None,
    admission: str = "open",
    admitted: list[bytes] | None = None,
    earn_rounds: int = 3,
    absent_rounds: int = 3,
    hparam_writers: list[bytes] | None = None,
    public: bool = False,
) -> bytes:
    """A signed genesis manifest. `admission` says who may join (anyone; keys the creator
    admitted; keys more than two thirds of the electorate admitted); the `admitted` keys have a
    say from their join on, in any run. In an open run a fresh key earns a say after `earn_rounds`
    counted rounds; a member absent `absent_rounds` certified rounds leaves the electorate
    (crdt/membership.py). Hyperparameter writers default to the creator alone. `created` is a
    Unix time in seconds, passed in (this package reads no clock)."""
    body = {
        "name": name,
        "task": task,
        "task_config": dict(task_config or {}),
        "seed": seed,
        "hparams": dict(hparams or {}),
        "admission": admission,
        "admitted": sorted(set(admitted or [])),
        "earn_rounds": earn_rounds,
        "absent_rounds": absent_rounds,
        "hparam_writers": sorted(hparam_writers if hparam_writers is not None else [creator.public_key]),
        "public": public,
        "created": created,
    }
    return encode(creator, RUN_MANIFEST.name, body)


def load_manifest(manifest_bytes: bytes) -> tuple[bytes, Envelope]:
    """Verify a signed manifest and return (run ID, envelope), or raise `ProtocolError`."""
    envelope = decode(manifest_bytes, kinds=frozenset({RUN_MANIFEST.name}))
    return run_id(manifest_bytes), envelope


def format_run_id(run: bytes) -> str:
    """The full ID as 52 lowercase base32 characters."""
    if len(run) != RUN_ID_SIZE:
        raise ValueError(f"a run ID has {RUN_ID_SIZE} bytes, not {len(run)}")
    return base64.b32encode(run).decode("ascii").rstrip("=").lower()


def short_run_id(run: bytes) -> str:
    """The first 16 characters of the full form: enough to tell runs apart by eye."""
    return format_run_id(run)[:SHORT_ID_CHARS]


def parse_run_id(text: str, known: Iterable[bytes] = ()) -> bytes:
    """A run ID from its full base32 form (any case), 64 hex digits, or a prefix of the base32 form
    (at least `MIN_PREFIX_CHARS`) that exactly one of the `known` IDs starts with; else `ProtocolError`.

    A full base32 form must be the canonical one: 52 characters carry 260 bits, the last 4 of
    them unused, so a mistyped last character could decode to the same ID as the right one.
    """
    text = text.strip()
    if len(text) == 2 * RUN_ID_SIZE:
        return _from_hex(text)
    if len(text) == 52:
        return _from_base32(text)
    prefix = run_id_prefix(text)
    if prefix is not None:
        return _from_prefix(prefix, known)
    raise ProtocolError("bad-run-id", f"{text[:60]!r} is not a run ID (52 base32 characters, 64 hex digits, or a "
                                      f"prefix of at least {MIN_PREFIX_CHARS} characters of a run this node knows)")


def run_id_prefix(text: str) -> str | None:
    """`text` as the prefix of a run ID's base32 form (lowercase) if it reads as one (at least
    `MIN_PREFIX_CHARS` base32 characters, fewer than a full ID), else None: what `parse_run_id`
    resolves against the runs it is given, and a caller may look further for."""
    text = text.strip().lower()
    return text if MIN_PREFIX_CHARS <= len(text) < 52 and set(text) <= _BASE32 else None


def _from_hex(text: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != RUN_ID_SIZE:  # fromhex skips inner whitespace: 64 characters can be fewer bytes
        raise ProtocolError("bad-run-id", f"{text[:60]!r} is not a run ID (64 hex digits)")
    return raw


def _from_base32(text: str) -> bytes:
    try:
        raw = base64.b32decode(text.upper() + "====")
    except (ValueError, binascii.Error):
        raise ProtocolError("bad-run-id", f"{text!r} is not a run ID (not base32)") from None
    if format_run_id(raw) != text.lower():
        raise ProtocolError("bad-run-id", f"{text!r} is not a run ID: no run ID ends in {text[-1]!r} "
                                          f"(a typo? `locomesh run list` shows the IDs this node knows)")
    return raw


def _from_prefix(prefix: str, known: Iterable[bytes]) -> bytes:
    matches = [run for run in known if format_run_id(run).startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ProtocolError("bad-run-id", f"no run this node knows starts with {prefix!r}: give the full ID "
                                          f"(52 characters; `locomesh run list` shows it, or ask the run's creator)")
    raise ProtocolError("bad-run-id", f"{prefix!r} starts {len(matches)} known runs: give more characters")
