"""Checkpoint downloads between real daemons on loopback (child processes), with a lying provider.

The liar is a real libp2p host in this test process with its own handler for
`/locomesh/ckpt/1`: it answers with the true manifest and flipped chunk bytes.
RPC calls to the daemons block, so they run in threads while the liar serves.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import trio
from multiaddr import Multiaddr

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.node.transfer import wire as wire
from locomesh.node.runtime import Node
from locomesh.node.transfer.store import chunk_path, load_checkpoint, read_stored_manifest, write_checkpoint

CHUNK = 16 * 1024
LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def make_checkpoint(directory: Path, seed: int) -> tuple[dict[str, torch.Tensor], bytes]:
    """About 24 chunks of random float32 (incompressible, so each chunk is its own size)."""
    rng = np.random.default_rng(seed)
    tensors = {"w": torch.from_numpy(rng.standard_normal(90_000).astype(np.float32))}
    manifest = write_checkpoint(directory, tensors, {"round": 3, "run": b""}, chunk_size=CHUNK)
    return tensors, manifest.id


def start(directory: Path, log) -> DaemonProcess:
    daemon = DaemonProcess(directory, log=log).start()
    daemon.wait_ready()
    return daemon


def address(daemon: DaemonProcess) -> str:
    return daemon.rpc().call("node.status")["listen_addrs"][0]


def wait_download(daemon: DaemonProcess, checkpoint_id: bytes, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        progress = daemon.rpc().call("checkpoint.progress", {"id": checkpoint_id.hex()})
        if progress["state"] not in ("manifest", "chunks"):
            return progress
        assert time.monotonic() < deadline, f"download not finished in {timeout} s: {progress}"
        time.sleep(0.05)


def lying_handler(node: Node, store: Path):
    """Serve `store`'s checkpoint truthfully, except that every chunk has one byte flipped."""

    async def handle(stream) -> None:
        while (request := await wire.next_request(stream, wire.remote_peer(stream), idle_timeout=30)) is not None:
            manifest = read_stored_manifest(store, request.checkpoint_id)
            if request.index is None:
                await wire.answer(stream, node.identity, wire.OK, manifest.encode(), timeout=30)
                continue
            data = bytearray(chunk_path(store, manifest.chunks[request.index].hash).read_bytes())
            data[len(data) // 2] ^= 0xFF
            await wire.answer(stream, node.identity, wire.OK, bytes(data), timeout=30)

    return handle


@pytest.fixture
def log(tmp_path):
    with open(tmp_path / "daemons.log", "wb") as file:
        yield file


async def test_download_from_three_providers_one_lying(tmp_path, log, identity_factory):
    tensors, checkpoint_id = make_checkpoint(tmp_path / "a" / "checkpoints", seed=1)
    make_checkpoint(tmp_path / "b" / "checkpoints", seed=1)
    make_checkpoint(tmp_path / "liar", seed=1)
    liar = Node.create(identity_factory(66), listen_addrs=LOOPBACK)
    liar.set_stream_handler(wire.PROTOCOL_ID, lying_handler(liar, tmp_path / "liar"), timeout=None)
    daemons = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(liar.run)
            for name in ("a", "b", "downloader"):
                daemons.append(await trio.to_thread.run_sync(start, tmp_path / name, log))
            honest = [await trio.to_thread.run_sync(address, daemon) for daemon in daemons[:2]]
            # The liar comes first: it gives the (true) manifest, so its stream is open and every one of
            # its workers gets a chunk at once. It has no data plane: the download falls back to libp2p.
            providers = [liar.listen_addresses()[0], *honest]
            downloader = daemons[2]
            await trio.to_thread.run_sync(
                lambda: downloader.rpc().call("checkpoint.fetch", {"id": checkpoint_id.hex(), "providers": providers})
            )
            progress = await trio.to_thread.run_sync(wait_download, downloader, checkpoint_id)
            peers = await trio.to_thread.run_sync(lambda: downloader.rpc().call("checkpoint.peers"))
            metrics = await trio.to_thread.run_sync(lambda: downloader.rpc().call("checkpoint.list"))
            liar.request_stop()
    finally:
        for daemon in daemons:
            daemon.stop()

    assert progress["state"] == "done", progress
    assert 0 < progress["seconds"] < 60, "the download's own duration, from its start to the install"
    assert progress["chunks_stored"] == progress["chunks_total"] == progress["chunks_fetched"] - _copies(progress)
    loaded, metadata = load_checkpoint(tmp_path / "downloader" / "checkpoints", checkpoint_id)
    assert torch.equal(loaded["w"], tensors["w"]) and metadata["round"] == 3
    assert metrics == [{"id": checkpoint_id.hex(), "round": 3, "run": "", "chunks": progress["chunks_total"],
                        "raw_size": metrics[0]["raw_size"]}]
    liar_score = peers[liar.peer_id]
    assert liar_score["strikes"] >= 1 and liar_score["score"] < 0 and liar_score["served"] == 0
    assert "does not match its hash" in liar_score["last_strike"]
    # How the honest two share the work depends on timing (the first request loads a provider's store).
    honest_scores = [peers.get(address.rsplit("/", 1)[1], {"strikes": 0, "served": 0}) for address in honest]
    assert [score["strikes"] for score in honest_scores] == [0, 0]
    assert sum(score["served"] for score in honest_scores) == progress["chunks_fetched"]
    assert progress["providers"][liar.peer_id]["stored"] == 0


def _copies(progress: dict) -> int:
    """Endgame copies: chunks fetched twice because a second provider raced a slow one."""
    return progress["chunks_fetched"] - progress["chunks_total"]


def test_an_interrupted_download_resumes_without_fetching_stored_chunks_again(tmp_path, log):
    store = tmp_path / "provider" / "checkpoints"
    tensors, checkpoint_id = make_checkpoint(store, seed=2)
    manifest = read_stored_manifest(store, checkpoint_id)
    # The provider has lost five chunks: the first download stops with those missing.
    held_back = {index: chunk_path(store, manifest.chunks[index].hash) for index in range(5, 10)}
    saved = {index: path.read_bytes() for index, path in held_back.items()}
    for path in held_back.values():
        path.unlink()
    downloader = start(tmp_path / "downloader", log)
    provider = start(tmp_path / "provider", log)
    try:
        request = {"id": checkpoint_id.hex(), "providers": [address(provider)]}
        downloader.rpc().call("checkpoint.fetch", request)
        first = wait_download(downloader, checkpoint_id)
        assert first["state"] == "failed" and "chunk 5" in first["error"]
        assert first["chunks_stored"] == len(manifest.chunks) - 5
        with pytest.raises(Exception, match="missing-manifest|manifest"):
            load_checkpoint(tmp_path / "downloader" / "checkpoints", checkpoint_id)  # not installed yet

        # The provider goes away, gets its chunks back, and comes back on a new port.
        assert provider.stop() == 0
        for index, path in held_back.items():
            path.write_bytes(saved[index])
        provider = start(tmp_path / "provider", log)
        request = {"id": checkpoint_id.hex(), "providers": [address(provider)]}
        downloader.rpc().call("checkpoint.fetch", request)
        second = wait_download(downloader, checkpoint_id)
        served = provider.rpc().call("node.status")["checkpoints"]["chunks_served"]
        # Installed now: fetching it again needs no provider at all.
        assert provider.stop() == 0
        downloader.rpc().call("checkpoint.fetch", request)
        assert wait_download(downloader, checkpoint_id)["state"] == "done"
    finally:
        downloader.stop()
        provider.stop()
    assert second["state"] == "done", second
    assert second["chunks_fetched"] == 5 and served == 5
    loaded, _ = load_checkpoint(tmp_path / "downloader" / "checkpoints", checkpoint_id)
    assert torch.equal(loaded["w"], tensors["w"])


@pytest.mark.slow
def test_a_provider_killed_mid_download_is_survived_and_the_download_resumes(tmp_path, log):
    store = tmp_path / "provider" / "checkpoints"
    values = np.random.default_rng(3).standard_normal(400 * CHUNK // 4).astype(np.float32)
    manifest = write_checkpoint(store, {"w": torch.from_numpy(values)}, {"round": 1, "run": b""}, chunk_size=CHUNK)
    downloader = start(tmp_path / "downloader", log)
    provider = start(tmp_path / "provider", log)
    try:
        # One libp2p stream and an fsync per chunk: hundreds of chunks take seconds, time to pull the plug.
        request = {"id": manifest.id.hex(), "providers": [address(provider)], "streams": 1, "transport": "libp2p"}
        downloader.rpc().call("checkpoint.fetch", request)
        deadline = time.monotonic() + 60
        while downloader.rpc().call("checkpoint.progress", {"id": manifest.id.hex()})["chunks_stored"] < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        provider.process.kill()
        provider.wait()
        first = wait_download(downloader, manifest.id)
        assert first["state"] == "failed" and 20 <= first["chunks_stored"] < len(manifest.chunks), first

        provider = start(tmp_path / "provider", log)
        request = {"id": manifest.id.hex(), "providers": [address(provider)]}
        downloader.rpc().call("checkpoint.fetch", request)
        second = wait_download(downloader, manifest.id)
        served = provider.rpc().call("node.status")["checkpoints"]["chunks_served"]
    finally:
        downloader.stop()
        provider.stop()
    assert second["state"] == "done", second
    # Only what the first run had not stored was asked for again.
    assert second["chunks_fetched"] == served == len(manifest.chunks) - first["chunks_stored"]
    loaded, _ = load_checkpoint(tmp_path / "downloader" / "checkpoints", manifest.id)
    assert torch.equal(loaded["w"], torch.from_numpy(values))
