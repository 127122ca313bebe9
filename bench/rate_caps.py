"""Rate caps measured on loopback: a 10 MB/s cap on the data plane and on a libp2p stream, both directions.

Two nodes in this process, on 127.0.0.1. For each transport, the sender's upload is capped, then
(another pair of nodes) the receiver's download; a row without a cap shows the cap is what binds.
On the data plane the provider sends (sealed 1 MiB frames) and the asker receives; on libp2p one
stream of 64 KiB writes. `payload_MBps` is the bytes delivered over the time from the first write
to the last byte read; `wire_MBps` what passed the capped bucket (Noise, Yamux and frame overhead
included) over the same time. Expected under a cap: 0.9-1.1 times the cap.

    .venv/bin/python bench/rate_caps.py [--cap 10MB/s --cap 2.5MB/s] [--seconds 2.5]

A cap above what the transport carries on the machine uncapped does not bind: on a small shared
machine py-libp2p (Noise and Yamux in Python, both ends in this one process) moves less than
10 MB/s, so the lower cap is the one that shows the libp2p pacing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio
from multiaddr import Multiaddr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, report

from locomesh.node.config import parse_rate
from locomesh.node.runtime import Node
from locomesh.node.transfer.dataplane import DataPlaneServer, open_sealed_stream
from locomesh.protocol import Identity

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
SINK_PROTOCOL = "/locomesh-bench/sink/1"
FRAME = 1024 * 1024
WRITE = 64 * 1024
MB = 1_000_000


def identity(index: int) -> Identity:
    return Identity.from_seed(index.to_bytes(4, "big") * 8)


class Sink:
    """The receiving end: reads until `size` bytes came, notes when the last one did."""

    def __init__(self, size: int) -> None:
        self.size, self.received, self.done, self.end = size, 0, trio.Event(), 0.0

    async def __call__(self, stream, *_: object) -> None:
        while self.received < self.size and (data := await stream.read(WRITE)):
            self.received += len(data)
        self.end = time.perf_counter()
        self.done.set()


async def libp2p_transfer(nursery: trio.Nursery, sender: Node, receiver: Node, sink: Sink) -> float:
    """`sink.size` bytes on one libp2p stream, in `WRITE`-byte writes; when the first write began."""
    receiver.set_stream_handler(SINK_PROTOCOL, sink, timeout=None)
    await sender.connect(Multiaddr(receiver.listen_addresses()[0]))
    stream = await sender.open_stream(receiver.peer_id, [SINK_PROTOCOL])
    piece, started = bytes(WRITE), time.perf_counter()
    for _ in range(sink.size // WRITE):
        await stream.write(piece)
    return started


async def dataplane_transfer(nursery: trio.Nursery, sender: Node, receiver: Node, sink: Sink) -> float:
    """`sink.size` bytes in `FRAME`-byte sealed frames: the sender serves, the receiver asks (on the
    data plane the provider sends and the asker receives); when the first frame began."""
    started: list[float] = []

    async def serve(sealed, _peer: str) -> None:
        await sealed.read()  # the asker's "go"
        started.append(time.perf_counter())
        payload = bytes(FRAME)
        for _ in range(sink.size // FRAME):
            await sealed.write(payload)
        await sink.done.wait()

    await nursery.start(DataPlaneServer("127.0.0.1", serve).run, sender)
    await receiver.connect(Multiaddr(sender.listen_addresses()[0]))
    sealed = await open_sealed_stream(receiver, sender.peer_id)
    sealed.limit_frames(2 * FRAME)
    await sealed.write(b"go")
    await sink(sealed)
    return started[0]


TRANSFERS = {"libp2p": (libp2p_transfer, WRITE), "dataplane": (dataplane_transfer, FRAME)}


async def measure(transport: str, capped: str, cap: int, size: int, seed: int) -> dict:
    """Move about `size` bytes from a sender to a receiver node over `transport`, `capped` ("upload":
    the sender's, "download": the receiver's, "none") at `cap` bytes per second."""
    sender = Node.create(identity(seed), listen_addrs=LOOPBACK)
    receiver = Node.create(identity(seed + 1), listen_addrs=LOOPBACK)
    bucket = {"upload": sender.meter.bandwidth.upload, "download": receiver.meter.bandwidth.download}.get(capped)
    if bucket is not None:
        bucket.set_rate(cap)
    transfer, piece = TRANSFERS[transport]
    sink = Sink(size // piece * piece)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        await nursery.start(receiver.run)
        before = bucket.total if bucket is not None else 0
        with trio.fail_after(600):
            started = await transfer(nursery, sender, receiver, sink)
            await sink.done.wait()
        elapsed = sink.end - started
        wire = bucket.total - before if bucket is not None else None
        nursery.cancel_scope.cancel()
    return {
        "transport": transport, "capped": capped, "cap_MBps": cap / MB if bucket is not None else 0,
        "MB": sink.received / MB, "seconds": round(elapsed, 3), "payload_MBps": sink.received / elapsed / MB,
        "wire_MBps": wire / elapsed / MB if wire is not None else None,
    }


async def main(caps: list[int], seconds: float) -> list[dict]:
    """Each transport under each cap, both directions, moving `seconds` worth at the cap; then uncapped."""
    rows = []
    seed = 100
    for transport in ("dataplane", "libp2p"):
        for cap in caps:
            for capped in ("upload", "download"):
                rows.append(await measure(transport, capped, cap, int(cap * seconds), seed))
                seed += 2
        rows.append(await measure(transport, "none", 0, int(max(caps) * seconds), seed))
        seed += 2
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", action="append", help="a cap to measure (repeatable; default 10MB/s and 2.5MB/s)")
    parser.add_argument("--seconds", type=float, default=2.5, help="how long each capped transfer should take")
    arguments = parser.parse_args()
    caps = [parse_rate(text) for text in arguments.cap or ["10MB/s", "2.5MB/s"]]
    rows = trio.run(main, caps, arguments.seconds)
    report("rate_caps", rows, meta={**machine(), "caps_bytes_per_s": caps, "seconds_at_cap": arguments.seconds})
