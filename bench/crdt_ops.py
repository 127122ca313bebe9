"""Run-state CRDT: ops applied per second, memory per 10,000 ops, and sans-IO sync time.

A run of 5 members; `--ops` ops (votes, attestations, checkpoints, spread over the members,
each on top of the writer's heads) are made once, then applied to fresh replicas:

- in causal order (parents first) and in reverse order (everything waits, then cascades);
- again to a replica that already holds them (duplicates: one SHA-256 each, the cache of
  verified op IDs);
- the same ops' Ed25519 verification alone, which bounds the first two rows from above;
- a full sync of all ops from one replica to an empty one through `SyncPuller`/`SyncServer`
  (in memory: the protocol's CPU cost, without a network);
- the same over libp2p: two nodes with `CrdtService` on loopback TCP, the newcomer pulling
  everything on connect (target: 10,000 ops in 5 s or less).

Memory is what `tracemalloc` sees a replica holding after it applied `--ops` ops, scaled to
10,000. Target: 20,000 ops/s applied. Single-threaded; report the CPU time (steadier on a
shared machine) beside the wall time.

    .venv/bin/python bench/crdt_ops.py [--ops 10000] [--repeats 3]
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
from locomesh.protocol import Identity, decode
from locomesh.protocol.envelope import signing_bytes
from locomesh.protocol.runs import sign_manifest

MEMBERS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(5)]
MANIFEST = sign_manifest(MEMBERS[0], task="synthetic", created=0)


def make_history(count: int) -> tuple[Genesis, list[bytes]]:
    """`count` ops of a plausible run, in causal order."""
    genesis = Genesis.from_manifest(MANIFEST)
    source = Replica(genesis)
    ops = [source.create(member, "join", round=1) for member in MEMBERS]
    while len(ops) < count:
        i = len(ops)
        member = MEMBERS[i % len(MEMBERS)]
        if i % 10 == 0:
            round_ = source.state.round + 1
            ops.append(source.create(member, "vote", round=round_, hash=round_.to_bytes(32, "big")))
        elif i % 50 == 1:
            ops.append(source.create(member, "checkpoint", round=source.state.round, id=i.to_bytes(32, "big"), size=i))
        else:
            ops.append(source.create(member, "attest", round=0, id=(i % 7).to_bytes(32, "big"), size=7))
    return genesis, ops


def apply_all(genesis: Genesis, ops: list[bytes]) -> Replica:
    replica = Replica(genesis)
    for data in ops:
        replica.add(data)
    assert len(replica) == len(ops), "every op must apply"
    return replica


def signatures(genesis: Genesis, ops: list[bytes]) -> list[tuple[Ed25519PublicKey, bytes, bytes]]:
    """(public key, signed bytes, signature) of every op, so verification can be timed alone."""
    rows = []
    for data in ops:
        envelope = decode(data, run=genesis.run_id)
        message = signing_bytes(envelope.v, envelope.kind, envelope.run, envelope.author, envelope.body)
        rows.append((Ed25519PublicKey.from_public_bytes(envelope.author), message, envelope.sig))
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

    from locomesh.node.crdt_service import CrdtService
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
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    genesis, ops = make_history(args.ops)
    n = len(ops)
    rows = []

    def row(name: str, wall: float, cpu: float, note: str = "") -> None:
        rows.append({"case": name, "ops": n, "wall_s": wall, "cpu_s": cpu, "ops_per_s_cpu": n / cpu,
                     "us_per_op_cpu": cpu / n * 1e6, "note": note})

    wall, cpu, source = best_of(lambda: apply_all(genesis, ops), args.repeats)
    row("apply, causal order", wall, cpu, "decode + verify + validate + facts")
    wall, cpu, _ = best_of(lambda: apply_all(genesis, ops[::-1]), args.repeats)
    row("apply, reverse order", wall, cpu, "all wait in the pending buffer, then cascade")
    wall, cpu, _ = best_of(lambda: [source.add(data) for data in ops], args.repeats)
    row("duplicates", wall, cpu, "already held: one SHA-256 each")
    table = signatures(genesis, ops)
    wall, cpu, _ = best_of(lambda: [key.verify(sig, message) for key, message, sig in table], args.repeats)
    row("Ed25519 verify alone", wall, cpu, "cryptography, one core: the ceiling of per-op verification")
    wall, cpu, _ = best_of(lambda: sync_all(genesis, source), args.repeats)
    row("sync to an empty replica (in memory)", wall, cpu, "heads/want/ops, 2 MiB batches, both sides")
    wall, cpu = sync_over_libp2p(MANIFEST, ops)
    rows.append({"case": "sync between two nodes, loopback TCP", "ops": n, "wall_s": wall, "cpu_s": cpu,
                 "ops_per_s_cpu": n / cpu, "us_per_op_cpu": cpu / n * 1e6,
                 "note": "libp2p, on connect; both nodes in this process (one core); target <= 5 s"})
    memory = memory_of(genesis, ops)
    meta = {**machine(), "ops": n, "memory_bytes": memory, "memory_MiB_per_10k_ops": memory / n * 10_000 / 2**20,
            "mean_op_bytes": sum(map(len, ops)) / n, "target_ops_per_s": 20_000,
            "note": "2-core machine shared with other jobs; CPU time is this process's"}
    report("crdt_ops", rows, meta)
    print(f"\nmemory: {memory / 2**20:.1f} MiB for {n} ops = {meta['memory_MiB_per_10k_ops']:.1f} MiB per 10,000 ops")


if __name__ == "__main__":
    main()
