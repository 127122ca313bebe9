"""Every aggregator on k contributions of N float32 values, one CPU thread.

    .venv/bin/python bench/aggregator_throughput.py [--numel 16777216] [--contributions 16] [--only a,b]
        [--rows float32,int8]

Reports wall and CPU seconds (best of `--repeats`; on a shared machine CPU time
is the steadier one), MB/s of fp32 input (k·N·4 bytes / CPU second) and the CPU
time relative to the plain mean. CenteredClip runs three times: centred on a
previous aggregate (every round after the first), the same with a quarter of the
contributions replaced by far attackers (then it runs all its iterations instead
of stopping after one), and on the coordinate median (the first round).
Target: CenteredClip (with a previous aggregate) ≤ 5× the mean.

`--rows` picks the form the contributions are read in: `float32` vectors, or `int8`, the
payloads an outer step aggregates (int8 codes and block scales, `codec.QuantizedRow`,
dequantized slab by slab as the aggregator reads them: a quarter of the memory). For `int8`
the rows are the int8 encodings of the same vectors; every case runs for each form, back to
back, and `x_float32_cpu` is its CPU time relative to the same case on float32 rows.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from _report import best_of, machine, report
from locomesh.training.aggregators import aggregate
from locomesh.training.codec import decode_row, encode


def cases(k: int, previous: np.ndarray) -> list[tuple[str, str, dict]]:
    f = max(0, (k - 3) // 2)
    return [
        ("mean", "mean", {}),
        ("centered_clip (previous)", "centered_clip", {"previous": previous}),
        (f"centered_clip (previous, {k // 4} attackers)", "centered_clip", {"previous": previous}),
        ("centered_clip (median centre)", "centered_clip", {}),
        ("coordinate_median", "coordinate_median", {}),
        ("trimmed_mean β=0.2", "trimmed_mean", {"beta": 0.2}),
        ("geometric_median", "geometric_median", {}),
        (f"krum f={f}", "krum", {"f": f}),
        (f"multi_krum f={f} m={k - f}", "multi_krum", {"f": f, "m": k - f}),
    ]


def contributions(k: int, numel: int) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray]]:
    """Honest rows (a common vector plus independent noise), a previous aggregate like them, and the
    same rows with the last k/4 replaced by colluding attackers at −100 × the common vector: the
    outliers that make CenteredClip run all its iterations (its worst case for time)."""
    rng = np.random.default_rng(0)
    common = rng.standard_normal(numel, dtype=np.float32)
    rows = []
    for _ in range(k):
        row = rng.standard_normal(numel, dtype=np.float32)
        np.add(row, common, out=row)
        rows.append(row)
    previous = rng.standard_normal(numel, dtype=np.float32)
    np.add(previous, common, out=previous)
    attacker = np.multiply(common, np.float32(-100.0))
    attacked = rows[: k - k // 4] + [attacker] * (k // 4)
    return rows, previous, attacked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--contributions", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated labels' first words to run (mean always runs)")
    parser.add_argument("--rows", default="float32", help="comma-separated row forms: float32, int8 (default float32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    forms = [form for form in args.rows.split(",") if form]
    if not forms or set(forms) - {"float32", "int8"}:
        parser.error("--rows takes float32 and/or int8")
    rows, previous, attacked = contributions(args.contributions, args.numel)
    inputs = {"float32": (rows, attacked)}
    if "int8" in forms:
        inputs["int8"] = tuple([decode_row(encode(row), args.numel) for row in group] for group in (rows, attacked))
    keys = [i.to_bytes(4, "big") for i in range(len(rows))]
    wanted = {word for word in args.only.split(",") if word}
    results, mean_cpu, float32_cpu = [], {}, {}
    for label, name, options in cases(len(rows), previous):
        if wanted and name not in wanted and name != "mean":
            continue
        for form in forms:
            honest, attacked_rows = inputs[form]
            given = attacked_rows if "attackers" in label else honest
            wall, cpu, _ = best_of(lambda: aggregate(name, given, keys=keys, **options), args.repeats)
            mean_cpu.setdefault(form, cpu)
            if form == "float32":
                float32_cpu[label] = cpu
            results.append(
                {
                    "aggregator": label,
                    "rows": form,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "MBps_cpu": len(rows) * args.numel * 4 / cpu / 1e6,
                    "x_mean_cpu": cpu / mean_cpu[form],
                    "x_float32_cpu": cpu / float32_cpu[label] if label in float32_cpu else None,
                }
            )
    meta = {"numel": args.numel, "contributions": len(rows), "repeats": args.repeats, "threads": 1, **machine()}
    report("aggregator_throughput", results, meta)


if __name__ == "__main__":
    main()
