"""The data dir's identity key file: created once with mode 0600, reused, and refused with a clear
`IdentityError` when it is unreadable or holds another kind of key."""

from __future__ import annotations

import os
import stat

import pytest

from locomesh.node.datadir import IdentityError, load_identity, load_or_create_identity, save_identity
from locomesh.protocol import Identity


def test_save_and_load_keep_the_key_private(tmp_path):
    path = tmp_path / "sub" / "identity.key"
    alice = Identity.generate()
    save_identity(alice, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_identity(path).peer_id == alice.peer_id
    assert [p.name for p in path.parent.iterdir()] == ["identity.key"]  # no temporary left behind


def test_load_or_create_creates_once_then_reuses(tmp_path):
    path = tmp_path / "identity.key"
    first = load_or_create_identity(path)
    assert load_or_create_identity(path).peer_id == first.peer_id


def test_loose_permissions_are_tightened(tmp_path):
    path = tmp_path / "identity.key"
    save_identity(Identity.generate(), path)
    os.chmod(path, 0o644)
    load_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("content", [b"", b"garbage", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_unreadable_key_files_give_identity_error(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_bytes(content)
    with pytest.raises(IdentityError):
        load_identity(path)


def test_key_of_another_type_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "identity.key"
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        load_identity(path)


def test_missing_key_file_gives_identity_error(tmp_path):
    with pytest.raises(IdentityError, match="cannot read"):
        load_identity(tmp_path / "absent.key")
