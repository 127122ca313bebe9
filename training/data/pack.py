"""Packing text into shards of token IDs: the user's files in, fixed-size arrays out, streamed.

Documents come from the files in the order given: a JSON-lines file (``.jsonl`` or ``.json``)
holds one document per line, its text in a string field (``text`` by default; blank lines are
skipped); any other file is one document, read as UTF-8. Documents are tokenized in batches
(`Tokenizer.encode_batch_fast`, without the tokenizer's own special tokens, so a template cannot add
an EOS of its own) and each is followed by the EOS token when the tokenizer has one, so a model
sees where one document ends and the next begins, across shard boundaries too. Documents with
no tokens are skipped. The token stream is cut into shards of exactly `shard_tokens`; the last
tokens, fewer than a shard, are dropped and counted (`ShardStream.dropped`).

Memory: one batch of documents (at most `BATCH_DOCUMENTS` or about `BATCH_CHARS` characters, but
a plain-text file is one document, read whole) and the shard being filled. The corpus is never
held whole: a caller writes each shard as it comes (`node.datasets.store.write_dataset`).

Reads the user's files; writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .index import MAX_SHARD_TOKENS, MAX_TOKENIZER_BYTES, MIN_SHARD_TOKENS, DatasetError, dtype_for

DEFAULT_SHARD_TOKENS = 1 << 20  # 2 MiB of uint16: one shard fits one default 4 MiB checkpoint chunk
DEFAULT_HOLDOUT = 0.01
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")  # the usual names, tried in order
JSONL_SUFFIXES = frozenset({".jsonl", ".json"})
BATCH_DOCUMENTS = 256
BATCH_CHARS = 1 << 22


@dataclass(frozen=True)
class TokenizerFile:
    """A tokenizer.json as read for packing: its exact bytes (what the dataset stores and hashes)
    and the tokenizer they make."""

    raw: bytes
    tokenizer: Tokenizer = field(compare=False, repr=False)
    vocab_size: int
    eos_id: int | None

    @property
    def hash(self) -> bytes:
        return hashlib.sha256(self.raw).digest()

    @property
    def dtype(self) -> str:
        return dtype_for(self.vocab_size)


def open_tokenizer(path: str | os.PathLike, eos: str | None = None) -> TokenizerFile:
    """The tokenizer in the file `path`, its EOS token `eos` (which it must have) or else the first
    of `EOS_CANDIDATES` it has (or none); `DatasetError` for a file that cannot be read or used."""
    try:
        raw = _read_capped(Path(path), MAX_TOKENIZER_BYTES)
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except OSError as exc:
        raise DatasetError("bad-input", f"cannot read the tokenizer {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for a bad file
        raise DatasetError("bad-tokenizer", f"{path} is not a tokenizer.json: {str(exc)[:200]}") from None
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return TokenizerFile(raw, tokenizer, vocab_size, _eos_id(tokenizer, eos, path))


def _read_capped(path: Path, cap: int) -> bytes:
    """The bytes of `path`, or `DatasetError` if it has more than `cap`."""
    with open(path, "rb") as file:
        data = file.read(cap + 1)
    if len(data) > cap:
        raise DatasetError("bad-tokenizer", f"{path} is over {cap} bytes")
    return data


def _eos_id(tokenizer: Tokenizer, eos: str | None, path: str | os.PathLike) -> int | None:
    if eos is not None:
        eos_id = tokenizer.token_to_id(eos)
        if eos_id is None:
            raise DatasetError("bad-tokenizer", f"{path} has no token {eos!r} to end documents with")
        return eos_id
    found = (tokenizer.token_to_id(name) for name in EOS_CANDIDATES)
    return next((eos_id for eos_id in found if eos_id is not None), None)


def check_files(files: Sequence[str | os.PathLike]) -> None:
    """Every file to pack exists and is a file, so a typo fails before anything is written."""
    if not files:
        raise DatasetError("bad-input", "no files to pack")
    for path in map(Path, files):
        if not path.is_file():
            raise DatasetError("bad-input", f"{path}: {'not a file' if path.exists() else 'no such file'}")


def documents(files: Iterable[str | os.PathLike], text_field: str = "text") -> Iterator[str]:
    """The documents of `files`, in order (see the module docstring); `DatasetError` naming the
    file (and line) that cannot be read."""
    for path in map(Path, files):
        try:
            if path.suffix.lower() in JSONL_SUFFIXES:
                yield from _json_lines(path, text_field)
            else:
                yield path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DatasetError("bad-input", f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise DatasetError("bad-input", f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _json_lines(path: Path, text_field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError("bad-input", f"{path}:{number}: not JSON ({exc.msg})") from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DatasetError("bad-input", f"{path}:{number}: not an object with a string field {text_field!r}")
            yield text


class ShardStream:
    """The token IDs of a stream of documents, cut into shards of exactly `shard_tokens`.

    Iterate `shards(docs)` once; as it goes, `documents` counts the documents with tokens and
    `tokens` the tokens read, and once it is done `dropped` is how many were left over (fewer
    than a shard).
    """

    def __init__(self, tokenizer: TokenizerFile, shard_tokens: int) -> None:
        if not MIN_SHARD_TOKENS <= shard_tokens <= MAX_SHARD_TOKENS:
            raise DatasetError("bad-input", f"--shard-tokens {shard_tokens} is outside [{MIN_SHARD_TOKENS}, {MAX_SHARD_TOKENS}]")
        self.tokenizer, self.shard_tokens = tokenizer, shard_tokens
        # encode_batch_fast (tokenizers >= 0.20) gives the same IDs about twice as fast: no offsets
        self._encode_batch = getattr(tokenizer.tokenizer, "encode_batch_fast", tokenizer.tokenizer.encode_batch)
        self.documents = self.tokens = self.dropped = 0

    def shards(self, docs: Iterable[str]) -> Iterator[np.ndarray]:
        """Shards of `shard_tokens` IDs, each a new array of the tokenizer's dtype."""
        shard, filled = self._new_shard(), 0
        for ids in self._token_batches(docs):
            while len(ids):
                take = min(len(ids), self.shard_tokens - filled)
                shard[filled : filled + take] = ids[:take]
                filled, ids = filled + take, ids[take:]
                if filled == self.shard_tokens:
                    yield shard
                    shard, filled = self._new_shard(), 0
        self.dropped = filled

    def _new_shard(self) -> np.ndarray:
        return np.empty(self.shard_tokens, dtype=self.tokenizer.dtype)

    def _token_batches(self, docs: Iterable[str]) -> Iterator[np.ndarray]:
        """The IDs of each batch of documents, each document followed by EOS (if any)."""
        for batch in _batches(docs):
            encodings = self._encode_batch(batch, add_special_tokens=False)
            eos = [] if self.tokenizer.eos_id is None else [self.tokenizer.eos_id]
            pieces = [encoding.ids + eos for encoding in encodings if encoding.ids]
            if not pieces:
                continue
            ids = np.concatenate([np.asarray(piece, dtype=np.int64) for piece in pieces])
            self._check_range(ids)
            self.documents += len(pieces)
            self.tokens += len(ids)
            yield ids

    def _check_range(self, ids: np.ndarray) -> None:
        # The dtype follows the vocabulary, so an ID outside it would be the tokenizer's bug; a
        # silent wrap-around in the shard would be far worse than stopping.
        if ids.min() < 0 or ids.max() >= self.tokenizer.vocab_size:
            raise DatasetError("bad-tokenizer", f"the tokenizer gave an ID outside its vocabulary of {self.tokenizer.vocab_size}")


def _batches(docs: Iterable[str]) -> Iterator[list[str]]:
    """`docs` in lists of at most `BATCH_DOCUMENTS`, closed early once they pass `BATCH_CHARS`."""
    batch, chars = [], 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if len(batch) == BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def check_holdout(fraction: float) -> None:
    """A held-out fraction is strictly between 0 and 1 (checked before anything is packed)."""
    if not 0.0 < fraction < 1.0:
        raise DatasetError("bad-input", f"the held-out fraction {fraction} must be between 0 and 1")


def heldout_count(shards: int, fraction: float) -> int:
    """How many of `shards` (at least 2) are held out, the last ones: round(fraction * shards), at
    least one, and at least one shard is left to train on."""
    check_holdout(fraction)
    return min(max(1, round(fraction * shards)), shards - 1)
