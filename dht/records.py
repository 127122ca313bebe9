"""What locomesh keeps in the DHT, and when a record is valid: pure functions, no I/O, no clock.

Keys (all under libp2p's namespace ``locomesh``, the first path segment)::

    /locomesh/run/<run id, 64 hex>     value: the signed `run.manifest` envelope itself
    /locomesh/peer/<peer id>           value: a signed `peer.record` envelope by that peer
    /locomesh/ckpt/<checkpoint id hex> provider key only (who serves that checkpoint)

A run record is bound to its key by hash: the key's ID must be SHA-256 of the
value bytes, so there is exactly one valid value per key and anyone can check
it. A peer record is bound to its key by signature: it must be signed by the
Ed25519 key inlined in the peer ID, must not have expired, and must not claim
to live longer than `MAX_PEER_RECORD_TTL`; among several, the highest `seq`
wins.

Every function here takes the time it needs as an argument (`now`, Unix
seconds), so the same code runs under the simulator's virtual clock. A value
the DHT hands back is worth nothing until it passed one of the `validate_*`
functions: py-libp2p runs validators only on the node that registered them
(a remote peer may run none), so callers re-validate on every get.
"""

from __future__ import annotations

from collections.abc import Sequence

from locomesh.protocol import Envelope, Identity, ProtocolError, decode, encode, public_key_from_peer_id
from locomesh.protocol import runs
from locomesh.protocol.kinds import HASH_SIZE, PEER_RECORD, RUN_ID_SIZE, RUN_MANIFEST

NAMESPACE = "locomesh"
RUN_PREFIX = f"/{NAMESPACE}/run/"
PEER_PREFIX = f"/{NAMESPACE}/peer/"
CHECKPOINT_PREFIX = f"/{NAMESPACE}/ckpt/"

# py-libp2p keeps a value over 1 MiB only locally, without an error; our caps are far below it.
MAX_DHT_VALUE = 1024 * 1024
assert RUN_MANIFEST.max_size < MAX_DHT_VALUE and PEER_RECORD.max_size < MAX_DHT_VALUE

MAX_PEER_RECORD_TTL = 48 * 3600  # a record that claims to live longer is refused
_PEER_ID_MAX_CHARS = 128


# --- keys ---------------------------------------------------------------------------------


def run_key(run_id: bytes) -> str:
    """The DHT key of a public run's manifest (also the key its participants provide)."""
    return RUN_PREFIX + _hex_id(run_id, RUN_ID_SIZE, "run ID")


def peer_key(peer_id: str) -> str:
    """The DHT key of `peer_id`'s signed peer record."""
    public_key_from_peer_id(peer_id)  # refuses anything that is not an Ed25519 peer ID
    return PEER_PREFIX + peer_id


def checkpoint_key(checkpoint_id: bytes) -> str:
    """The provider key of a checkpoint manifest (its ID is the manifest's hash)."""
    return CHECKPOINT_PREFIX + _hex_id(checkpoint_id, HASH_SIZE, "checkpoint ID")


def provider_key(key: str) -> bytes:
    """The bytes py-libp2p's provider records are kept under (at most 80 bytes on the wire)."""
    return key.encode("ascii")


def run_id_of_key(key: str) -> bytes:
    """The run ID in a ``/locomesh/run/<hex>`` key, or `ProtocolError`."""
    return _id_after(key, RUN_PREFIX, RUN_ID_SIZE)


def peer_id_of_key(key: str) -> str:
    """The peer ID in a ``/locomesh/peer/<peer id>`` key, or `ProtocolError`."""
    if not isinstance(key, str) or not key.startswith(PEER_PREFIX):
        raise ProtocolError("wrong-namespace", f"{_show(key)} is not a {PEER_PREFIX} key")
    peer_id = key[len(PEER_PREFIX) :]
    if not 0 < len(peer_id) <= _PEER_ID_MAX_CHARS:
        raise ProtocolError("bad-key", f"{_show(key)} does not end in a peer ID")
    public_key_from_peer_id(peer_id)
    return peer_id


def _hex_id(raw: bytes, size: int, what: str) -> str:
    if not isinstance(raw, bytes) or len(raw) != size:
        raise ValueError(f"a {what} is {size} bytes")
    return raw.hex()


def _id_after(key: str, prefix: str, size: int) -> bytes:
    if not isinstance(key, str) or not key.startswith(prefix):
        raise ProtocolError("wrong-namespace", f"{_show(key)} is not a {prefix} key")
    text = key[len(prefix) :]
    # Exactly lowercase hex: one ID has one key, so "AB.." and "ab.." cannot both hold it.
    if len(text) != 2 * size or text != text.lower():
        raise ProtocolError("bad-key", f"{_show(key)} does not end in {2 * size} lowercase hex digits")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ProtocolError("bad-key", f"{_show(key)} does not end in hex") from None


def _show(key: object) -> str:
    return repr(key)[:100]


# --- run records --------------------------------------------------------------------------


def validate_run_record(key: str, value: bytes) -> Envelope:
    """The manifest envelope if `value` may be stored under `key`, else `ProtocolError`.

    Checks, cheapest first: the key's shape, the value's size, that the key's
    ID is SHA-256 of the value, then the envelope (canonical msgpack, kind
    `run.manifest`, schema, creator's signature), and that the run is public.
    """
    expected = run_id_of_key(key)
    _check_size(value, RUN_MANIFEST.max_size)
    if runs.run_id(value) != expected:
        raise ProtocolError("wrong-hash", "the value's SHA-256 is not the run ID in its key")
    envelope = decode(value, kinds=frozenset({RUN_MANIFEST.name}))
    if not envelope.body["public"]:
        raise ProtocolError("not-public", "only public runs are published in the DHT")
    return envelope


def select_run_record(values: Sequence[bytes]) -> int:
    """The index of the value to keep among valid ones for one run key.

    Valid values of one key are the same bytes (the key is their hash), so any
    choice is right; taking the smallest bytes makes every node pick the same
    value even if handed invalid ones by mistake. On a tie the *last* index
    wins: py-libp2p stores a PUT only if `select([stored, new])` says 1, and
    storing an identical republished copy is what renews its age there.
    """
    _check_not_empty(values)
    return min(range(len(values)), key=lambda index: (bytes(values[index]), -index))


# --- peer records -------------------------------------------------------------------------


def sign_peer_record(
    identity: Identity, *, addrs: Sequence[str], relay_addrs: Sequence[str] = (), seq: int, expires: int
) -> bytes:
    """A signed `peer.record` for `identity`: where to reach it, until `expires` (Unix seconds)."""
    body = {"addrs": list(addrs), "relay_addrs": list(relay_addrs), "seq": seq, "expires": expires}
    return encode(identity, PEER_RECORD.name, body)


def validate_peer_record(key: str, value: bytes, *, now: float) -> Envelope:
    """The peer record envelope if `value` may be stored under `key` at time `now`, else `ProtocolError`."""
    peer_id = peer_id_of_key(key)
    _check_size(value, PEER_RECORD.max_size)
    envelope = decode(value, kinds=frozenset({PEER_RECORD.name}))
    if envelope.author_peer_id != peer_id:
        raise ProtocolError("wrong-author", f"record for {peer_id} is signed by {envelope.author_peer_id}")
    expires = envelope.body["expires"]
    if expires <= now:
        raise ProtocolError("expired", f"peer record expired at {expires}, now is {int(now)}")
    if expires > now + MAX_PEER_RECORD_TTL:
        raise ProtocolError("expires-too-late", f"peer record claims to live past {MAX_PEER_RECORD_TTL} s from now")
    return envelope


def select_peer_record(key: str, values: Sequence[bytes], *, now: float) -> int:
    """The index of the best record: valid first, then highest seq, then latest expiry, then smallest bytes.

    py-libp2p calls `select` with a stored value it validated earlier (it may
    have expired since), so invalid values are ranked last rather than trusted.
    On a full tie the last index wins (see `select_run_record`).
    """
    _check_not_empty(values)

    def rank(index: int) -> tuple:
        try:
            body = validate_peer_record(key, values[index], now=now).body
        except ProtocolError:
            return (1, 0, 0, b"", -index)
        return (0, -body["seq"], -body["expires"], bytes(values[index]), -index)

    return min(range(len(values)), key=rank)


def _check_size(value: bytes, cap: int) -> None:
    if not isinstance(value, (bytes, bytearray)):
        raise ProtocolError("bad-type", f"a DHT value is bytes, not {type(value).__name__}")
    if len(value) > cap:
        raise ProtocolError("too-large", f"a {len(value)}-byte value is over this key's cap of {cap}")


def _check_not_empty(values: Sequence[bytes]) -> None:
    if not values:
        raise ValueError("nothing to select from")
