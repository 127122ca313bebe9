"""What locomesh keeps in the DHT, and when a record is valid: pure functions, no I/O, no clock.

Keys (all under libp2p's namespace ``locomesh``, the first path segment)::

    /locomesh/run/<run id, 64 hex>     value: the signed `run.manifest` envelope itself
    /locomesh/peer/<peer id>           value: a signed `peer.record` envelope by that peer
    /locomesh/ckpt/<checkpoint id hex> provider key only (who serves that checkpoint)
    /locomesh/cards/<peer id>          value: a signed `run.cards` envelope by that peer
    /locomesh/directory/<epoch>/<shard> provider key only (who keeps cards of public runs)

A run record is bound to its key by hash: the key's ID must be SHA-256 of the
value bytes, so there is exactly one valid value per key and anyone can check
it. A peer record is bound to its key by signature: it must be signed by the
Ed25519 key inlined in the peer ID, must not have expired, and must not claim
to live longer than `MAX_PEER_RECORD_TTL`; among several, the highest `seq`
wins. A cards record (the directory of public runs) is bound the same way, with
the shorter `MAX_CARDS_TTL`: its keeper refreshes it, or it lapses.

The directory is found without knowing any run ID: a run's card keepers
provide the well-known key ``/locomesh/directory/<epoch>/<shard>``, where the
epoch is the hour (`DIRECTORY_EPOCH`) and the shard comes from the run ID;
a browser asks the providers of every shard of the current epoch. A holder
keeps at most 20 providers per key, first come, and ignores later ones
(py-libp2p), and keeps them 48 h: a fresh key each hour means a keeper that
left drops out of the list within the hour, and shards give the directory
room for more runs. Since the keys are predictable, whoever provides a key
first holds its slots: keepers therefore provide each epoch's key
`DIRECTORY_LEAD` ahead (`keeper_epochs`), so a keeper that has been up that
long is in a key's list before anyone who starts racing for it later, and a
browser reads every shard's providers (node/runs/directory.py), so a stranger
that fills some slots of a shard leaves the other slots, and the other shards,
to the keepers. What it does not stop: someone who provides every shard's key
with 20 identities before the keepers do (more than `DIRECTORY_LEAD` ahead,
or before a new run's keepers start) hides those keepers for that epoch; a
holder-side policy (keep the providers a browser can verify) would be needed.

Every function here takes the time it needs as an argument (`now`, Unix
seconds), so the same code runs under the simulator's virtual clock. A value
the DHT hands back is worth nothing until it passed one of the `validate_*`
functions: py-libp2p runs validators only on the node that registered them
(a remote peer may run none), so callers re-validate on every get.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from locomesh.protocol import Envelope, Identity, ProtocolError, decode, encode, public_key_from_peer_id
from locomesh.protocol import runs
from locomesh.protocol.kinds import HASH_SIZE, PEER_RECORD, RUN_CARDS, RUN_ID_SIZE, RUN_MANIFEST

NAMESPACE = "locomesh"
RUN_PREFIX = f"/{NAMESPACE}/run/"
PEER_PREFIX = f"/{NAMESPACE}/peer/"
CHECKPOINT_PREFIX = f"/{NAMESPACE}/ckpt/"
CARDS_PREFIX = f"/{NAMESPACE}/cards/"
DIRECTORY_PREFIX = f"/{NAMESPACE}/directory/"

# py-libp2p keeps a value over 1 MiB only locally, without an error; our caps are far below it.
MAX_DHT_VALUE = 1024 * 1024
assert max(RUN_MANIFEST.max_size, PEER_RECORD.max_size, RUN_CARDS.max_size) < MAX_DHT_VALUE

MAX_PEER_RECORD_TTL = 48 * 3600  # a record that claims to live longer is refused
MAX_CARDS_TTL = 3600  # cards say how many members a run has: they must be refreshed to stay
DIRECTORY_EPOCH = 3600  # seconds each directory key is used for
DIRECTORY_LEAD = 3 * 3600  # a keeper provides an epoch's key this long before it starts: before late racers
DIRECTORY_SHARDS = 8
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


def cards_key(peer_id: str) -> str:
    """The DHT key of `peer_id`'s signed cards record."""
    public_key_from_peer_id(peer_id)
    return CARDS_PREFIX + peer_id


def directory_shard(run_id: bytes) -> int:
    """The directory shard a run's keepers provide (from its ID: the same on every node)."""
    _hex_id(run_id, RUN_ID_SIZE, "run ID")
    return run_id[0] % DIRECTORY_SHARDS


def directory_epoch(now: float) -> int:
    return int(now // DIRECTORY_EPOCH)


def directory_key(epoch: int, shard: int) -> str:
    """The provider key of the keepers of shard `shard`'s runs during `epoch`."""
    if not 0 <= shard < DIRECTORY_SHARDS or epoch < 0:
        raise ValueError(f"a directory key has an epoch >= 0 and a shard below {DIRECTORY_SHARDS}")
    return f"{DIRECTORY_PREFIX}{epoch}/{shard}"


def directory_keys(now: float) -> list[str]:
    """Every key a browser asks at `now`: each shard of this epoch. A browser whose clock is ahead
    finds the keepers too (they provide later epochs' keys `DIRECTORY_LEAD` early), and one whose
    clock is behind finds them under the epoch before (holders keep providers 48 h)."""
    return [directory_key(directory_epoch(now), shard) for shard in range(DIRECTORY_SHARDS)]


def keeper_epochs(now: float) -> list[int]:
    """The epochs whose directory keys a keeper provides at `now`: this one, and every later one
    that starts within `DIRECTORY_LEAD`."""
    return list(range(directory_epoch(now), directory_epoch(now + DIRECTORY_LEAD) + 1))


def provider_key(key: str) -> bytes:
    """The bytes py-libp2p's provider records are kept under (at most 80 bytes on the wire)."""
    return key.encode("ascii")


def run_id_of_key(key: str) -> bytes:
    """The run ID in a ``/locomesh/run/<hex>`` key, or `ProtocolError`."""
    return _id_after(key, RUN_PREFIX, RUN_ID_SIZE)


def peer_id_of_key(key: str, prefix: str = PEER_PREFIX) -> str:
    """The peer ID in a ``/locomesh/peer/<peer id>`` key (or another `prefix`'s), or `ProtocolError`."""
    if not isinstance(key, str) or not key.startswith(prefix):
        raise ProtocolError("wrong-namespace", f"{_show(key)} is not a {prefix} key")
    peer_id = key[len(prefix) :]
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
    _check_lifetime("peer record", envelope.body["expires"], now, MAX_PEER_RECORD_TTL)
    return envelope


def select_peer_record(key: str, values: Sequence[bytes], *, now: float) -> int:
    """The index of the best record: valid first, then highest seq, then latest expiry, then smallest bytes.

    py-libp2p calls `select` with a stored value it validated earlier (it may
    have expired since), so invalid values are ranked last rather than trusted.
    On a full tie the last index wins (see `select_run_record`).
    """
    return _select_newest(values, lambda value: validate_peer_record(key, value, now=now))


def _select_newest(values: Sequence[bytes], validate: Callable[[bytes], Envelope]) -> int:
    """`select_peer_record`'s order for any record with `seq` and `expires`, valid by `validate`."""
    _check_not_empty(values)

    def rank(index: int) -> tuple:
        try:
            body = validate(values[index]).body
        except ProtocolError:
            return (1, 0, 0, b"", -index)
        return (0, -body["seq"], -body["expires"], bytes(values[index]), -index)

    return min(range(len(values)), key=rank)


# --- cards of public runs (the directory) ---------------------------------------------------


def sign_cards_record(identity: Identity, *, cards: Sequence[dict], seq: int, updated: int, expires: int) -> bytes:
    """A signed `run.cards` record for `identity`: the cards of the runs it keeps, as of `updated`."""
    body = {"cards": list(cards), "seq": seq, "updated": updated, "expires": expires}
    return encode(identity, RUN_CARDS.name, body)


def validate_cards_record(key: str, value: bytes, *, now: float) -> Envelope:
    """The cards envelope if `value` may be stored under `key` at `now`, else `ProtocolError`:
    signed by the key's peer, not expired, living at most `MAX_CARDS_TTL`, one card per run."""
    peer_id = peer_id_of_key(key, CARDS_PREFIX)
    _check_size(value, RUN_CARDS.max_size)
    envelope = decode(value, kinds=frozenset({RUN_CARDS.name}))
    if envelope.author_peer_id != peer_id:
        raise ProtocolError("wrong-author", f"cards for {peer_id} are signed by {envelope.author_peer_id}")
    body = envelope.body
    _check_lifetime("cards record", body["expires"], now, MAX_CARDS_TTL)
    if body["updated"] > now + MAX_CARDS_TTL:
        raise ProtocolError("from-the-future", "cards record says it was updated past its longest life from now")
    runs = [card["run"] for card in body["cards"]]
    if len(set(runs)) != len(runs):
        raise ProtocolError("duplicate-card", "a cards record has one card per run")
    return envelope


def select_cards_record(key: str, values: Sequence[bytes], *, now: float) -> int:
    """The index of the best cards record, in `select_peer_record`'s order."""
    return _select_newest(values, lambda value: validate_cards_record(key, value, now=now))


def _check_lifetime(what: str, expires: int, now: float, longest: int) -> None:
    if expires <= now:
        raise ProtocolError("expired", f"{what} expired at {expires}, now is {int(now)}")
    if expires > now + longest:
        raise ProtocolError("expires-too-late", f"{what} claims to live past {longest} s from now")


def _check_size(value: bytes, cap: int) -> None:
    if not isinstance(value, (bytes, bytearray)):
        raise ProtocolError("bad-type", f"a DHT value is bytes, not {type(value).__name__}")
    if len(value) > cap:
        raise ProtocolError("too-large", f"a {len(value)}-byte value is over this key's cap of {cap}")


def _check_not_empty(values: Sequence[bytes]) -> None:
    if not values:
        raise ValueError("nothing to select from")
