"""A small corpus and a BPE tokenizer trained on it inside the test run (no download), packed as a dataset.

The documents are random sentences over a fixed word list: a model learns their statistics in a few
steps, so a loss that falls shows training works on packed data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from locomesh.node.datasets.store import PackedDataset, write_dataset

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex one jolly box".split()
SPECIAL_TOKENS = ("<unk>", "</s>")


def documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(count)]


def train_tokenizer(path: Path, special_tokens: tuple[str, ...] = SPECIAL_TOKENS, vocab_size: int = 120) -> Tokenizer:
    """A BPE tokenizer trained on `documents(50, 1)`, saved as tokenizer.json at `path`."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens))
    tokenizer.train_from_iterator(documents(50, 1), trainer)
    tokenizer.save(str(path))
    return tokenizer


def write_corpus(root: Path, count: int = 200, seed: int = 2) -> tuple[list[Path], Path]:
    """`count` documents as a .txt file and a .jsonl file under `root`, and a tokenizer for them:
    (the files, the tokenizer.json path)."""
    root.mkdir(parents=True, exist_ok=True)
    docs = documents(count, seed)
    text, lines = root / "first.txt", root / "rest.jsonl"
    text.write_text(docs[0], encoding="utf-8")
    lines.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs[1:]), encoding="utf-8")
    tokenizer_path = root / "tokenizer.json"
    train_tokenizer(tokenizer_path)
    return [text, lines], tokenizer_path


def pack_corpus(store: Path, root: Path, *, count: int = 200, shard_tokens: int = 256,
                holdout_fraction: float = 0.1) -> PackedDataset:
    """`write_corpus` under `root`, packed into the checkpoint store `store`."""
    files, tokenizer_path = write_corpus(root, count)
    return write_dataset(store, files, tokenizer_path, shard_tokens=shard_tokens,
                         holdout_fraction=holdout_fraction, name="test corpus")
