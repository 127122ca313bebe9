"""Idle data plane streams kept for the next download from the same provider (node/stream_pool.py)."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing
from multiaddr import Multiaddr

from locomesh.node.transfer import download as checkpoint_download
from locomesh.node.transfer.download import DownloadProgress, download_checkpoint
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.peer_scores import PeerScores
from locomesh.node.runtime import Node
from locomesh.node.stream_pool import StreamPool
from locomesh.node.transfer.store import write_checkpoint

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_the_newest_idle_stream_is_taken_and_stale_ones_are_closed(clock):
    pool = StreamPool(idle_seconds=10.0, per_peer=8)
    old, newer, newest = FakeStream("old"), FakeStream("newer"), FakeStream("newest")
    await pool.give("peer", old)
    await trio.sleep(8)
    await pool.give("peer", newer)
    await pool.give("peer", newest)
    assert await pool.take("other") is None
    await trio.sleep(4)  # old has idled 12 s, the others 4 s
    assert await pool.take("peer") is newest and old.closed and len(pool) == 1
    assert await pool.take("peer") is newer and await pool.take("peer") is None
    assert not newer.closed and not newest.closed


async def test_at_most_per_peer_streams_wait_and_shutdown_closes_them(clock):
    pool = StreamPool(idle_seconds=10.0, per_peer=2)
    streams = [FakeStream(str(i)) for i in range(3)]
    for stream in streams:
        await pool.give("peer", stream)
    assert [s.closed for s in streams] == [True, False, False] and len(pool) == 2
    await pool.give("other", FakeStream("x"))
    await pool.aclose()
    assert all(s.closed for s in streams) and len(pool) == 0


def _checkpoint(directory, seed: int) -> bytes:
    values = np.random.default_rng(seed).standard_normal(6000).astype(np.float32)
    return write_checkpoint(directory, {"w": values}, {"round": seed, "run": b""}, chunk_size=4096).id


async def test_a_second_download_from_a_provider_reuses_its_data_plane_streams(tmp_path, identity_factory, monkeypatch):
    first, second, third = (_checkpoint(tmp_path / "provider", seed) for seed in (1, 2, 3))
    provider = Node.create(identity_factory(21), listen_addrs=LOOPBACK, services=[CheckpointService(tmp_path / "provider")])
    asker = Node.create(identity_factory(22), listen_addrs=LOOPBACK)
    opened = []
    real_open = checkpoint_download.open_sealed_stream

    async def counting_open(*args, **kwargs):
        opened.append(args[1])
        return await real_open(*args, **kwargs)

    monkeypatch.setattr(checkpoint_download, "open_sealed_stream", counting_open)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(asker.run)
        providers = [provider.listen_addresses()[0]]

        async def download(checkpoint_id: bytes) -> None:
            await download_checkpoint(asker, tmp_path / "asker", checkpoint_id, providers, scores=PeerScores(),
                                      progress=DownloadProgress(checkpoint_id), transport="dataplane")

        with trio.fail_after(30):
            await download(first)
            after_first, idle = len(opened), len(asker.stream_pool)
            await download(second)
            reused_all = len(opened) == after_first

            # Streams that died while idle (here: their sockets closed under them) are replaced.
            for streams in asker.stream_pool._idle.values():
                for _, stream in streams:
                    await stream._tcp.aclose()
            await download(third)
        nursery.cancel_scope.cancel()
    assert after_first >= 1 and idle == after_first  # every stream of the first download went back
    assert reused_all, "the second download opened new data plane streams"
    assert len(opened) > after_first  # the third one had to
