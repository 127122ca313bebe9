"""Wire formats: canonical msgpack, signed envelopes, message kinds, size caps, errors.

Pure: no sockets, no event loop. Everything that arrives from a peer passes
through `decode` here before any other code looks at it.
"""

from .canonical import pack, unpack
from .compression import compress, compress_bound, decompress
from .envelope import Envelope, decode, encode, sign
from .errors import ProtocolError
from .identity import Identity, peer_id_from_public_key, public_key_from_peer_id, verify
from .kinds import KINDS, MessageKind, lookup, register

__all__ = [
    "KINDS", "Envelope", "Identity", "MessageKind", "ProtocolError",
    "compress", "compress_bound", "decode", "decompress", "encode", "lookup", "pack", "peer_id_from_public_key",
    "public_key_from_peer_id", "register", "sign", "unpack", "verify",
]
