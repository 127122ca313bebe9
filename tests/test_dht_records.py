"""DHT record rules (pure): every way a run record or a peer record can be refused, and `select`."""

from __future__ import annotations

import hashlib

import msgpack
import pytest
from libp2p.records.validator import NamespacedValidator

from locomesh.dht import records
from locomesh.dht.validator import LocomeshValidator, select, validate
from locomesh.protocol import ProtocolError, canonical
from locomesh.protocol.envelope import signing_bytes
from locomesh.protocol.runs import run_id, sign_manifest

NOW = 1_800_000_000


def public_manifest(identity, **overrides) -> bytes:
    options = {"task": "toy", "created": NOW, "public": True, **overrides}
    return sign_manifest(identity, **options)


def key_of(manifest: bytes) -> str:
    return records.run_key(run_id(manifest))


def peer_record(identity, *, seq: int = 1, expires: int = NOW + 600, addrs=("/ip4/127.0.0.1/tcp/4001",)) -> bytes:
    return records.sign_peer_record(identity, addrs=list(addrs), seq=seq, expires=expires)


def assert_refused(code: str, key: str, value: bytes, now: float = NOW) -> None:
    with pytest.raises(ProtocolError) as caught:
        validate(key, value, now=now)
    assert caught.value.code == code, caught.value


# --- run records ---------------------------------------------------------------------------


def test_a_public_manifest_is_valid_under_its_hash(identity_factory):
    manifest = public_manifest(identity_factory(1))
    envelope = validate(key_of(manifest), manifest, now=NOW)
    assert envelope.body["task"] == "toy"
    assert records.run_id_of_key(key_of(manifest)) == hashlib.sha256(manifest).digest()


def test_a_manifest_under_another_runs_key_is_refused(identity_factory):
    manifest = public_manifest(identity_factory(1))
    other = public_manifest(identity_factory(1), task="other")
    assert_refused("wrong-hash", key_of(other), manifest)


def test_a_manifest_with_a_bad_signature_is_refused(identity_factory):
    raw = canonical.unpack(public_manifest(identity_factory(1)), max_size=1 << 20)
    raw["sig"] = bytes([raw["sig"][0] ^ 1]) + raw["sig"][1:]
    forged = canonical.pack(raw)
    assert_refused("bad-signature", key_of(forged), forged)


def test_a_manifest_signed_by_someone_else_is_refused(identity_factory):
    raw = canonical.unpack(public_manifest(identity_factory(1)), max_size=1 << 20)
    raw["sig"] = identity_factory(2).sign(signing_bytes(raw["v"], raw["kind"], raw["run"], raw["author"], raw["body"]))
    forged = canonical.pack(raw)
    assert_refused("bad-signature", key_of(forged), forged)


def test_a_non_canonical_manifest_is_refused_even_under_its_own_hash(identity_factory):
    raw = canonical.unpack(public_manifest(identity_factory(1)), max_size=1 << 20)
    # Same content, keys in reverse order: other bytes, so another hash, and not canonical.
    reordered = msgpack.packb(dict(reversed(list(raw.items()))), use_bin_type=True)
    assert_refused("non-canonical", key_of(reordered), reordered)


def test_a_private_run_is_not_published(identity_factory):
    manifest = public_manifest(identity_factory(1), public=False)
    assert_refused("not-public", key_of(manifest), manifest)


def test_another_kind_under_a_run_key_is_refused(identity_factory):
    record = peer_record(identity_factory(1))
    assert_refused("unexpected-kind", key_of(record), record)


def test_an_oversized_value_is_refused_before_it_is_parsed():
    huge = b"\x00" * (records.RUN_MANIFEST.max_size + 1)
    assert_refused("too-large", key_of(huge), huge)


@pytest.mark.parametrize(
    "key, code",
    [
        ("/locomesh/run/" + "AB" * 32, "bad-key"),  # upper case: one ID must have one key
        ("/locomesh/run/" + "ab" * 31, "bad-key"),
        ("/locomesh/run/" + "zz" * 32, "bad-key"),
        ("/locomesh/other/" + "ab" * 32, "wrong-namespace"),
        ("/locomeshx/run/" + "ab" * 32, "wrong-namespace"),
        ("plain-key", "wrong-namespace"),
    ],
)
def test_malformed_keys_are_refused(identity_factory, key, code):
    assert_refused(code, key, public_manifest(identity_factory(1)))


def test_run_select_is_deterministic_and_renews_identical_copies(identity_factory):
    manifest = public_manifest(identity_factory(1))
    assert select(key_of(manifest), [manifest], now=NOW) == 0
    # identical copies: the newest (last) wins, so a republished copy replaces the stored one
    assert select(key_of(manifest), [manifest, manifest], now=NOW) == 1
    values = [b"\x03junk", manifest, b"\x02junk"]
    assert records.select_run_record(values) == records.select_run_record(list(values)) == 2


# --- peer records --------------------------------------------------------------------------


def test_a_fresh_peer_record_signed_by_its_peer_is_valid(identity_factory):
    identity = identity_factory(1)
    envelope = validate(records.peer_key(identity.peer_id), peer_record(identity), now=NOW)
    assert envelope.body["addrs"] == ["/ip4/127.0.0.1/tcp/4001"]


def test_a_peer_record_signed_by_another_peer_is_refused(identity_factory):
    assert_refused("wrong-author", records.peer_key(identity_factory(1).peer_id), peer_record(identity_factory(2)))


def test_an_expired_peer_record_is_refused(identity_factory):
    identity = identity_factory(1)
    assert_refused("expired", records.peer_key(identity.peer_id), peer_record(identity, expires=NOW))


def test_a_peer_record_that_claims_to_live_too_long_is_refused(identity_factory):
    identity = identity_factory(1)
    record = peer_record(identity, expires=NOW + records.MAX_PEER_RECORD_TTL + 1)
    assert_refused("expires-too-late", records.peer_key(identity.peer_id), record)


def test_a_tampered_peer_record_is_refused(identity_factory):
    identity = identity_factory(1)
    raw = canonical.unpack(peer_record(identity), max_size=1 << 20)
    raw["body"]["addrs"] = ["/ip4/6.6.6.6/tcp/1"]
    assert_refused("bad-signature", records.peer_key(identity.peer_id), canonical.pack(raw))


def test_a_peer_key_without_an_ed25519_peer_id_is_refused(identity_factory):
    assert_refused("bad-peer-id", "/locomesh/peer/QmNotAnEd25519Key", peer_record(identity_factory(1)))
    with pytest.raises(ProtocolError):
        records.peer_key("not a peer id!")


def test_peer_select_takes_the_highest_valid_seq(identity_factory):
    identity = identity_factory(1)
    key = records.peer_key(identity.peer_id)
    old, new, expired = peer_record(identity, seq=1), peer_record(identity, seq=2), peer_record(identity, seq=9, expires=NOW - 1)
    assert select(key, [old, new], now=NOW) == 1
    assert select(key, [new, old], now=NOW) == 0
    assert select(key, [expired, old], now=NOW) == 1  # an expired record never wins, whatever its seq
    forged = peer_record(identity_factory(2), seq=99)
    assert select(key, [forged, old], now=NOW) == 1


# --- the libp2p adapter --------------------------------------------------------------------


def test_the_adapter_refuses_keys_outside_our_namespace_when_strict(identity_factory):
    validator = NamespacedValidator({records.NAMESPACE: LocomeshValidator(lambda: NOW)}, strict_validation=True)
    manifest = public_manifest(identity_factory(1))
    validator.validate(key_of(manifest), manifest)
    with pytest.raises(Exception):
        validator.validate("no-namespace", manifest)
    with pytest.raises(Exception):
        validator.validate("/other/" + "ab" * 32, manifest)


def test_the_adapter_reads_its_clock_at_each_call(identity_factory):
    identity = identity_factory(1)
    now = [NOW]
    validator = LocomeshValidator(lambda: now[0])
    record = peer_record(identity, expires=NOW + 10)
    validator.validate(records.peer_key(identity.peer_id), record)
    now[0] = NOW + 10
    with pytest.raises(ProtocolError, match="expired"):
        validator.validate(records.peer_key(identity.peer_id), record)


def test_provider_keys_fit_the_80_byte_limit_of_add_provider():
    assert len(records.provider_key(records.run_key(b"\xff" * 32))) <= 80
    assert len(records.provider_key(records.checkpoint_key(b"\xff" * 32))) <= 80
