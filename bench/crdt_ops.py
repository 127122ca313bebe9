"""Run-state CRDT: ops applied per second, memory per 10,000 ops, and sync time.

A run of 5 members; `--ops` ops (votes, attestations, checkpoints, spread over the members) are
made once, then applied to fresh replicas. Each member writes its ops in *batches*: a batch is
up to `--per-seal` consecutive ops by one author, each on top of the one before, sealed with one
Ed25519 signature over the Merkle root of their IDs (`Replica.create_batch`, crdt/seal.py); each
op carries the signature and its Merkle path, and a replica verifies the signature once per batch
(the other ops of the batch cost a few SHA-256). `--per-seal 1` is one signature per op, the
cost when every op is written on its own (how a node writes its few ops per round today).

Rows:
- apply in causal order (parents first) and in reverse order (everything waits, then cascades),
  for the batched history, and in causal order for a history with one seal per op;
- the same ops again to a replica that already holds them (duplicates: parse + one SHA-256);
- Ed25519 verification alone, one signature per op: the ceiling of one-signature-per-op;
- a full sync from one replica to an empty one through `SyncPuller`/`SyncServer` (in memory:
  the protocol's CPU cost, without a network);
- the same over libp2p: two nodes with `CrdtService` on loopback TCP, the newcomer pulling
  everything on connect (target: 10,000 ops in 5 s or less).

Memory is what `tracemalloc` sees a replica holding after it applied `--ops` ops, scaled to
10,000. Target: 20,000 ops/s applied. Single-threaded; report the CPU time (steadier on a
shared machine) beside the wall time.

    .venv/bin/python bench/crdt_ops.py [--ops 10000] [--per-seal 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from _report import best_of, machine, report  # bench/ is on sys.path when this file runs as a script
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from locomesh.crdt import Genesis, Replica
from locomesh.crdt.sync import SyncPuller, SyncServer
from locomesh.crdt.seal import seal_message
from locomesh.protocol import Identity
from locomesh.protocol.runs import sign_manifest

MEMBERS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(5)]
MANIFEST = sign_manifest(MEMBERS[0], task="synthetic", created=0)


def make_history(count: int, per_seal: int) -> tuple[Genesis, list[bytes]]:
    """`count` ops of a plausible run, in causal order; members take turns writing `per_seal` ops."""
    genesis = Genesis.from_manifest(MANIFEST)
    source = Replica(genesis)
    ops = [source.create(member, "join", round=1) for member in MEMBERS]
    turn = 0
    while len(ops) < count:
        member = MEMBERS[turn % len(MEMBERS)]
        written = turn // len(MEMBERS) * per_seal  # ops this member wrote before this batch
        specs = [_op_spec(len(ops) + k, written + k) for k in range(min(per_seal, count - len(ops)))]
        ops += source.create_batch(member, specs)
        turn += 1
    return genesis, ops


def _op_spec(i: int, own: int) -> tuple[str, dict]:
    """The i-th op of the history, the `own`-th of its author: a vote one in 10, a checkpoint one in
    50, else an attestation. An author's ops name a round four at a time (crdt/limits.py caps what
    one author writes per round), and every member votes the same hash for a round."""
    round_ = own // 4 + 1
    if i % 10 == 0 and own % 4 == 0:
        return "vote", {"round": round_, "hash": round_.to_bytes(32, "big")}
    if i % 50 == 1:
        return "checkpoint", {"round": round_, "id": i.to_bytes(32, "big"), "size": i}
    return "attest", {"round": round_, "id": (i % 7).to_bytes(32, "big"), "size": 7}


def apply_all(genesis: Genesis, ops: list[bytes]) -> Replica:
    replica = Replica(genesis)
    for data in ops:
        replica.add(data)
    assert len(replica) == len(ops), "every op must apply"
    return replica


def signatures(count: int) -> list[tuple[Ed25519PublicKey, bytes, bytes]]:
    """(public key, signed bytes, signature) for `count` op-sized messages, so verification can be timed alone."""
    rows = []
    for i in range(count):
        member = MEMBERS[i % len(MEMBERS)]
        message = seal_message(MANIFEST[:32], 1, i.to_bytes(32, "big"))
        rows.append((Ed25519PublicKey.from_public_bytes(member.public_key), message, member.sign(message)))
    return rows


def sync_all(genesis: Genesis, source: Replica) -> Replica:
    fresh = Replica(genesis)
    puller, server = SyncPuller(fresh, MEMBERS[1], max_batches=10_000), SyncServer(source, MEMBERS[0])
    request = puller.start()
    while request is not None:
        request = puller.receive(server.answer(request).reply)
    assert fresh.op_ids() == source.op_ids()
    return fresh


def sync_over_libp2p(manifest: bytes, ops: list[bytes]) -> tuple[float, float]:
    """(wall, CPU) seconds from a newcomer opening the run until it holds all `ops`, pulled from a node that
    has them, over loopback TCP (Noise, Yamux). Both nodes run in this one process and trio loop,
    so they share one core: a pessimistic figure for two daemons on two cores."""
    import trio
    from multiaddr import Multiaddr

    from locomesh.node.replication.service import CrdtService
    from locomesh.node.runtime import Node

    loopback = [Multiaddr("/ip4/127.0.0.1/tcp/0")]

    async def measure() -> float:
        async with trio.open_nursery() as nursery:
            first = Node.create(MEMBERS[0], listen_addrs=loopback, services=[holder := CrdtService()])
            await nursery.start(first.run)
            replica = await holder.open_run(manifest)
            for data in ops:
                replica.add(data)
            second = Node.create(MEMBERS[1], listen_addrs=loopback, services=[newcomer := CrdtService()],
                                 bootstrap=[Multiaddr(first.listen_addresses()[0])])
            await nursery.start(second.run)
            with trio.fail_after(60):
                while first.peer_id not in second.peers:
                    await trio.sleep(0.01)
                start, cpu_start = trio.current_time(), time.process_time()
                copy = await newcomer.open_run(manifest)
                while len(copy) < len(ops):
                    await trio.sleep(0.01)
            elapsed = (trio.current_time() - start, time.process_time() - cpu_start)
            first.request_stop()
            second.request_stop()
            return elapsed

    return trio.run(measure)


def memory_of(genesis: Genesis, ops: list[bytes]) -> int:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    replica = apply_all(genesis, ops)
    _ = replica.state
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--per-seal", type=int, default=64, help="ops per batch (one signature each)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    genesis, ops = make_history(args.ops, args.per_seal)
    _, single = make_history(args.ops, 1)
    n, batch = len(ops), f"batches of {args.per_seal}"
    rows = []

    def row(name: str, wall: float, cpu: float, note: str = "") -> None:
        rows.append({"case": name, "ops": n, "wall_s": wall, "cpu_s": cpu, "ops_per_s_cpu": n / cpu,
                     "us_per_op_cpu": cpu / n * 1e6, "note": note})

    wall, cpu, source = best_of(lambda: apply_all(genesis, ops), args.repeats)
    row(f"apply, causal order, {batch}", wall, cpu, "parse + checks + seal (1 verify per batch) + facts")
    wall, cpu, _ = best_of(lambda: apply_all(genesis, ops[::-1]), args.repeats)
    row(f"apply, reverse order, {batch}", wall, cpu, "all wait in the pending buffer, then cascade")
    wall, cpu, _ = best_of(lambda: apply_all(genesis, single), args.repeats)
    row("apply, causal order, one seal per op", wall, cpu, "one Ed25519 verify per op")
    wall, cpu, _ = best_of(lambda: [source.add(data) for data in ops], args.repeats)
    row("duplicates", wall, cpu, "already held: parse + one SHA-256 each")
    table = signatures(n)
    wall, cpu, _ = best_of(lambda: [key.verify(sig, message) for key, message, sig in table], args.repeats)
    row("Ed25519 verify alone, one per op", wall, cpu, "cryptography, one core: the ceiling of per-op signatures")
    wall, cpu, _ = best_of(lambda: sync_all(genesis, source), args.repeats)
    row(f"sync to an empty replica (in memory), {batch}", wall, cpu, "heads/want/ops, 2 MiB batches, both sides")
    wall, cpu = sync_over_libp2p(MANIFEST, ops)
    rows.append({"case": f"sync between two nodes, loopback TCP, {batch}", "ops": n, "wall_s": wall, "cpu_s": cpu,
                 "ops_per_s_cpu": n / cpu, "us_per_op_cpu": cpu / n * 1e6,
                 "note": "libp2p, on connect; both nodes in this process (one core); target <= 5 s"})
    memory = memory_of(genesis, ops)
    meta = {**machine(), "ops": n, "per_seal": args.per_seal, "memory_bytes": memory,
            "memory_MiB_per_10k_ops": memory / n * 10_000 / 2**20, "mean_op_bytes": sum(map(len, ops)) / n,
            "target_ops_per_s": 20_000, "note": "2-core machine shared with other jobs; CPU time is this process's"}
    report("crdt_ops", rows, meta)
    print(f"\nmemory: {memory / 2**20:.1f} MiB for {n} ops = {meta['memory_MiB_per_10k_ops']:.1f} MiB per 10,000 ops")


if __name__ == "__main__":
    main()
