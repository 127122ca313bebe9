"""The checkpoint manifest: what a checkpoint is made of, and the hash that names it.

A checkpoint's serialized state (see `state_format`) is cut into chunks of
`chunk_size` raw bytes, the last one shorter; each chunk is zstd-compressed on
its own and named by the SHA-256 of its *compressed* bytes, so a downloader can
check a chunk from an untrusted provider before it inflates anything. The
manifest lists the chunks in order and is itself canonical msgpack:

    {version, raw_size, chunk_size, chunks: [{hash, size, raw_size}, ...],
     round, run, metadata, state_hash, merkle_root}

- `state_hash` is the SHA-256 of the raw serialized state: it names the state
  itself, whatever compressor made the chunks.
- `merkle_root` is an RFC 6962 Merkle tree root over the chunk hashes, so one
  chunk can be proven to belong to a checkpoint with a short path (`merkle_proof`).
- The checkpoint ID is the SHA-256 of the manifest's bytes. Canonical msgpack
  gives each manifest one byte form, so the ID is deterministic.

`read_manifest` trusts nothing: every bound is checked, every derived value
(chunk count, chunk sizes, Merkle root) is recomputed and compared, and any
failure is a `CheckpointError`, a `ProtocolError` with a code that says which
rule broke.

`ManifestLimits` is what a caller allows a checkpoint it asked for to be: a manifest that is
valid but bigger than that, or that holds other metadata, is refused with a `LimitError` that
names the limit, before anything is fetched or allocated for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from locomesh.protocol import ProtocolError, compress_bound, pack, unpack
from locomesh.protocol.schema import Bytes, Int, List, Map, Scalar, Spec, Struct

FORMAT_VERSION = 1
HASH_SIZE = 32
RUN_ID_SIZE = 32
KiB, MiB = 1024, 1024 * 1024
DEFAULT_CHUNK_SIZE = 4 * MiB
MIN_CHUNK_SIZE = 1 * KiB  # small chunks are for tests; a real run uses the default
MAX_CHUNK_SIZE = 64 * MiB
MAX_CHUNKS = 65536
MAX_MANIFEST_SIZE = 8 * MiB  # MAX_CHUNKS entries of about 70 bytes each, with room to spare
MAX_METADATA_ENTRIES = 64
RESERVED_METADATA = frozenset({"round", "run"})  # manifest fields of their own

_LEAF_PREFIX, _NODE_PREFIX = b"\x00", b"\x01"  # RFC 6962 domain separation


class CheckpointError(ProtocolError):
    """A checkpoint (manifest, chunk or state) that breaks the format or its own hashes.

    Codes: ``bad-manifest``, ``wrong-id``, ``bad-chunk``, ``missing-chunk``,
    ``missing-manifest``, ``bad-header``, ``bad-state``, ``bad-metadata``, ``over-limit``
    (a `LimitError`).
    """


class LimitError(CheckpointError):
    """A checkpoint that is valid but not what the caller allows (`ManifestLimits`); `limit` names
    the limit it breaks (``max_raw_size``, ``max_chunks``, ``max_chunk_size``, ``metadata``,
    ``tensors``)."""

    def __init__(self, limit: str, reason: str) -> None:
        super().__init__("over-limit", f"{limit}: {reason}")
        self.limit = limit


@dataclass(frozen=True)
class MetaValue(Spec):
    """A metadata value: a scalar (None, bool, int, finite float, short string) or short bytes."""

    max_len: int = 1024

    def check(self, value: Any, path: str = "") -> None:
        if isinstance(value, bytes):
            Bytes(0, self.max_len).check(value, path)
        else:
            Scalar(self.max_len).check(value, path)


METADATA_SCHEMA = Map(MetaValue(), max_len=MAX_METADATA_ENTRIES)

_SCHEMA = Struct(
    {
        "version": Int(FORMAT_VERSION, FORMAT_VERSION),
        "raw_size": Int(1, MAX_CHUNKS * MAX_CHUNK_SIZE),
        "chunk_size": Int(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE),
        "chunks": List(
            Struct(
                {
                    "hash": Bytes(HASH_SIZE, HASH_SIZE),
                    "size": Int(1, 2 * MAX_CHUNK_SIZE),
                    "raw_size": Int(1, MAX_CHUNK_SIZE),
                }
            ),
            max_len=MAX_CHUNKS,
            min_len=1,
        ),
        "round": Int(0, 2**63 - 1),
        "run": Bytes(0, RUN_ID_SIZE),
        "metadata": METADATA_SCHEMA,
        "state_hash": Bytes(HASH_SIZE, HASH_SIZE),
        "merkle_root": Bytes(HASH_SIZE, HASH_SIZE),
    }
)


@dataclass(frozen=True)
class ChunkRef:
    """One chunk as the manifest lists it: hash and size of the compressed bytes, size once inflated."""

    hash: bytes
    size: int
    raw_size: int


@dataclass(frozen=True)
class Manifest:
    """A validated checkpoint manifest; only `Manifest.build` and `read_manifest` make one."""

    raw_size: int
    chunk_size: int
    chunks: tuple[ChunkRef, ...]
    round: int
    run: bytes
    metadata: dict[str, Any]
    state_hash: bytes
    merkle_root: bytes
    version: int
    encoded: bytes = field(compare=False, repr=False)  # the bytes it was read from: canonical, so unique

    @classmethod
    def build(
        cls, *, raw_size: int, chunk_size: int, chunks: list[ChunkRef], round: int, run: bytes,
        metadata: dict[str, Any], state_hash: bytes,
    ) -> Manifest:
        """Assemble a manifest (computing its Merkle root) and validate it as a reader would."""
        fields = {
            "version": FORMAT_VERSION,
            "raw_size": raw_size,
            "chunk_size": chunk_size,
            "chunks": [{"hash": c.hash, "size": c.size, "raw_size": c.raw_size} for c in chunks],
            "round": round,
            "run": run,
            "metadata": metadata,
            "state_hash": state_hash,
            "merkle_root": merkle_root([c.hash for c in chunks]),
        }
        try:
            data = pack(fields)
        except ProtocolError as exc:
            raise CheckpointError("bad-metadata", exc.reason) from None
        return read_manifest(data)

    def encode(self) -> bytes:
        """The manifest's canonical bytes (the ones its ID is the hash of)."""
        return self.encoded

    @property
    def id(self) -> bytes:
        """The checkpoint ID: SHA-256 of the manifest's bytes."""
        return hashlib.sha256(self.encoded).digest()

    @property
    def full_metadata(self) -> dict[str, Any]:
        """`metadata` with `round` and `run` put back: what the writer was given."""
        return {**self.metadata, "round": self.round, "run": self.run}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor a checkpoint must hold (or, not `required`, may hold): its dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]
    required: bool = True


@dataclass(frozen=True)
class ManifestLimits:
    """What a caller allows a checkpoint it asked for to be (a payload or a state of its run).

    `check` looks at the manifest alone, so a download refuses a checkpoint before it fetches a
    chunk of it; `tensors`, the exact layout, is checked against the state's header by the
    node's store (`load_checkpoint`) before it allocates the state. `max_chunks` defaults to what
    `max_raw_size` needs in chunks of `max_chunk_size` (the size the run's writers use): a
    manifest of many tiny chunks costs a request each.
    """

    max_raw_size: int
    max_chunk_size: int = DEFAULT_CHUNK_SIZE  # raw bytes per chunk: what loading inflates at a time
    max_chunks: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)  # entries the checkpoint's metadata must hold
    tensors: Mapping[str, TensorSpec] | None = None  # the exact layout of the state, when known

    def __post_init__(self) -> None:
        if self.max_chunks is None:
            object.__setattr__(self, "max_chunks", max(1, -(-self.max_raw_size // self.max_chunk_size)))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        if self.tensors is not None:
            object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    def check(self, manifest: Manifest) -> None:
        """Raise `LimitError` naming the first limit `manifest` breaks; return if it keeps them all."""
        if manifest.raw_size > self.max_raw_size:
            raise LimitError("max_raw_size", f"the state is {manifest.raw_size} bytes, at most {self.max_raw_size} allowed")
        if len(manifest.chunks) > self.max_chunks:
            raise LimitError("max_chunks", f"{len(manifest.chunks)} chunks, at most {self.max_chunks} allowed")
        if manifest.chunk_size > self.max_chunk_size:
            raise LimitError("max_chunk_size", f"chunks of {manifest.chunk_size} bytes, at most {self.max_chunk_size} allowed")
        held = manifest.full_metadata
        for key, wanted in self.metadata.items():
            value = held.get(key, _ABSENT)
            if type(value) is not type(wanted) or value != wanted:
                shown = "absent" if value is _ABSENT else f"{value!r:.80}"
                raise LimitError("metadata", f"{key} is {shown}, expected {wanted!r:.80}")


_ABSENT = object()


def read_manifest(data: bytes, *, expected_id: bytes | None = None) -> Manifest:
    """Parse and fully validate manifest bytes, or raise `CheckpointError`.

    `expected_id`, when given, is the checkpoint ID the caller asked for; bytes
    that do not hash to it are refused before anything else is looked at.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CheckpointError("bad-manifest", f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if expected_id is not None and hashlib.sha256(data).digest() != expected_id:
        raise CheckpointError("wrong-id", "manifest bytes do not hash to the requested checkpoint ID")
    try:
        raw = unpack(data, max_size=MAX_MANIFEST_SIZE)
        _SCHEMA.check(raw)
    except CheckpointError:
        raise
    except ProtocolError as exc:
        raise CheckpointError("bad-manifest", f"{exc.code}: {exc.reason}") from None
    chunks = tuple(ChunkRef(c["hash"], c["size"], c["raw_size"]) for c in raw["chunks"])
    _check_run(raw["run"])
    _check_metadata_keys(raw["metadata"])
    _check_chunk_sizes(raw["raw_size"], raw["chunk_size"], chunks)
    if merkle_root([c.hash for c in chunks]) != raw["merkle_root"]:
        raise CheckpointError("bad-manifest", "merkle_root does not match the chunk hashes")
    return Manifest(
        raw_size=raw["raw_size"], chunk_size=raw["chunk_size"], chunks=chunks, round=raw["round"],
        run=raw["run"], metadata=raw["metadata"], state_hash=raw["state_hash"],
        merkle_root=raw["merkle_root"], version=raw["version"], encoded=data,
    )


def split_metadata(metadata: dict[str, Any]) -> tuple[int, bytes, dict[str, Any]]:
    """A writer's metadata as (round, run, the rest); `round` and `run` are required."""
    if not isinstance(metadata, dict):
        raise CheckpointError("bad-metadata", "metadata must be a dict")
    missing = RESERVED_METADATA - metadata.keys()
    if missing:
        raise CheckpointError("bad-metadata", f"metadata lacks {sorted(missing)}")
    rest = {key: value for key, value in metadata.items() if key not in RESERVED_METADATA}
    try:
        _SCHEMA.fields["round"].check(metadata["round"], "round")
        _SCHEMA.fields["run"].check(metadata["run"], "run")
        _check_run(metadata["run"])
        METADATA_SCHEMA.check(rest, "metadata")
    except ProtocolError as exc:
        raise CheckpointError("bad-metadata", exc.reason) from None
    return metadata["round"], metadata["run"], rest


def verify_chunk(manifest: Manifest, index: int, data: bytes) -> None:
    """Check that `data` is chunk `index` of `manifest` (length, then SHA-256), or raise `CheckpointError`.

    This is all a downloader needs before it stores or inflates a chunk from an
    untrusted provider.
    """
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(manifest.chunks):
        raise CheckpointError("bad-chunk", f"chunk index {index!r} is not in [0, {len(manifest.chunks)})")
    ref = manifest.chunks[index]
    if len(data) != ref.size:
        raise CheckpointError("bad-chunk", f"chunk {index} ({ref.hash.hex()}) has {len(data)} bytes, expected {ref.size}")
    if hashlib.sha256(data).digest() != ref.hash:
        raise CheckpointError("bad-chunk", f"chunk {index} ({ref.hash.hex()}) does not match its hash")


# --- Merkle tree over chunk hashes (RFC 6962 / RFC 9162 shape) ---------------------------------


def merkle_root(leaves: list[bytes]) -> bytes:
    """The Merkle tree hash of `leaves`: leaves hashed as H(0x00 || leaf), nodes as H(0x01 || l || r).

    The tree splits at the largest power of two below the leaf count, as in RFC
    6962, so a tree of any size has one root and short inclusion proofs.
    """
    level = [_leaf_hash(leaf) for leaf in leaves]
    if not level:
        return hashlib.sha256(b"").digest()
    # Pairing left to right and carrying an odd last node up unchanged builds exactly the RFC tree.
    while len(level) > 1:
        paired = [_node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def merkle_proof(leaves: list[bytes], index: int) -> list[bytes]:
    """The inclusion path for `leaves[index]`, bottom-up (RFC 9162 section 2.1.3.1)."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf {index} is not in [0, {len(leaves)})")
    if len(leaves) == 1:
        return []
    split = _largest_power_of_two_below(len(leaves))
    if index < split:
        return merkle_proof(leaves[:split], index) + [merkle_root(leaves[split:])]
    return merkle_proof(leaves[split:], index - split) + [merkle_root(leaves[:split])]


def verify_merkle_proof(root: bytes, leaf: bytes, index: int, count: int, proof: list[bytes]) -> bool:
    """Whether `proof` shows `leaf` at `index` in a tree of `count` leaves with `root` (RFC 9162 2.1.3.2)."""
    if not 0 <= index < count:
        return False
    fn, sn, node = index, count - 1, _leaf_hash(leaf)
    for sibling in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            node = _node_hash(sibling, node)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            node = _node_hash(node, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and node == root


def _leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(_LEAF_PREFIX + leaf).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def _largest_power_of_two_below(n: int) -> int:
    return 1 << ((n - 1).bit_length() - 1)


# --- semantic checks the schema cannot express -------------------------------------------------


def _check_run(run: bytes) -> None:
    if len(run) not in (0, RUN_ID_SIZE):
        raise CheckpointError("bad-manifest", f"run is {len(run)} bytes; a run ID has {RUN_ID_SIZE} (or none, 0)")


def _check_metadata_keys(metadata: dict[str, Any]) -> None:
    reserved = RESERVED_METADATA & metadata.keys()
    if reserved:
        raise CheckpointError("bad-manifest", f"metadata may not hold {sorted(reserved)}: they are manifest fields")


def _check_chunk_sizes(raw_size: int, chunk_size: int, chunks: tuple[ChunkRef, ...]) -> None:
    """Every chunk but the last holds `chunk_size` raw bytes; together they hold `raw_size`."""
    expected_count = -(-raw_size // chunk_size)
    if len(chunks) != expected_count:
        reason = f"{raw_size} raw bytes in chunks of {chunk_size} make {expected_count} chunks, not {len(chunks)}"
        raise CheckpointError("bad-manifest", reason)
    last_raw = raw_size - (expected_count - 1) * chunk_size
    for index, chunk in enumerate(chunks):
        expected_raw = last_raw if index == expected_count - 1 else chunk_size
        if chunk.raw_size != expected_raw:
            raise CheckpointError("bad-manifest", f"chunk {index} claims {chunk.raw_size} raw bytes, expected {expected_raw}")
        if chunk.size > compress_bound(chunk.raw_size):
            reason = f"chunk {index}: {chunk.size} compressed bytes for {chunk.raw_size} raw is impossible"
            raise CheckpointError("bad-manifest", reason)

