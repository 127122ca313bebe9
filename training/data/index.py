"""The format of a tokenized dataset: checkpoints that name each other, and the index that lists them.

A dataset is a handful of ordinary checkpoints (`checkpoint_manifest`), so the node's store keeps
them and its checkpoint service shares them peer to peer like any other, every chunk verified:

- the tokenizer: one uint8 tensor ``tokenizer`` holding the bytes of a ``tokenizer.json``,
  metadata ``{round: 0, run: b"", kind: "tokenizer"}``;
- the shards: one tensor ``tokens`` each, exactly `shard_tokens` token IDs, metadata
  ``{round: 0, run: b"", kind: "dataset-shard"}``;
- the index: one uint8 tensor ``index`` holding the canonical msgpack of a `DatasetIndex`, metadata
  ``{round: 0, run: b"", kind: "dataset"}``. It names the tokenizer and every shard by checkpoint
  ID, so **the dataset ID is the index checkpoint's ID**: it pins every token and the tokenizer.

Token IDs are ``uint16`` when the vocabulary fits (at most 65536 entries), else ``uint32``. The
checkpoint format's tensors have no unsigned 16- or 32-bit dtype (`state_format.DTYPES`), so a
shard's ``tokens`` tensor is the token IDs' little-endian bytes as uint8, and the index's `dtype`
says how to read them (`shard_tensors`, `shard_tokens_of`). A shard is the same bytes either way.

The shards are split once, when the dataset is packed: ``train`` shards are what members train
on (`assignment` deals them out each round), ``heldout`` shards are for evaluation only, and no
shard is in both.

An index comes from peers, so `read_index` trusts nothing: size, schema, every range and every
relation between fields is checked before a `DatasetIndex` exists (its constructor runs the same
checks, so no invalid one exists at all). The `*_limits` functions say what a downloader allows
each checkpoint to be, so a bad one is refused before any chunk of it is fetched or allocated.

Pure: no files, no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol.schema import Bytes, Int, List, Nullable, OneOf, Str, Struct

from ..checkpoint_manifest import HASH_SIZE, ManifestLimits, TensorSpec
from ..state_chunks import checkpoint_limits
from ..state_format import layout_raw_size

VERSION = 1
MiB = 1024 * 1024
MAX_NAME = 200  # characters
MIN_SHARD_TOKENS = 16  # tiny shards are for tests; a real dataset uses `pack.DEFAULT_SHARD_TOKENS`
MAX_SHARD_TOKENS = 1 << 24  # 64 MiB of uint32: what a downloader may have to allocate for one shard
MAX_SHARDS = 65536
MAX_VOCAB = 1 << 32  # token IDs are at most uint32
UINT16_VOCAB = 1 << 16  # the largest vocabulary whose IDs fit uint16
MAX_INDEX_BYTES = 4 * MiB  # MAX_SHARDS IDs of 34 encoded bytes each, with room to spare
MAX_TOKENIZER_BYTES = 64 * MiB

INDEX_TENSOR, TOKENIZER_TENSOR, TOKENS_TENSOR = "index", "tokenizer", "tokens"
INDEX_METADATA: Mapping[str, Any] = {"round": 0, "run": b"", "kind": "dataset"}
SHARD_METADATA: Mapping[str, Any] = {"round": 0, "run": b"", "kind": "dataset-shard"}
TOKENIZER_METADATA: Mapping[str, Any] = {"round": 0, "run": b"", "kind": "tokenizer"}
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


class DatasetError(ProtocolError):
    """A dataset (an index, a tokenizer, or the files being packed into one) that cannot be used.

    Codes: ``bad-index`` (an index that breaks the format), ``too-large``, ``bad-input`` (a file
    to pack: unreadable, or a JSON line without its text), ``bad-tokenizer``, ``too-small`` (too
    few tokens for two shards), ``wrong-tokenizer`` (a tokenizer that does not hash to the index's
    `tokenizer_hash`), ``unknown-shard``.
    """


_ID = Bytes(HASH_SIZE, HASH_SIZE)
_SCHEMA = Struct(
    {
        "version": Int(VERSION, VERSION),
        "name": Str(0, MAX_NAME),
        "tokenizer": _ID,
        "tokenizer_hash": _ID,
        "vocab_size": Int(1, MAX_VOCAB),
        "eos_id": Nullable(Int(0, MAX_VOCAB - 1)),
        "shard_tokens": Int(MIN_SHARD_TOKENS, MAX_SHARD_TOKENS),
        "dtype": OneOf(frozenset(TOKEN_DTYPES)),
        "train": List(_ID, max_len=MAX_SHARDS, min_len=1),
        "heldout": List(_ID, max_len=MAX_SHARDS, min_len=1),
        "tokens": Int(0, MAX_SHARDS * MAX_SHARD_TOKENS),
    }
)


@dataclass(frozen=True)
class DatasetIndex:
    """What a dataset is made of. Constructing one checks every rule `read_index` does, so an
    index that exists is valid; `encode` gives its one canonical byte form."""

    name: str
    tokenizer: bytes  # checkpoint ID of the tokenizer checkpoint
    tokenizer_hash: bytes  # SHA-256 of the tokenizer.json bytes
    vocab_size: int
    eos_id: int | None
    shard_tokens: int
    dtype: str  # "uint16" or "uint32": `dtype_for(vocab_size)`
    train: tuple[bytes, ...]  # shard checkpoint IDs
    heldout: tuple[bytes, ...]
    tokens: int  # shard_tokens * number of shards
    version: int = VERSION

    def __post_init__(self) -> None:
        for name in ("train", "heldout"):  # lists are accepted, tuples kept: the index is immutable
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        try:
            _SCHEMA.check(self._fields())
        except ProtocolError as exc:
            raise DatasetError("bad-index", exc.reason) from None
        _check_relations(self)

    def _fields(self) -> dict[str, Any]:
        return {
            "version": self.version, "name": self.name, "tokenizer": self.tokenizer,
            "tokenizer_hash": self.tokenizer_hash, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
            "shard_tokens": self.shard_tokens, "dtype": self.dtype, "train": _listed(self.train),
            "heldout": _listed(self.heldout), "tokens": self.tokens,
        }

    def encode(self) -> bytes:
        """The index as canonical msgpack: the bytes of the index checkpoint's ``index`` tensor."""
        return pack(self._fields())

    @property
    def shards(self) -> tuple[bytes, ...]:
        """Every shard, train then held out."""
        return self.train + self.heldout


def read_index(data: bytes) -> DatasetIndex:
    """Parse and fully validate index bytes from anywhere (a peer included), or raise `DatasetError`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DatasetError("bad-index", f"expected bytes, got {type(data).__name__}")
    try:
        raw = unpack(bytes(data), max_size=MAX_INDEX_BYTES)
        _SCHEMA.check(raw)
    except ProtocolError as exc:
        code = "too-large" if exc.code == "too-large" else "bad-index"
        raise DatasetError(code, f"{exc.code}: {exc.reason}") from None
    return DatasetIndex(**raw)


def _listed(ids: Any) -> Any:
    """`ids` as the list msgpack encodes, or as it is (for the schema to refuse) if it is no tuple."""
    return list(ids) if isinstance(ids, tuple) else ids


def dtype_for(vocab_size: int) -> str:
    """The dtype of a vocabulary's token IDs: uint16 when they fit, else uint32."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


def _check_relations(index: DatasetIndex) -> None:
    """The rules between fields that the schema cannot express."""
    count = len(index.train) + len(index.heldout)
    if count > MAX_SHARDS:
        raise DatasetError("bad-index", f"{count} shards, at most {MAX_SHARDS} allowed")
    if index.dtype != dtype_for(index.vocab_size):
        reason = f"a vocabulary of {index.vocab_size} takes {dtype_for(index.vocab_size)}, not {index.dtype}"
        raise DatasetError("bad-index", reason)
    if index.eos_id is not None and index.eos_id >= index.vocab_size:
        raise DatasetError("bad-index", f"eos_id {index.eos_id} is outside the vocabulary of {index.vocab_size}")
    if index.tokens != index.shard_tokens * count:
        reason = f"tokens is {index.tokens}, but {count} shards of {index.shard_tokens} hold {index.shard_tokens * count}"
        raise DatasetError("bad-index", reason)
    if set(index.train) & set(index.heldout):
        raise DatasetError("bad-index", "a shard is both a train and a held-out shard")


# --- the checkpoints a dataset is made of -------------------------------------------------------


def index_tensors(index: DatasetIndex) -> dict[str, np.ndarray]:
    """The tensors of the index checkpoint (its metadata is `INDEX_METADATA`)."""
    return {INDEX_TENSOR: np.frombuffer(index.encode(), dtype=np.uint8)}


def tokenizer_tensors(tokenizer_json: bytes) -> dict[str, np.ndarray]:
    """The tensors of the tokenizer checkpoint (its metadata is `TOKENIZER_METADATA`)."""
    return {TOKENIZER_TENSOR: np.frombuffer(tokenizer_json, dtype=np.uint8)}


def shard_tensors(tokens: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """The tensors of the shard checkpoint of `tokens` (its metadata is `SHARD_METADATA`): their
    little-endian bytes as `dtype` (see the module docstring for why bytes)."""
    return {TOKENS_TENSOR: np.ascontiguousarray(tokens, dtype=TOKEN_DTYPES[dtype]).reshape(-1).view(np.uint8)}


def shard_tokens_of(data: np.ndarray, index: DatasetIndex) -> np.ndarray:
    """The token IDs in a shard's ``tokens`` tensor (uint8, checked against `shard_limits(index)`),
    as an array of the index's dtype (a view, no copy)."""
    return data.view(TOKEN_DTYPES[index.dtype])


def index_limits() -> ManifestLimits:
    """What an index checkpoint may be: at most `MAX_INDEX_BYTES` of index, kind dataset."""
    return _bytes_limits(INDEX_TENSOR, MAX_INDEX_BYTES, INDEX_METADATA)


def tokenizer_limits() -> ManifestLimits:
    """What a tokenizer checkpoint may be: at most `MAX_TOKENIZER_BYTES` of JSON, kind tokenizer."""
    return _bytes_limits(TOKENIZER_TENSOR, MAX_TOKENIZER_BYTES, TOKENIZER_METADATA)


def shard_limits(index: DatasetIndex) -> ManifestLimits:
    """What a shard of `index` must be, exactly: `shard_tokens` IDs of its dtype, kind dataset-shard."""
    width = TOKEN_DTYPES[index.dtype].itemsize
    return checkpoint_limits({TOKENS_TENSOR: TensorSpec("uint8", (index.shard_tokens * width,))}, SHARD_METADATA)


def _bytes_limits(name: str, max_bytes: int, metadata: Mapping[str, Any]) -> ManifestLimits:
    """Limits for a checkpoint of one uint8 tensor of at most `max_bytes`. The length is not known
    ahead, so the layout is left unchecked here; the loader checks the tensor it gets (`bytes_of`)."""
    return ManifestLimits(max_raw_size=layout_raw_size({name: TensorSpec("uint8", (max_bytes,))}), metadata=metadata)


def bytes_of(tensors: Mapping[str, Any], name: str, code: str) -> bytes:
    """The bytes of a checkpoint that must hold exactly one 1-D uint8 tensor `name` (numpy or
    torch), or `DatasetError` with `code`."""
    value = tensors.get(name)
    array = None if value is None else np.asarray(value)
    if len(tensors) != 1 or array is None or array.dtype != np.uint8 or array.ndim != 1:
        raise DatasetError(code, f"the checkpoint must hold one 1-D uint8 tensor {name!r}, not {sorted(tensors)!r:.80}")
    return array.tobytes()
