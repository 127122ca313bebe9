"""Real text offline for the llama benchmarks: this Python's standard library, BPE-tokenized and packed.

The corpus is the `.py` sources of the standard library that runs the benchmark
(`sysconfig.get_paths()["stdlib"]`), minus the test suites, the codec tables (`encodings/`), site
packages and a few large sub-packages (`EXCLUDED_TOP`): about 400 files, 8 MB, for CPython 3.11.
Each file is one document (the packer puts the EOS token after it). The files are taken in
sorted order, then shuffled with a fixed seed, so that the held-out shards (the packer holds out
the last ones) are a mix of modules and not the end of the alphabet.

A byte-level BPE tokenizer (`tokenizers`: ByteLevel pre-tokenizer and decoder, the 256 byte
symbols as initial alphabet, special tokens "<unk>" and "</s>", the latter the EOS the packer
finds) is trained on the same files; the training is deterministic (the same files give the same
tokenizer.json bytes, hence the same dataset ID).

Everything is cached under `bench/out/corpus/` (git-ignored), keyed by a hash of the files'
contents and the parameters: the first call takes ~15 s (tokenizer training and packing), the
next ones load the index and shards. `pack_into(store)` packs the same dataset into another
checkpoint store (a daemon's `checkpoints/`, before it starts), with the cached tokenizer.

    corpus = stdlib_corpus()                   # the cached store, index and facts
    train, held_out = corpus.train_shards(), corpus.heldout_shards()
"""

from __future__ import annotations

import hashlib
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from locomesh.node.datasets.store import PackedDataset, load_index, load_shard, write_dataset
from locomesh.training.data.index import DatasetIndex

CACHE = Path(__file__).resolve().parent / "out" / "corpus"  # /bench/out/ is in .gitignore
SPECIAL_TOKENS = ("<unk>", "</s>")
EXCLUDED_TOP = frozenset({"test", "site-packages", "encodings", "idlelib", "turtledemo", "lib2to3", "distutils",
                          "pydoc_data"})
EXCLUDED_PARTS = frozenset({"test", "tests", "idle_test", "__pycache__"})
ORDER_SEED = 0
FORMAT = 1  # bump when the way the corpus is made changes: a new cache key

DEFAULT_VOCAB = 2048
DEFAULT_SHARD_TOKENS = 4096
DEFAULT_HOLDOUT = 0.02


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The corpus's files, in packing order: sorted by path under the stdlib, then shuffled with
    `ORDER_SEED`."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in EXCLUDED_TOP or parts[0].startswith("config-") or EXCLUDED_PARTS & set(parts[:-1]):
            continue
        files.append(path)
    random.Random(ORDER_SEED).shuffle(files)
    return files


def _texts(files: list[Path]) -> list[str]:
    return [path.read_text(encoding="utf-8") for path in files]


def train_tokenizer(files: list[Path], vocab_size: int, out: Path) -> None:
    """A byte-level BPE tokenizer of `vocab_size` tokens trained on `files`, saved at `out`."""
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_texts(files), trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    tokenizer.save(str(partial))
    partial.replace(out)


@dataclass(frozen=True)
class Corpus:
    """The packed corpus: the checkpoint store holding it, its ID and index, and facts for `meta`."""

    store: Path
    tokenizer: Path
    files: list[Path]
    dataset_id: bytes
    index: DatasetIndex
    facts: dict

    def train_shards(self) -> list[np.ndarray]:
        return [load_shard(self.store, self.index, shard) for shard in self.index.train]

    def heldout_shards(self) -> list[np.ndarray]:
        return [load_shard(self.store, self.index, shard) for shard in self.index.heldout]

    def pack_into(self, store: Path) -> PackedDataset:
        """The same dataset packed into the checkpoint store `store` (same ID: same inputs)."""
        packed = write_dataset(store, self.files, self.tokenizer, shard_tokens=self.index.shard_tokens,
                               holdout_fraction=self.facts["holdout_fraction"], name=self.index.name)
        assert packed.id == self.dataset_id, "packing the same corpus gave another dataset ID"
        return packed


def stdlib_corpus(vocab_size: int = DEFAULT_VOCAB, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                  holdout_fraction: float = DEFAULT_HOLDOUT, cache: Path = CACHE) -> Corpus:
    """The standard library corpus tokenized with a `vocab_size` BPE and packed in shards of
    `shard_tokens`, `holdout_fraction` of them held out: from the cache, made on the first call."""
    files = stdlib_files()
    digest = hashlib.sha256()
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root)}\0{len(data)}\0".encode())
        digest.update(data)
    corpus_hash = digest.hexdigest()
    key = hashlib.sha256(f"{FORMAT} {corpus_hash} {vocab_size} {shard_tokens} {holdout_fraction}".encode()).hexdigest()
    directory = cache / key[:16]
    tokenizer, store, facts_file = directory / "tokenizer.json", directory / "store", directory / "facts.json"
    if not facts_file.exists():
        if not tokenizer.exists():
            train_tokenizer(files, vocab_size, tokenizer)
        name = f"python{'.'.join(map(str, __import__('sys').version_info[:2]))} stdlib"
        packed = write_dataset(store, files, tokenizer, shard_tokens=shard_tokens,
                               holdout_fraction=holdout_fraction, name=name)
        facts = {
            "source": f"CPython stdlib .py sources under {root} (tests, encodings/, site-packages and "
                      f"{', '.join(sorted(EXCLUDED_TOP - {'test', 'site-packages', 'encodings'}))} left out)",
            "files": len(files), "bytes": sum(path.stat().st_size for path in files), "sha256": corpus_hash,
            "tokenizer": f"byte-level BPE, vocab {packed.index.vocab_size}, specials {list(SPECIAL_TOKENS)}",
            "vocab_size": packed.index.vocab_size, "eos_id": packed.index.eos_id,
            "tokens": packed.index.tokens, "dropped_tokens": packed.dropped_tokens, "documents": packed.documents,
            "shard_tokens": shard_tokens, "train_shards": len(packed.index.train),
            "heldout_shards": len(packed.index.heldout), "holdout_fraction": holdout_fraction,
            "dataset_id": packed.id.hex(),
        }
        facts_file.write_text(json.dumps(facts, indent=1))
    facts = json.loads(facts_file.read_text())
    dataset_id = bytes.fromhex(facts["dataset_id"])
    return Corpus(store, tokenizer, files, dataset_id, load_index(store, dataset_id), facts)


if __name__ == "__main__":
    import time

    started = time.perf_counter()
    corpus = stdlib_corpus()
    print(json.dumps({**corpus.facts, "seconds": round(time.perf_counter() - started, 1)}, indent=1))
