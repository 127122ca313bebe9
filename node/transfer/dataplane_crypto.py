"""The data plane's sealed frames and session keys (sans-IO: bytes in, bytes out).

Bulk checkpoint data can travel on a plain TCP connection beside libp2p (see
`dataplane`), because py-libp2p's Yamux tops out far below what loopback and
AES-GCM can do. Nothing on that connection is plaintext:

* **Keys.** Each side makes an ephemeral X25519 key; the public halves are
  exchanged inside a libp2p stream (Noise-secured and signed, so each is bound
  to its sender's libp2p identity). HKDF-SHA256 turns the shared secret into
  one AES-256-GCM key per direction, salted with the SHA-256 of the transcript
  (both peer IDs and both public keys), so the keys belong to this pair of
  identities and this exchange only.
* **Frames.** ``length (u32, big-endian) | AES-GCM(ciphertext || 16-byte tag)``,
  the length bytes authenticated as associated data. The nonce is a 96-bit
  counter, one per direction, never sent: a replayed, dropped, reordered or
  altered frame fails to open. A frame announcing more than the cap is refused
  before a byte of it is buffered.

Errors are `DataPlaneError` (a `ProtocolError`): ``bad-frame`` (it does not
open: tampered, replayed, reordered or under another key), ``too-large``,
``exhausted`` (2**64 frames on one key; never in practice).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from locomesh.protocol import ProtocolError

KEY_SIZE = 32
TAG_SIZE = 16
HEADER_SIZE = 4
NONCE_SIZE = 12
MAX_COUNTER = 2**64
_INFO = b"locomesh/dataplane/v1"


class DataPlaneError(ProtocolError):
    """A data plane frame or handshake that must be refused; see the module docstring for codes."""


@dataclass(frozen=True)
class SessionKeys:
    send: bytes
    receive: bytes


def transcript(initiator_peer: str, responder_peer: str, initiator_key: bytes, responder_key: bytes) -> bytes:
    """What both sides agree they exchanged: the salt of the key derivation."""
    parts = [initiator_peer.encode(), responder_peer.encode(), initiator_key, responder_key]
    return hashlib.sha256(b"".join(len(part).to_bytes(2, "big") + part for part in parts)).digest()


def derive_keys(private: X25519PrivateKey, peer_public: bytes, *, salt: bytes, initiator: bool) -> SessionKeys:
    """Per-direction AES-256-GCM keys from an X25519 exchange; the initiator's send key is the responder's receive key."""
    if len(peer_public) != KEY_SIZE:
        raise DataPlaneError("bad-key", f"an X25519 public key has {KEY_SIZE} bytes, not {len(peer_public)}")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:  # OpenSSL refuses low-order points (an all-zero shared secret)
        raise DataPlaneError("bad-key", "the peer's X25519 key is a low-order point") from None
    material = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=salt, info=_INFO).derive(shared)
    forward, backward = material[:KEY_SIZE], material[KEY_SIZE:]
    return SessionKeys(forward, backward) if initiator else SessionKeys(backward, forward)


def _nonce(counter: int) -> bytes:
    if counter >= MAX_COUNTER:
        raise DataPlaneError("exhausted", "2**64 frames sent under one key")
    return counter.to_bytes(NONCE_SIZE, "big")


class FrameSealer:
    """Seals outgoing frames under one key, numbering them."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    def seal(self, plaintext: bytes) -> bytes:
        """One frame: header and sealed bytes."""
        return b"".join(self.seal_parts(plaintext))

    def seal_parts(self, plaintext: bytes) -> tuple[bytes, bytes]:
        """The frame as (header, sealed bytes), to be sent one after the other (saves copying a large frame)."""
        header = (len(plaintext) + TAG_SIZE).to_bytes(HEADER_SIZE, "big")
        sealed = self._aead.encrypt(_nonce(self._counter), plaintext, header)
        self._counter += 1
        return header, sealed


class FrameOpener:
    """Opens incoming frames under one key, in order: feed it bytes, take whole frames out.

    `max_frame` caps a frame's plaintext; it may be changed between frames,
    e.g. raised once the first frame has shown the peer holds the key.
    """

    def __init__(self, key: bytes, *, max_frame: int) -> None:
        self._aead = AESGCM(key)
        self._counter = 0
        # Received pieces, joined once per frame: growing one buffer piece by piece copies far more.
        self._pieces: list[bytes] = []
        self._size = 0
        self.max_frame = max_frame

    def feed(self, data: bytes) -> None:
        if data:
            self._pieces.append(bytes(data))
            self._size += len(data)

    def pending_size(self) -> int:
        """Bytes still needed to complete the frame begun in the buffer (at least 1 when none is begun)."""
        if self._size < HEADER_SIZE:
            return HEADER_SIZE - self._size
        return max(1, HEADER_SIZE + self._announced() - self._size)

    def _joined(self) -> bytes:
        if len(self._pieces) > 1:
            self._pieces = [b"".join(self._pieces)]
        return self._pieces[0]

    def _header(self) -> bytes:
        if len(self._pieces[0]) < HEADER_SIZE:  # join only then: joining on every call would be quadratic
            self._joined()
        return self._pieces[0][:HEADER_SIZE]

    def _announced(self) -> int:
        length = int.from_bytes(self._header(), "big")
        if length < TAG_SIZE:
            raise DataPlaneError("bad-frame", f"a sealed frame of {length} bytes cannot hold its tag")
        if length - TAG_SIZE > self.max_frame:
            raise DataPlaneError("too-large", f"a frame of {length - TAG_SIZE} bytes is over the cap of {self.max_frame}")
        return length

    def next_frame(self) -> bytes | None:
        """The next frame's plaintext, or None until it has fully arrived; `DataPlaneError` if it does not open."""
        if self._size < HEADER_SIZE:
            return None
        end = HEADER_SIZE + self._announced()
        if self._size < end:
            return None
        data = self._joined()
        with memoryview(data) as view:
            try:
                plaintext = self._aead.decrypt(_nonce(self._counter), view[HEADER_SIZE:end], data[:HEADER_SIZE])
            except InvalidTag:
                reason = f"frame {self._counter} does not open (tampered, replayed or reordered)"
                raise DataPlaneError("bad-frame", reason) from None
        rest = data[end:]
        self._pieces, self._size = ([rest] if rest else []), len(rest)
        self._counter += 1
        return plaintext
