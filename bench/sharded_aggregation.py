"""One peer's outer-step work and bytes per round: allgather against sharded exchange, back to back.

    .venv/bin/python bench/sharded_aggregation.py [--numel 25300000] [--members 8,16] [--byzantine-fraction 0.333]

For each group size N: N int8 payloads of `--numel` values (a common direction plus noise, error
feedback off), and the same payloads cut into N shards. Then, for one peer, both timed from the
same state:

- allgather: `OuterStep.step` on all N payloads (decode, validate, CenteredClip, cap, Nesterov);
- sharded: the committee plan for N (`node/exchange/committees.py`: fewer than a third Byzantine,
  a wrong result standing with probability ≤ 1e-6) and this peer's seats (`committees.shard_committees`);
  it checks each shard it receives against its author's Merkle root, aggregates its seats' shards
  and the shards it verifies (`shards.aggregate_shard`), takes the other shards' results as
  float32 bytes checked against their signed hashes, and applies the assembled aggregate.

Bytes per peer and round, as the exchange would move them: allgather downloads the N − 1 other
payloads and uploads its own to each of them; sharded downloads the other authors' shards for its
seats and checks, and the float32 results of the shards it did not compute, and uploads its shards
to their committees and to the expected verifiers, and its results to the peers that fetch them.
This is the outer step's CPU and the transfer volume; the network itself (bench/round_exchange.py)
is measured once the daemons exchange shards.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, report

from locomesh.node.exchange.committees import plan, shard_committees

from locomesh.training.codec import encode, split_payload
from locomesh.training.outer import OuterStep
from locomesh.training.shards import ShardedPayload, ShardLayout, aggregate_shard, check_shard, shard_result_hash

MB = 1e6


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=25_300_000)
    parser.add_argument("--members", default="8,16")
    parser.add_argument("--byzantine-fraction", type=float, default=1 / 3)
    return parser.parse_args()


def payloads(members: int, numel: int, layout: ShardLayout) -> tuple[dict[bytes, bytes], dict[bytes, ShardedPayload]]:
    """Each author's payload in both forms: whole (allgather) and cut into shards (the same values)."""
    rng = np.random.default_rng(members)
    common = rng.standard_normal(numel, dtype=np.float32)
    whole, sharded = {}, {}
    for index in range(members):
        delta = rng.standard_normal(numel, dtype=np.float32)
        np.add(np.multiply(delta, np.float32(0.3), out=delta), common, out=delta)
        author = index.to_bytes(32, "big")
        whole[author] = encode(delta)
        sharded[author] = ShardedPayload(split_payload(whole[author], numel, layout.bounds))
    return whole, sharded


def measure(members: int, args: argparse.Namespace) -> dict:
    numel = args.numel
    layout = ShardLayout(numel, -(-numel // members))
    whole_payloads, sent = payloads(members, numel, layout)
    authors = sorted(sent)
    me = authors[0]
    rng = np.random.default_rng(1)
    theta, previous = rng.standard_normal(numel, dtype=np.float32), rng.standard_normal(numel, dtype=np.float32)
    chosen = plan(members, byzantine_fraction=args.byzantine_fraction, shards=layout.count)
    committees = shard_committees(1, b"certified hash + proposal", frozenset(authors), layout.count, chosen.committee)
    seats = [s for s, committee in enumerate(committees) if me in committee]
    checks = random.Random(2).sample(
        [s for s in range(layout.count) if s not in seats], min(chosen.verified, layout.count - len(seats))
    )
    published = published_results(theta, previous, layout, sent)

    allgather = OuterStep(theta, previous_aggregate=previous)
    started = time.process_time()
    whole = allgather.step(whole_payloads)
    allgather_cpu = time.process_time() - started

    sharded = OuterStep(theta, previous_aggregate=previous)
    started = time.process_time()
    g = np.empty(numel, dtype=np.float32)
    for index, (start, stop) in enumerate(layout.bounds):
        if index in seats or index in checks:
            shards = {}
            for author in authors:
                shard = sent[author].shards[index]
                check_shard(shard, index, layout, sent[author].root, sent[author].proof(index), codec="int8")
                shards[author] = shard
            values, _, _ = aggregate_shard(sharded, layout, index, shards, out=g[start:stop])
            assert shard_result_hash(1, index, values) == published[index][0]
        else:
            fetched, signed = published[index][1], published[index][0]
            values = np.frombuffer(fetched, dtype="<f4")
            if shard_result_hash(1, index, values) != signed:
                raise AssertionError("a published result does not match its signed hash")
            g[start:stop] = values
    result = sharded.apply_aggregate(g, authors, {})
    sharded_cpu = time.process_time() - started
    if result.params_hash == whole.params_hash:
        raise AssertionError("CenteredClip per shard should differ from the whole vector's")

    payload = len(whole_payloads[me])
    mine = set(seats) | set(checks)
    others = [a for a in authors if a != me]
    down_sharded = (sum(len(sent[a].shards[s]) for s in mine for a in others)
                    + sum(4 * layout.size(s) for s in range(layout.count) if s not in mine))
    honest = members - chosen.byzantine
    expected_checkers = (honest - 1) * chosen.verified / layout.count
    up_sharded = sum(len(sent[me].shards[s]) * (len(committees[s]) - (me in committees[s]) + expected_checkers)
                     for s in range(layout.count))
    up_sharded += sum(4 * layout.size(s) * (members - len(committees[s])) / len(committees[s]) for s in seats)
    return {
        "members": members,
        "shards": layout.count,
        "committee": chosen.committee,
        "verified": chosen.verified,
        "miss_probability": f"{chosen.miss_probability:.1e}",
        "seats": len(seats),
        "payload_MB": round(payload / MB, 2),
        "allgather_cpu_s": round(allgather_cpu, 3),
        "sharded_cpu_s": round(sharded_cpu, 3),
        "cpu_ratio": round(sharded_cpu / allgather_cpu, 3),
        "allgather_down_MB": round(sum(len(whole_payloads[a]) for a in others) / MB, 1),
        "sharded_down_MB": round(down_sharded / MB, 1),
        "allgather_up_MB": round(payload * len(others) / MB, 1),
        "sharded_up_MB": round(up_sharded / MB, 1),
    }


def published_results(theta, previous, layout, sent) -> dict[int, tuple[bytes, bytes]]:
    """What the committees publish (computed here, untimed): per shard, the signed hash and the values."""
    committee_view = OuterStep(theta, previous_aggregate=previous)
    results = {}
    for index in range(layout.count):
        values, _, _ = aggregate_shard(committee_view, layout, index, {a: p.shards[index] for a, p in sent.items()})
        results[index] = (shard_result_hash(1, index, values), values.astype("<f4").tobytes())
    return results


def main() -> None:
    args = parse_args()
    rows = [measure(int(n), args) for n in args.members.split(",")]
    meta = {**machine(), "numel": args.numel, "codec": "int8, block 1024", "aggregator": "centered_clip",
            "byzantine_fraction": args.byzantine_fraction, "target": "a wrong result stands with p <= 1e-6",
            "threads": 1, "cpu": "2 cores shared with other jobs; cpu_s is this process's own CPU time"}
    report("sharded_aggregation", rows, meta)


if __name__ == "__main__":
    main()
