"""`locomesh data pack FILES... --tokenizer tokenizer.json`: tokenize text into a shared dataset.

Packs the files into a dataset (`locomesh.node.datasets.store.write_dataset`: a tokenizer
checkpoint, shards of token IDs, and an index whose checkpoint ID is the dataset ID) and prints
the dataset ID. By default it writes into the checkpoint store of the node's data dir, where a
running daemon announces every checkpoint to its peers (new ones within its announce interval),
so whoever knows the ID can download the dataset, every chunk verified. Works with or without a
daemon: it only writes files, atomically, as the daemon's own store does.

Exit status: 0 with the dataset ID, 1 when the disk fails (a full disk: "no space left on device:
DIR; ..."), 2 for bad input (a missing file, a bad tokenizer file or JSON line, a corpus too small
for two shards, bad arguments); one line on stderr for each failure. A pack that fails leaves
nothing of itself in the store.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from locomesh.node.datadir import CHECKPOINT_DIR, DISK_FULL, no_space

from .client import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .common import add_data_dir_argument, data_dir_of, fail


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="pack text into datasets that peers share")
    commands = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    pack = commands.add_parser(
        "pack", help="tokenize text files into a dataset and print its ID",
        description="Tokenize FILES (.jsonl/.json: one document per line; any other file: one document) into "
                    "shards of token IDs and store them, with the tokenizer and an index, as checkpoints. "
                    "The dataset ID is the index's checkpoint ID.",
    )
    pack.add_argument("files", nargs="+", metavar="FILE", help="text files, or JSON-lines files of documents")
    pack.add_argument("--tokenizer", required=True, metavar="FILE", help="a tokenizer.json (Hugging Face tokenizers)")
    pack.add_argument("--out", metavar="DIR",
                      help="the checkpoint store to write to (default: the data dir's checkpoints/, which a "
                           "running daemon announces to its peers, so the dataset is shared)")
    add_data_dir_argument(pack)
    # No defaults here: `write_dataset`'s apply (the help states them), and numpy and tokenizers
    # are not loaded before a handler runs.
    pack.add_argument("--shard-tokens", type=int, metavar="N",
                      help="tokens per shard (default 2**20 = 1048576: one checkpoint chunk); the tail, "
                           "fewer than a shard, is dropped")
    pack.add_argument("--holdout", type=float, metavar="F",
                      help="fraction of the shards (the last ones) held out for evaluation (default 0.01; at least one shard)")
    pack.add_argument("--name", default="", help="a label for people (not unique)")
    pack.add_argument("--text-field", default="text", metavar="FIELD", help="the text's field in JSON lines (default: text)")
    pack.add_argument("--eos", metavar="TOKEN",
                      help="the token that ends each document (default: the tokenizer's <|endoftext|>, </s>, <eos> "
                           "or <|end_of_text|>, whichever it has; none if none)")
    pack.add_argument("--json", action="store_true", help="print JSON")
    pack.set_defaults(handler=pack_data)


def pack_data(args: argparse.Namespace) -> int:
    from locomesh.node.datasets.store import write_dataset  # tokenizers and the store: only now
    from locomesh.training.checkpoint_manifest import CheckpointError
    from locomesh.training.data.index import DatasetError

    directory = Path(args.out) if args.out else data_dir_of(args) / CHECKPOINT_DIR
    given = {"shard_tokens": args.shard_tokens, "holdout_fraction": args.holdout}
    options = {key: value for key, value in given.items() if value is not None}
    try:
        packed = write_dataset(
            directory, args.files, args.tokenizer, name=args.name, text_field=args.text_field, eos=args.eos, **options
        )
    except DatasetError as error:
        return fail(error.reason, EXIT_USAGE)
    except (CheckpointError, OSError) as error:
        return fail(write_failure(error, directory), EXIT_ERROR)
    result = summary(packed, directory)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else format_summary(result))
    return EXIT_OK


def write_failure(error: Exception, directory: Path) -> str:
    """Why the pack could not write to `directory`, in one line; a full disk says what to do."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return (f"{no_space(error)}: {directory}; free some space or use --out DIR on another disk "
                "(nothing of this dataset was kept)")
    return f"cannot write the dataset to {directory}: {error}"


def summary(packed: Any, directory: Path) -> dict[str, Any]:
    """What `pack` reports about a `PackedDataset`, as JSON-ready values."""
    index = packed.index
    return {
        "dataset_id": packed.id.hex(), "name": index.name, "directory": str(directory),
        "documents": packed.documents, "tokens": index.tokens, "dropped_tokens": packed.dropped_tokens,
        "shard_tokens": index.shard_tokens, "train_shards": len(index.train), "heldout_shards": len(index.heldout),
        "vocab_size": index.vocab_size, "dtype": index.dtype, "eos_id": index.eos_id, "tokenizer": index.tokenizer.hex(),
    }


def format_summary(result: dict[str, Any]) -> str:
    """The dataset ID on the first line, alone (for scripts), then what it holds."""
    eos = "none" if result["eos_id"] is None else result["eos_id"]
    return "\n".join((
        result["dataset_id"],
        f"{result['documents']} documents, {result['tokens']} tokens in shards of {result['shard_tokens']}: "
        f"{result['train_shards']} train, {result['heldout_shards']} held out; {result['dropped_tokens']} tokens dropped",
        f"vocabulary {result['vocab_size']} ({result['dtype']}), end of document: {eos}; stored in {result['directory']}",
    ))
