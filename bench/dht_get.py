"""DHT get latency on 16 real TCP hosts on loopback, in one process: py-libp2p's get vs ours.

    .venv/bin/python bench/dht_get.py [--nodes 16] [--seed 0]

Every host is built by `locomesh.node.host.build_host` (TCP, Noise, Yamux, one
connection per peer) and runs a `locomesh.dht.discovery.Discovery` (our
validators on every node); all bootstrap off host 0 and refresh their routing
tables. Each host then publishes one public run manifest, and every host gets
every other host's run by ID. During each get the getter's own copy is set
aside (and put back after), so each get crosses the network; with 16 nodes
and 20 replicas a put reaches every node, so the first peer asked holds the
value. Variants:

* ``py-libp2p get_value``: the stock `KadDHT.get_value` (a FIND_NODE walk, then
  GET_VALUE to every candidate, then write-back to close peers lacking it);
* ``lookup_values``: `LocomeshKadDHT.lookup_values` (GET_VALUE over kept-open
  streams to the closest known peers, returns at the first valid value,
  which it re-validates): 3 asks at once, 1 at a time, and the default
  (3, hedged: the 2nd and 3rd go out only after 50 ms or a miss);

then the default again with every copy but the owner's dropped (a walk of
several hops); and, to show where the time of one get goes, the cost of opening a stream
to a connected peer (multistream-select), of one GET_VALUE round trip on a
kept stream, and of re-validating the value (decode, canonical check,
Ed25519 verify).

All hosts share one Python process and one trio loop: a remote peer's
handling is on the same CPU as the asker, so latencies include both ends.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import AsyncExitStack

import trio
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from locomesh.dht import records
from locomesh.dht.discovery import Discovery
from locomesh.dht.validator import validate
from locomesh.node.host import build_host
from locomesh.protocol import Identity
from locomesh.protocol.runs import run_id, sign_manifest

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

LOOPBACK = Multiaddr("/ip4/127.0.0.1/tcp/0")
SETTLE_SECONDS = 4.0  # staggered first refreshes run within 2 s of bootstrap


async def main(nodes: int, seed: int) -> None:
    rng = random.Random(seed)
    identities = [Identity.from_seed(rng.randbytes(32)) for _ in range(nodes)]
    hosts = [build_host(identity, listen_addrs=[LOOPBACK]) for identity in identities]
    async with AsyncExitStack() as stack:
        for host in hosts:
            stack.push_async_callback(host.close)
            await stack.enter_async_context(host.run(listen_addrs=[LOOPBACK]))
        peers = [
            Discovery(host, identity, rng=random.Random(seed + index))
            for index, (host, identity) in enumerate(zip(hosts, identities))
        ]
        async with trio.open_nursery() as nursery:
            for peer in peers:
                await nursery.start(peer.run)
            await _bootstrap(peers)
            keys = await _publish(peers)
            rows = [await _measure("py-libp2p KadDHT.get_value (before)", peers, keys, _stock_get)]
            for parallelism, hedge_delay in ((3, 0.0), (1, 0.0), (3, peers[0].dht.hedge_delay)):
                for peer in peers:
                    peer.dht.parallelism, peer.dht.hedge_delay = parallelism, hedge_delay
                name = f"lookup_values, parallelism {parallelism}, hedge {hedge_delay * 1000:g} ms (after)"
                rows.append(await _measure(name, peers, keys, _our_get))
            rows.append(await _measure_single_copy(peers, keys))
            rows += [await _stream_open_cost(peers), await _kept_stream_cost(peers, keys), _validation_cost(keys)]
            meta = {
                "nodes": nodes,
                "seed": seed,
                "gets_per_variant": nodes * (nodes - 1),
                "routing_table_sizes": sorted(peer.routing_table_size() for peer in peers),
                "one_process": True,
                "note": "CPU shared with other jobs; one trio loop for all hosts",
                **machine(),
            }
            report("dht_get", rows, meta)
            nursery.cancel_scope.cancel()


async def _bootstrap(peers: list[Discovery]) -> None:
    first = info_from_p2p_addr(peers[0].host.get_addrs()[0])
    for peer in peers[1:]:
        await peer.host.connect(first)
    with trio.fail_after(30):
        for peer in peers:
            await peer.wait_seeded()
    await trio.sleep(SETTLE_SECONDS)


async def _publish(peers: list[Discovery]) -> list[tuple[int, str, bytes]]:
    """Each peer publishes one public run; returns (owner index, key, value)."""
    keys = []
    for index, peer in enumerate(peers):
        manifest = sign_manifest(peer.identity, task="bench", created=int(time.time()), public=True)
        await peer.publish_run(manifest)
        keys.append((index, records.run_key(run_id(manifest)), manifest))
    return keys


async def _stock_get(peer: Discovery, key: str) -> bytes | None:
    return await peer.dht.get_value(key)


async def _our_get(peer: Discovery, key: str) -> bytes | None:
    values = await peer.dht.lookup_values(key, validate=lambda value: validate(key, value, now=time.time()))
    return values[0] if values else None


async def _measure(name: str, peers: list[Discovery], keys, get) -> dict:
    """Every peer gets every other peer's key once, its own copy set aside meanwhile; latencies in ms."""
    latencies, misses = [], 0
    for index, peer in enumerate(peers):
        for owner, key, value in keys:
            if owner == index:
                continue
            store = peer.dht.value_store
            own_copy = store.get(key.encode())
            store.remove(key.encode())
            started = time.perf_counter()
            got = await get(peer, key)
            latencies.append((time.perf_counter() - started) * 1000)
            misses += got != value
            if own_copy is not None:  # put back, so the replicas the next getters find stay the same
                store.put_record(key.encode(), own_copy)
    return {"variant": name, **_summary(latencies), "misses": misses}


async def _measure_single_copy(peers: list[Discovery], keys) -> dict:
    """The default get when only the owner still holds each value (the others dropped theirs): a walk of several hops."""
    for owner, key, _value in keys:
        for index, peer in enumerate(peers):
            if index != owner:
                peer.dht.value_store.remove(key.encode())
    return await _measure("lookup_values, default, only the owner holds it (after)", peers, keys, _our_get)


async def _stream_open_cost(peers: list[Discovery]) -> dict:
    """Opening a Kademlia stream to an already connected peer (multistream-select): what stock gets pay per request."""
    asker, latencies = peers[1], []
    for target in peers[2:]:
        for _ in range(5):
            started = time.perf_counter()
            stream = await asker.host.new_stream(target.host.get_id(), [PROTOCOL_ID])
            latencies.append((time.perf_counter() - started) * 1000)
            await stream.close()
    return {"variant": "open a DHT stream (connected peer)", **_summary(latencies), "misses": 0}


async def _kept_stream_cost(peers: list[Discovery], keys) -> dict:
    """One GET_VALUE request and answer on a kept-open stream: the floor of one get."""
    asker, latencies, misses = peers[1], [], 0
    for owner, key, value in keys:
        if owner == 1:
            continue
        for _ in range(5):
            started = time.perf_counter()
            got, _closer = await asker.dht.pool.get_value(peers[owner].host.get_id(), key.encode())
            latencies.append((time.perf_counter() - started) * 1000)
            misses += got != value
    return {"variant": "one GET_VALUE on a kept stream", **_summary(latencies), "misses": misses}


def _validation_cost(keys) -> dict:
    latencies = []
    for _owner, key, value in keys * 10:
        started = time.perf_counter()
        validate(key, value, now=time.time())
        latencies.append((time.perf_counter() - started) * 1000)
    return {"variant": "re-validate one run record", **_summary(latencies), "misses": 0}


def _summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
        "max_ms": round(ordered[-1], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    trio.run(main, arguments.nodes, arguments.seed)
