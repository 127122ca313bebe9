"""A node's identity: one Ed25519 key, and the peer ID libp2p derives from it.

The peer ID is computed here exactly as libp2p does (base58btc of an identity
multihash over the protobuf-framed public key), so `protocol` needs no libp2p
import. The node keeps its key in a file of its data dir (`locomesh.node.datadir`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import ProtocolError

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64

# libp2p's protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}, then identity multihash (0x00, len).
_PROTOBUF_ED25519_PREFIX = b"\x08\x01\x12\x20"
_IDENTITY_MULTIHASH_PREFIX = b"\x00\x24"
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


@dataclass(frozen=True)
class Identity:
    """An Ed25519 signing key with its public key and peer ID."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """A deterministic identity from 32 seed bytes (tests and simulations)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        """The 32 private bytes; libp2p's `create_new_key_pair(seed)` gives the same key."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)


def verify(public_key: bytes, signature: bytes, data: bytes) -> None:
    """Check an Ed25519 signature; raise `ProtocolError` when it does not hold."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        raise ProtocolError("bad-signature", "key or signature has the wrong length")
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        raise ProtocolError("bad-signature", "signature does not match the author's key") from None


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer ID (``12D3KooW...``) of an Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ProtocolError("bad-key", f"an Ed25519 public key has {PUBLIC_KEY_SIZE} bytes")
    return _b58encode(_IDENTITY_MULTIHASH_PREFIX + _PROTOBUF_ED25519_PREFIX + public_key)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The Ed25519 public key inlined in a peer ID, or `ProtocolError`."""
    raw = _b58decode(peer_id)
    prefix = _IDENTITY_MULTIHASH_PREFIX + _PROTOBUF_ED25519_PREFIX
    if len(raw) != len(prefix) + PUBLIC_KEY_SIZE or not raw.startswith(prefix):
        raise ProtocolError("bad-peer-id", f"{peer_id[:60]!r} is not an Ed25519 peer ID")
    return raw[len(prefix) :]


def _b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    digits = []
    while number:
        number, rest = divmod(number, 58)
        digits.append(_B58_ALPHABET[rest])
    leading_zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * leading_zeros + "".join(reversed(digits))


def _b58decode(text: str) -> bytes:
    if not isinstance(text, str) or not 0 < len(text) <= 128:
        raise ProtocolError("bad-peer-id", "peer ID must be a short base58 string")
    number = 0
    for char in text:
        index = _B58_ALPHABET.find(char)
        if index < 0:
            raise ProtocolError("bad-peer-id", f"{char!r} is not a base58 character")
        number = number * 58 + index
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    leading_ones = len(text) - len(text.lstrip("1"))
    return b"\x00" * leading_ones + body
