"""Identity keys: signatures, and peer IDs exactly as libp2p derives them (key files: test_node_datadir.py)."""

from __future__ import annotations

import pytest

from locomesh.protocol import ProtocolError, peer_id_from_public_key, public_key_from_peer_id, verify


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


def test_signatures_verify_and_forgeries_do_not(identity_factory):
    alice, bob = identity_factory(1), identity_factory(2)
    signature = alice.sign(b"message")
    verify(alice.public_key, signature, b"message")
    for key, sig, data in [(bob.public_key, signature, b"message"), (alice.public_key, signature, b"other"),
                           (alice.public_key, bytes(64), b"message"), (alice.public_key, b"x", b"message")]:
        with pytest.raises(ProtocolError, match="bad-signature"):
            verify(key, sig, data)
