"""Codec speed, size and error on pseudo-gradient-like data, one CPU thread.

    .venv/bin/python bench/codec_throughput.py [--numel 16777216] [--repeats 3] [--blocks 1024,256]

For each mode (int8, int8 + error feedback, int4, int4 + error feedback, fp32)
and block size: encode + zstd and decode throughput in MB/s of fp32 input
(numel·4 bytes / CPU seconds of this single-threaded process, best of
`repeats`; the `_wall` columns use wall time, which other processes on a shared
machine stretch), the compression ratio (fp32 bytes /
payload bytes), the relative error of one step ‖x − x̂‖/‖x‖, and after 5 steps
of fresh inputs the relative error of the running sums ‖Σx̂ − Σx‖/‖Σx‖ (where
error feedback shows). Targets: encode ≥ 300 MB/s, decode ≥ 600 MB/s.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from _report import best_of, machine, report
from locomesh.training.codec import Encoder, decode

MODES = [("int8", False), ("int8", True), ("int4", False), ("int4", True), ("fp32", False)]


def pseudo_gradient(numel: int, seed: int) -> np.ndarray:
    """Student-t (df 4) values, scaled per 'layer' (runs of 64K–1M values) by a log-uniform magnitude."""
    rng = np.random.default_rng(seed)
    out = np.empty(numel, dtype=np.float32)
    start = 0
    while start < numel:
        stop = min(numel, start + int(rng.integers(1 << 16, 1 << 20)))
        out[start:stop] = rng.standard_t(4, stop - start) * 10.0 ** rng.uniform(-4, -1)
        start = stop
    return out


def relative(error: np.ndarray, reference: np.ndarray) -> float:
    return float(np.linalg.norm(error.astype(np.float64)) / np.linalg.norm(reference.astype(np.float64)))


def measure(mode: str, feedback: bool, block: int, inputs: list[np.ndarray], repeats: int) -> dict:
    numel = inputs[0].size
    encoder = Encoder(mode, block_size=block, error_feedback=feedback)
    sums = np.zeros(numel, np.float64), np.zeros(numel, np.float64)
    for x in inputs:  # 5 steps of fresh inputs, for the running-sum error
        decoded = decode(encoder.encode(x), numel)
        np.add(sums[0], x, out=sums[0])
        np.add(sums[1], decoded, out=sums[1])
    step_error = relative(inputs[-1] - decoded, inputs[-1])
    x = inputs[0]
    encode_wall, encode_s, payload = best_of(lambda: encoder.encode(x), repeats)
    decode_wall, decode_s, _ = best_of(lambda: decode(payload, numel), repeats)
    return {
        "mode": mode + (" + EF" if feedback else ""),
        "block": block if mode != "fp32" else "-",
        "encode_MBps": numel * 4 / encode_s / 1e6,
        "decode_MBps": numel * 4 / decode_s / 1e6,
        "encode_MBps_wall": numel * 4 / encode_wall / 1e6,
        "decode_MBps_wall": numel * 4 / decode_wall / 1e6,
        "ratio": numel * 4 / len(payload),
        "rel_error_step": step_error,
        "rel_error_sum5": relative(sums[1] - sums[0], sums[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", default="1024", help="comma-separated block sizes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    inputs = [pseudo_gradient(args.numel, seed) for seed in range(5)]
    rows = []
    for block in [int(b) for b in args.blocks.split(",")]:
        for mode, feedback in MODES:
            if mode == "fp32" and block != int(args.blocks.split(",")[0]):
                continue
            rows.append(measure(mode, feedback, block, inputs, args.repeats))
    meta = {"numel": args.numel, "repeats": args.repeats, "threads": 1, **machine()}
    report("codec_throughput", rows, meta)


if __name__ == "__main__":
    main()
