"""Datasets in the node's checkpoint store: packed from the user's files, loaded back verified.

A dataset is a set of checkpoints (`locomesh.training.data.index` says which), so it lives in
the same store as run states and payloads (`locomesh.node.transfer.store`), usually the data
dir's ``checkpoints/``: the daemon's checkpoint service announces every checkpoint there and
downloads any of them by ID, chunk by chunk, verified. Packing a dataset into that directory is
therefore all it takes to share it; a peer that knows the dataset ID fetches the index, then the
tokenizer and whichever shards it needs.

`write_dataset` streams: each shard is written as soon as the next one is full (the first is
held back until a second exists, so a corpus too small for a dataset leaves nothing behind),
then the tokenizer, then the index last, so an index that is visible names checkpoints that are
all there. A pack that fails midway (a bad line, a full disk, Ctrl-C) removes the files it added
(`store.remove_created`): a dataset is stored whole or not at all, and no orphan shard is left for
the daemon to announce.

Everything loaded goes through `load_checkpoint` with the dataset's limits: every chunk is checked
against its hash, the state against its hash, and a checkpoint that is not what the index says it
is (size, layout, kind) is refused before anything is allocated for it.

Every function blocks on the disk (and hashes); the daemon runs them in a worker thread.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from locomesh.node.transfer.store import load_checkpoint, remove_created, write_checkpoint
from locomesh.training.data.index import (
    INDEX_METADATA, INDEX_TENSOR, MAX_NAME, MAX_SHARDS, SHARD_METADATA, TOKENIZER_METADATA, TOKENIZER_TENSOR, TOKENS_TENSOR,
    DatasetError, DatasetIndex, bytes_of, index_limits, index_tensors, read_index, shard_limits, shard_tensors,
    shard_tokens_of, tokenizer_limits, tokenizer_tensors,
)
from locomesh.training.data.pack import (
    DEFAULT_HOLDOUT, DEFAULT_SHARD_TOKENS, ShardStream, check_files, check_holdout, documents, heldout_count,
    open_tokenizer,
)


@dataclass(frozen=True)
class PackedDataset:
    """A dataset `write_dataset` stored: its ID (the index checkpoint's), its index, and how the
    packing went."""

    id: bytes
    index: DatasetIndex
    documents: int  # documents with at least one token
    dropped_tokens: int  # the tail of the corpus, fewer than a shard


def write_dataset(
    directory: str | os.PathLike,
    files: Sequence[str | os.PathLike],
    tokenizer_path: str | os.PathLike,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    holdout_fraction: float = DEFAULT_HOLDOUT,
    name: str = "",
    text_field: str = "text",
    eos: str | None = None,
) -> PackedDataset:
    """Tokenize `files` with the tokenizer.json at `tokenizer_path` and store the dataset under
    `directory` (see `training.data.pack` for how files become documents and shards); the same
    inputs always give the same dataset ID.

    Raises `DatasetError` for bad input (a missing or unreadable file, a bad tokenizer or JSON
    line, a corpus too small for two shards, bad arguments), `OSError` if the disk fails.
    Arguments and files are checked before anything is written; whatever fails later takes back
    the files written so far (those that were in the store before stay).
    """
    check_files(files)
    check_holdout(holdout_fraction)
    if len(name) > MAX_NAME:
        raise DatasetError("bad-input", f"a dataset name has at most {MAX_NAME} characters")
    tokenizer = open_tokenizer(tokenizer_path, eos)
    created: list[Path] = []
    try:
        return _store(directory, ShardStream(tokenizer, shard_tokens), documents(files, text_field), name,
                      holdout_fraction, created)
    except BaseException:
        remove_created(created)
        raise


def _store(directory: str | os.PathLike, stream: ShardStream, docs: Iterator[str], name: str, holdout_fraction: float,
           created: list[Path]) -> PackedDataset:
    """Write the shards of `docs`, the tokenizer and the index; every file added goes in `created`."""
    tokenizer, shard_tokens = stream.tokenizer, stream.shard_tokens
    shard_ids = _write_shards(directory, stream, stream.shards(docs), created)
    tokenizer_id = write_checkpoint(directory, tokenizer_tensors(tokenizer.raw), dict(TOKENIZER_METADATA),
                                    created=created).id
    held = heldout_count(len(shard_ids), holdout_fraction)
    index = DatasetIndex(
        name=name, tokenizer=tokenizer_id, tokenizer_hash=tokenizer.hash, vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id, shard_tokens=shard_tokens, dtype=tokenizer.dtype, train=shard_ids[:-held],
        heldout=shard_ids[-held:], tokens=shard_tokens * len(shard_ids),
    )
    dataset_id = write_checkpoint(directory, index_tensors(index), dict(INDEX_METADATA), created=created).id
    return PackedDataset(dataset_id, index, stream.documents, stream.dropped)


def _write_shards(
    directory: str | os.PathLike, stream: ShardStream, shards: Iterator[np.ndarray], created: list[Path]
) -> list[bytes]:
    """Store every shard of `shards`; their checkpoint IDs in order. Nothing is stored unless
    there are at least two (one to train on, one held out)."""
    first, second = next(shards, None), next(shards, None)
    if second is None:
        raise DatasetError(
            "too-small",
            f"{stream.documents} documents make {stream.tokens} tokens, not the {2 * stream.shard_tokens} that two shards "
            f"of {stream.shard_tokens} need (one to train on, one held out): use a smaller --shard-tokens or more text",
        )
    ids = []
    for tokens in itertools.chain((first, second), shards):  # each written as it comes, never held with the others
        if len(ids) == MAX_SHARDS:
            raise DatasetError("bad-input", f"over {MAX_SHARDS} shards of {stream.shard_tokens}: use a larger --shard-tokens")
        tensors = shard_tensors(tokens, stream.tokenizer.dtype)
        ids.append(write_checkpoint(directory, tensors, dict(SHARD_METADATA), created=created).id)
    return ids


def load_index(directory: str | os.PathLike, dataset_id: bytes | str) -> DatasetIndex:
    """The index of dataset `dataset_id` (bytes or hex), verified: `CheckpointError` if its
    checkpoint is not stored whole (`store.is_missing`), damaged, or no index checkpoint;
    `DatasetError` if the index it holds is invalid."""
    tensors, _metadata = load_checkpoint(directory, dataset_id, index_limits())
    return read_index(bytes_of(tensors, INDEX_TENSOR, "bad-index"))


def load_shard(directory: str | os.PathLike, index: DatasetIndex, shard_id: bytes) -> np.ndarray:
    """The `index.shard_tokens` token IDs of shard `shard_id` of `index`, as an array of the
    index's dtype: every chunk verified, and a checkpoint that is not exactly such a shard refused
    before it is allocated (`CheckpointError`); `DatasetError` if `index` has no such shard."""
    if shard_id not in index.shards:
        raise DatasetError("unknown-shard", f"shard {bytes(shard_id).hex()[:16]} is not in the dataset")
    tensors, _metadata = load_checkpoint(directory, shard_id, shard_limits(index))
    return shard_tokens_of(tensors[TOKENS_TENSOR].numpy(), index)


def load_tokenizer(directory: str | os.PathLike, index: DatasetIndex) -> bytes:
    """The tokenizer.json bytes of `index`, verified against its `tokenizer_hash`
    (`DatasetError` ``wrong-tokenizer`` if they differ); `CheckpointError` as `load_index`."""
    tensors, _metadata = load_checkpoint(directory, index.tokenizer, tokenizer_limits())
    raw = bytes_of(tensors, TOKENIZER_TENSOR, "bad-tokenizer")
    if hashlib.sha256(raw).digest() != index.tokenizer_hash:
        reason = f"tokenizer {index.tokenizer.hex()[:16]} does not hash to the index's tokenizer_hash"
        raise DatasetError("wrong-tokenizer", reason)
    return raw
