"""Checkpoint download speed on loopback: one libp2p stream, N libp2p streams, the sealed data plane.

    .venv/bin/python bench/checkpoint_download.py [--mb 128] [--streams 8] [--repeats 1]

A provider daemon holds a checkpoint of random float32 (nearly incompressible,
4 MiB chunks). Two kinds of rows:

* ``scope=transfer``: this process is a second real libp2p host; it pulls every
  chunk from the daemon over `ProviderSession`s (the download's own client
  code) and checks each chunk's SHA-256, but stores nothing. This is the bulk
  transfer rate between two hosts in separate processes.
* ``scope=download``: a downloader daemon fetches the checkpoint over RPC
  (`checkpoint.fetch`) and the time is the downloader's own (`checkpoint.progress`
  ``seconds``: from the start of the download to the manifest's install). End
  to end: requests, transfer, SHA-256, and an atomic, fsynced write of every
  chunk and of the manifest. The bench polls the progress every 0.1 s: polls
  every 10 ms, timed from outside, cost the downloader's event loop a few
  percent and the row its precision.
  The downloader's store is emptied between runs.

Both daemons load their store module (torch) before any clock starts.

The machine's CPU is shared with other work while this runs: figures vary
from run to run; the table keeps the best of `--repeats`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trio
from multiaddr import Multiaddr

from _report import machine, report  # bench/ is on sys.path when this file runs as a script

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.node.transfer.download import ProviderSession
from locomesh.node.runtime import Node
from locomesh.protocol import Identity
from locomesh.node.transfer.store import write_checkpoint
from locomesh.training.checkpoint_manifest import verify_chunk

MB = 1e6


def fetch_seconds(downloader: DaemonProcess, checkpoint_id: str, provider: str, streams: int, transport: str) -> float:
    store = downloader.data_dir / "checkpoints"
    shutil.rmtree(store, ignore_errors=True)
    rpc = downloader.rpc(timeout=30)
    params = {"id": checkpoint_id, "providers": [provider], "streams": streams, "transport": transport}
    rpc.call("checkpoint.fetch", params)
    while (progress := rpc.call("checkpoint.progress", {"id": checkpoint_id}))["state"] in ("manifest", "chunks"):
        time.sleep(0.1)
    if progress["state"] != "done":
        raise RuntimeError(f"download failed: {progress}")
    return progress["seconds"]


def transfer_seconds(address: str, manifest, streams: int, transport: str) -> float:
    """Pull every chunk over `streams` sessions of `transport` from this process, verifying each; the seconds."""

    async def pull() -> float:
        node = Node.create(Identity.generate(), listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")])
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            provider = Multiaddr(address)
            peer_id = provider.value_for_protocol("p2p")
            await node.connect(provider)
            sessions = [ProviderSession(node, peer_id, provider, transport) for _ in range(streams)]
            await sessions[0].ask(manifest.id, None, max_size=2**23)  # the handshake and warm-up, off the clock
            started = trio.current_time()
            async with trio.open_nursery() as workers:
                for worker, session in enumerate(sessions):
                    workers.start_soon(pull_share, session, range(worker, len(manifest.chunks), streams))
            elapsed = trio.current_time() - started
            for session in sessions:
                await session.close()
            node.request_stop()
        return elapsed

    async def pull_share(session: ProviderSession, indices: range) -> None:
        for index in indices:
            reply = await session.ask(manifest.id, index, max_size=manifest.chunks[index].size)
            await trio.to_thread.run_sync(verify_chunk, manifest, index, reply.payload)
        if session.transport != transport:
            raise RuntimeError(f"the session fell back to {session.transport}")

    return trio.run(pull)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="checkpoint size in MB (float32 values)")
    parser.add_argument("--streams", type=int, default=8, help="parallel streams for the second row")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--transports", default="libp2p,dataplane")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    try:
        values = np.random.default_rng(0).standard_normal(args.mb * 250_000).astype(np.float32)
        manifest = write_checkpoint(root / "provider" / "checkpoints", {"w": torch.from_numpy(values)},
                                    {"round": 1, "run": b""})
        size = sum(chunk.size for chunk in manifest.chunks)
        with open(root / "daemons.log", "wb") as log, \
                DaemonProcess(root / "provider", log=log) as provider, \
                DaemonProcess(root / "downloader", log=log) as downloader:
            provider.wait_ready()
            downloader.wait_ready()
            address = provider.rpc().call("node.status")["listen_addrs"][0]
            for daemon in (provider, downloader):
                daemon.rpc(timeout=60).call("checkpoint.list")  # loads the store module (torch) off the clock
            plans = [("libp2p", 1), ("libp2p", args.streams)]
            plans += [(transport, n) for transport in args.transports.split(",") if transport != "libp2p"
                      for n in (1, args.streams)]
            rows = []
            for scope, measure in (("transfer", lambda t, n: transfer_seconds(address, manifest, n, t)),
                                   ("download", lambda t, n: fetch_seconds(downloader, manifest.id.hex(), address, n, t))):
                first = len(rows)
                for transport, streams in plans:
                    seconds = min(measure(transport, streams) for _ in range(args.repeats))
                    rows.append({"scope": scope, "transport": transport, "streams": streams, "MB": round(size / MB, 1),
                                 "seconds": round(seconds, 3), "MB_per_s": round(size / MB / seconds, 1)})
                for row in rows[first:]:
                    row["vs_one_stream"] = round(row["MB_per_s"] / rows[first]["MB_per_s"], 2)
        report("checkpoint_download", rows, {
            **machine(), "chunks": len(manifest.chunks), "chunk_MiB": manifest.chunk_size / 2**20,
            "load_avg_1min": os.getloadavg()[0],
            "note": "loopback, 2 CPU cores shared with other work while it ran; figures vary between runs",
        })
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
