"""Identity keys: creation, files with mode 0600, and peer IDs exactly as libp2p derives them."""

from __future__ import annotations

import os
import stat

import pytest

from locomesh.protocol import (
    Identity, IdentityError, ProtocolError, peer_id_from_public_key, public_key_from_peer_id, verify,
)


def test_peer_id_matches_libp2p(identity_factory):
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    for index in range(5):
        ours = identity_factory(index)
        theirs = create_new_key_pair(ours.seed)
        assert ours.peer_id == ID.from_pubkey(theirs.public_key).to_base58()
        assert ours.public_key == theirs.public_key.to_bytes()


def test_peer_id_round_trips_to_the_public_key(identity_factory):
    alice = identity_factory(7)
    assert alice.peer_id.startswith("12D3KooW")
    assert public_key_from_peer_id(alice.peer_id) == alice.public_key


@pytest.mark.parametrize("text", ["", "0OIl", "12D3KooW", "Qm" + "1" * 44, "x" * 500, "1" * 10])
def test_bad_peer_ids_are_rejected(text):
    with pytest.raises(ProtocolError):
        public_key_from_peer_id(text)


def test_short_public_key_has_no_peer_id():
    with pytest.raises(ProtocolError):
        peer_id_from_public_key(b"\x01" * 31)


def test_save_and_load_keep_the_key_private(tmp_path):
    path = tmp_path / "sub" / "identity.key"
    alice = Identity.generate()
    alice.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Identity.load(path).peer_id == alice.peer_id
    assert [p.name for p in path.parent.iterdir()] == ["identity.key"]  # no temporary left behind


def test_load_or_create_creates_once_then_reuses(tmp_path):
    path = tmp_path / "identity.key"
    first = Identity.load_or_create(path)
    assert Identity.load_or_create(path).peer_id == first.peer_id


def test_loose_permissions_are_tightened(tmp_path):
    path = tmp_path / "identity.key"
    Identity.generate().save(path)
    os.chmod(path, 0o644)
    Identity.load(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("content", [b"", b"garbage", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_unreadable_key_files_give_identity_error(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_bytes(content)
    with pytest.raises(IdentityError):
        Identity.load(path)


def test_key_of_another_type_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "identity.key"
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        Identity.load(path)


def test_missing_key_file_gives_identity_error(tmp_path):
    with pytest.raises(IdentityError, match="cannot read"):
        Identity.load(tmp_path / "absent.key")


def test_signatures_verify_and_forgeries_do_not(identity_factory):
    alice, bob = identity_factory(1), identity_factory(2)
    signature = alice.sign(b"message")
    verify(alice.public_key, signature, b"message")
    for key, sig, data in [(bob.public_key, signature, b"message"), (alice.public_key, signature, b"other"),
                           (alice.public_key, bytes(64), b"message"), (alice.public_key, b"x", b"message")]:
        with pytest.raises(ProtocolError, match="bad-signature"):
            verify(key, sig, data)
