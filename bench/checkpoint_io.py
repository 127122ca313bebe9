"""Checkpoint write and load speed, compressed size and memory for a 100 MB state.

    .venv/bin/python bench/checkpoint_io.py [--numel 25000000] [--chunk-mib 4] [--dir /tmp]

The state is one float32 tensor of `--numel` values (100 MB by default), drawn
from a normal distribution as trained weights roughly are, so zstd finds little
to squeeze; a second run writes the same number of zeros (a fresh optimizer
state), the easy case. Writing includes compression, hashing and an fsync per
file; loading includes hash checks and decompression. Peak RSS growth during
each phase shows how many copies of the state the phase holds.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

from locomesh.node.transfer.store import load_checkpoint, write_checkpoint

MB = 1e6


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(state_name: str, tensor: torch.Tensor, directory: Path, chunk_size: int) -> dict:
    raw_mb = tensor.numel() * tensor.element_size() / MB
    rss = peak_rss_bytes()
    started = time.perf_counter()
    manifest = write_checkpoint(directory, {"weights": tensor}, {"round": 1, "run": bytes(32)}, chunk_size=chunk_size)
    write_s = time.perf_counter() - started
    write_rss = peak_rss_bytes() - rss

    rss = peak_rss_bytes()
    started = time.perf_counter()
    tensors, _ = load_checkpoint(directory, manifest.id)
    load_s = time.perf_counter() - started
    load_rss = peak_rss_bytes() - rss
    assert torch.equal(tensors["weights"].view(torch.int32), tensor.view(torch.int32)), "round trip changed the bits"

    compressed = sum(chunk.size for chunk in manifest.chunks)
    return {
        "state": state_name, "raw_MB": round(raw_mb, 1), "chunks": len(manifest.chunks),
        "compressed_MB": round(compressed / MB, 1), "ratio": round(compressed / manifest.raw_size, 3),
        "write_s": round(write_s, 2), "write_MBps": round(raw_mb / write_s), "write_peak_rss_growth_MB": round(write_rss / MB),
        "load_s": round(load_s, 2), "load_MBps": round(raw_mb / load_s), "load_peak_rss_growth_MB": round(load_rss / MB),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where to write (a temporary folder under it, removed after)")
    args = parser.parse_args()
    chunk_size = args.chunk_mib * 1024 * 1024

    generator = torch.Generator().manual_seed(0)
    states = [
        ("randn float32", torch.randn(args.numel, generator=generator)),
        ("zeros float32", torch.zeros(args.numel)),
    ]
    rows = []
    for name, tensor in states:
        directory = Path(tempfile.mkdtemp(prefix="locomesh-ckpt-bench-", dir=args.dir))
        try:
            rows.append(measure(name, tensor, directory, chunk_size))
        finally:
            shutil.rmtree(directory)
    meta = {"numel": args.numel, "chunk_size": chunk_size, "threads": 1, **machine(),
            "note": "CPU shared with other work while measured; peak RSS growth is 0 when an earlier phase peaked higher"}
    report("checkpoint_io", rows, meta)


if __name__ == "__main__":
    main()
