"""Attacks on the checkpoint data plane (issue #18, findings 4, 5, 8), over real sockets and real libp2p hosts.

Each attacker uses the real modules (the handshake, `open_sealed_stream`, the
provider's `DataPlaneServer`) and then misbehaves on the wire: idle sockets,
a sealed frame announcing 120 MiB, too many sessions or handshakes from one
peer. The sans-IO bookkeeping (`dataplane_sessions`) is tested first.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.download import DownloadProgress, download_checkpoint
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.transfer.dataplane import HANDSHAKE_PROTOCOL, DataPlaneServer, open_sealed_stream
from locomesh.node.transfer.dataplane_crypto import TAG_SIZE, DataPlaneError, FrameSealer, SessionKeys
from locomesh.node.transfer.dataplane_sessions import (
    FIRST_FRAME_TIMEOUT, HELLO, MAX_PENDING, MAX_PENDING_PER_PEER, MAX_SESSIONS_PER_PEER, MAX_UNAUTHENTICATED,
    MAX_UNAUTHENTICATED_PER_SOURCE, REQUEST_FRAME, SessionTable, UnauthenticatedConnections, source_of,
)
from locomesh.node.peer_scores import PeerScores
from locomesh.node.runtime import Node
from locomesh.node.streams import write_frame
from locomesh.protocol import encode
from locomesh.protocol.kinds import CKPT_DATAPLANE_HELLO, CKPT_DATAPLANE_OFFER, CKPT_REPLY
from locomesh.node.transfer.store import load_checkpoint, manifest_path, write_checkpoint

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
MiB = 1024 * 1024
HUGE = 120 * MiB  # what the attacker announces: under the 128 MiB a frame could ever hold
PUSHED = 16 * MiB  # what it then tries to push: more than the kernel buffers of a loopback connection


def _checkpoint(directory, seed: int = 1) -> bytes:
    """About 6 chunks of 4 KiB."""
    values = np.random.default_rng(seed).standard_normal(6000).astype(np.float32)
    return write_checkpoint(directory, {"w": values}, {"round": seed, "run": b""}, chunk_size=4096).id


def _keys(seed: int) -> SessionKeys:
    return SessionKeys(bytes([seed]) * 32, bytes([seed + 1]) * 32)


def _sealed_hello(keys: SessionKeys) -> bytes:
    """The first frame an asker holding `keys` sends (sealed under the provider's receive key)."""
    return FrameSealer(keys.receive).seal(HELLO)


async def _download(asker: Node, directory, checkpoint_id: bytes, providers: list[str], scores: PeerScores) -> None:
    await download_checkpoint(asker, directory, checkpoint_id, providers, scores=scores,
                              progress=DownloadProgress(checkpoint_id), transport="auto")


# --- sans-IO: who is let in, who is pushed out ------------------------------------------------


def test_a_newcomer_pushes_out_the_oldest_of_its_own_source_then_of_the_largest():
    table = UnauthenticatedConnections(total=6, per_source=3)
    for name in ("a1", "a2", "a3"):
        assert table.admit(name, "10.0.0.1") is None
    assert table.admit("a4", "10.0.0.1") == "a1"  # its source is full: its own oldest goes
    for name in ("b1", "b2", "c1"):
        assert table.admit(name, name[0]) is None
    assert len(table) == 6
    assert table.admit("d1", "d") == "a2"  # all full: the largest source (a: 3) gives up its oldest
    assert table.admit("d2", "d") == "a3"  # a and b hold 2 each now: a's oldest is older
    table.release("b1")
    assert table.admit("e1", "e") is None and len(table) == 6


def test_sources_are_ipv4_addresses_and_ipv6_slash_64s():
    assert source_of("127.0.0.2") == "127.0.0.2"
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"


def test_one_peer_holds_at_most_its_share_of_pending_sessions_and_many_push_out_the_oldest():
    table = SessionTable(max_pending=4, pending_per_peer=2, max_sessions=8, sessions_per_peer=3, ttl=15.0)
    table.offer("mallory", _keys(1), now=0.0)
    table.offer("mallory", _keys(2), now=0.0)
    with pytest.raises(DataPlaneError) as refused:
        table.offer("mallory", _keys(3), now=0.0)
    assert refused.value.code == "busy"
    table.offer("alice", _keys(4), now=0.0)
    table.offer("bob", _keys(5), now=0.0)
    evicted = table.offer("carol", _keys(6), now=1.0)  # all 4 slots taken: the oldest goes
    assert evicted is not None and evicted.peer_id == "mallory" and len(table.pending) == 4
    peer, _, opener = table.claim(_sealed_hello(_keys(4)), now=2.0)
    assert peer == "alice" and table.active["alice"] == 1 and opener.max_frame == REQUEST_FRAME
    with pytest.raises(DataPlaneError, match="no pending"):  # used once
        table.claim(_sealed_hello(_keys(4)), now=2.0)
    assert table.offer("dave", _keys(7), now=20.0) is None and [e.peer_id for e in table.pending] == ["dave"]
    with pytest.raises(DataPlaneError) as late:
        table.claim(_sealed_hello(_keys(7)), now=35.0)
    assert late.value.code == "expired" and table.pending == [] and not table.active.get("dave")


def test_a_peer_with_its_sessions_active_is_refused_another():
    table = SessionTable(max_pending=8, pending_per_peer=8, max_sessions=8, sessions_per_peer=2, ttl=15.0)
    for seed in (1, 3):
        table.offer("mallory", _keys(seed), now=0.0)
        table.claim(_sealed_hello(_keys(seed)), now=0.0)
    with pytest.raises(DataPlaneError, match="holds 2"):
        table.offer("mallory", _keys(5), now=0.0)
    table.end("mallory")
    table.offer("mallory", _keys(5), now=0.0)


# --- finding 4: idle sockets, no identity needed --------------------------------------------


async def _squat(port: int, sources: list[str], opened: list[int]) -> None:
    """Hold idle TCP connections to `port`, `MAX_UNAUTHENTICATED_PER_SOURCE` from each of `sources`, opening
    a new one shortly after each is closed, and never send a byte."""

    async def hold(source: str) -> None:
        while True:
            try:
                tcp = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
            except OSError:
                await trio.sleep(0.1)
                continue
            opened[0] += 1
            try:
                await tcp.receive_some(1)  # until the provider closes it
            except trio.BrokenResourceError:
                pass
            await tcp.aclose()
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        for source in sources:
            for _ in range(MAX_UNAUTHENTICATED_PER_SOURCE):
                nursery.start_soon(hold, source)


async def test_idle_sockets_from_many_addresses_do_not_keep_an_asker_off_the_data_plane(tmp_path, identity_factory):
    checkpoint_id = _checkpoint(tmp_path / "provider")
    service = CheckpointService(tmp_path / "provider")
    provider = Node.create(identity_factory(41), listen_addrs=LOOPBACK, services=[service])
    asker = Node.create(identity_factory(42), listen_addrs=LOOPBACK)
    sources = [f"127.0.0.{2 + i}" for i in range(MAX_UNAUTHENTICATED // MAX_UNAUTHENTICATED_PER_SOURCE + 1)]
    opened = [0]
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(asker.run)
        nursery.start_soon(_squat, service.dataplane_server.port, sources, opened)
        with trio.fail_after(10):
            while opened[0] < MAX_UNAUTHENTICATED:
                await trio.sleep(0.01)
        with trio.fail_after(30):  # generous; without the squatter it takes well under a second
            await _download(asker, tmp_path / "asker", checkpoint_id, [provider.listen_addresses()[0]], PeerScores())
        nursery.cancel_scope.cancel()
    loaded, _ = load_checkpoint(tmp_path / "asker", checkpoint_id)
    assert loaded["w"].shape == (6000,)
    assert opened[0] > MAX_UNAUTHENTICATED  # the squatter filled every slot and kept coming back
    assert service.dataplane_server.sessions_served >= 1, "the asker did not get onto the data plane"
    assert provider.metrics["locomesh_protocol_errors_total"].get(code="evicted") >= 1  # room was made, not queued


async def test_an_idle_unauthenticated_connection_is_closed_after_the_first_frame_timeout(identity_factory):
    provider = Node.create(identity_factory(43), listen_addrs=LOOPBACK)
    server = DataPlaneServer("127.0.0.1", lambda stream, peer: trio.sleep(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(server.run, provider)
        tcp = await trio.open_tcp_stream("127.0.0.1", server.port)
        with trio.fail_after(FIRST_FRAME_TIMEOUT + 3):
            assert await tcp.receive_some(1) == b""
        await tcp.aclose()
        assert provider.metrics["locomesh_protocol_errors_total"].get(code="timeout") == 1
        nursery.cancel_scope.cancel()


# --- finding 5: frames larger than what may come, both ways; sessions per peer --------------


async def _push_after_huge_header(tcp: trio.SocketStream) -> bool:
    """Announce a sealed frame of HUGE bytes and push PUSHED bytes of it; whether the other side cut us off."""
    try:
        with trio.fail_after(10):
            await tcp.send_all((HUGE + TAG_SIZE).to_bytes(4, "big"))
            await tcp.send_all(bytes(PUSHED))
    except trio.BrokenResourceError:
        return True
    except trio.TooSlowError:
        return False
    return False


async def test_a_peer_announcing_a_huge_frame_is_cut_off_before_the_provider_buffers_it(tmp_path, identity_factory):
    service = CheckpointService(tmp_path / "provider")
    provider = Node.create(identity_factory(51), listen_addrs=LOOPBACK, services=[service])
    attacker = Node.create(identity_factory(52), listen_addrs=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(attacker.run)
        await attacker.connect(Multiaddr(provider.listen_addresses()[0]))
        sealed = await open_sealed_stream(attacker, provider.peer_id)  # a real, authenticated session
        cut_off = await _push_after_huge_header(sealed._tcp)
        await sealed.close()
        nursery.cancel_scope.cancel()
    assert cut_off, f"the provider took {PUSHED} bytes of a frame announcing {HUGE}"
    assert provider.metrics["locomesh_protocol_errors_total"].get(code="too-large") == 1
    assert service.scores.get(attacker.peer_id).strikes == 1


async def test_a_provider_announcing_a_huge_frame_is_cut_off_and_the_asker_falls_back_to_libp2p(
    tmp_path, identity_factory, caplog,
):
    """The provider tells the asker the manifest's true size in a signed reply, then announces a frame of
    120 MiB: the asker refuses it from its header, strikes the provider, and downloads over libp2p."""
    checkpoint_id = _checkpoint(tmp_path / "provider")
    manifest_size = manifest_path(tmp_path / "provider", checkpoint_id).stat().st_size
    provider = Node.create(identity_factory(53), listen_addrs=LOOPBACK,
                           services=[CheckpointService(tmp_path / "provider", dataplane=False)])
    asker = Node.create(identity_factory(54), listen_addrs=LOOPBACK)
    cut_off: list[bool] = []

    async def lying_serve(stream, peer_id: str) -> None:
        await wire.next_request(stream, peer_id, idle_timeout=10)
        reply = encode(provider.identity, CKPT_REPLY.name, {"status": wire.OK, "size": manifest_size})
        await write_frame(stream, reply, timeout=10)
        cut_off.append(await _push_after_huge_header(stream._tcp))

    scores = PeerScores()
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.run)
        await nursery.start(asker.run)
        await nursery.start(DataPlaneServer("127.0.0.1", lying_serve).run, provider)
        with caplog.at_level(logging.INFO, logger="locomesh.node.transfer.download"):
            with trio.fail_after(20):  # under the 30 s an asker waits for a frame
                await _download(asker, tmp_path / "asker", checkpoint_id, [provider.listen_addresses()[0]], scores)
        nursery.cancel_scope.cancel()
    assert cut_off == [True], "the asker took bytes of a frame larger than the reply it was told"
    assert scores.get(provider.peer_id).strikes == 1
    assert sum("using libp2p streams" in record.getMessage() for record in caplog.records) == 1
    loaded, _ = load_checkpoint(tmp_path / "asker", checkpoint_id)
    assert loaded["w"].shape == (6000,)


async def test_one_peer_cannot_hold_more_than_its_share_of_authenticated_connections(tmp_path, identity_factory):
    provider = Node.create(identity_factory(55), listen_addrs=LOOPBACK,
                           services=[CheckpointService(tmp_path / "provider")])
    attacker = Node.create(identity_factory(56), listen_addrs=LOOPBACK)
    other = Node.create(identity_factory(57), listen_addrs=LOOPBACK)
    held, refused = [], 0
    async with trio.open_nursery() as nursery:
        for node in (provider, attacker, other):
            await nursery.start(node.run)
        for node in (attacker, other):
            await node.connect(Multiaddr(provider.listen_addresses()[0]))
        with trio.fail_after(30):
            for _ in range(MAX_SESSIONS_PER_PEER + 4):
                try:
                    held.append(await open_sealed_stream(attacker, provider.peer_id))
                except Exception:  # noqa: BLE001 - refused: how it shows on the asker's side varies
                    refused += 1
            for stream in held:  # a refused session may show only on first use
                try:
                    await wire.ask(stream, attacker.identity, provider.peer_id, bytes(32), None, max_size=64, timeout=5)
                except Exception:  # noqa: BLE001
                    refused += 1
            sealed = await open_sealed_stream(other, provider.peer_id)  # another peer still gets in
            reply = await wire.ask(sealed, other.identity, provider.peer_id, bytes(32), None, max_size=64, timeout=5)
        nursery.cancel_scope.cancel()
    assert reply.status == wire.NOT_FOUND
    assert refused == 4, f"{MAX_SESSIONS_PER_PEER + 4 - refused} sessions held by one peer"


# --- finding 8: pending handshakes ----------------------------------------------------------


async def _handshake_only(node: Node, provider: str) -> bool:
    """Agree keys with `provider` (a real signed hello and offer) and never connect: whether an offer came."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    stream = await node.open_stream(provider, [HANDSHAKE_PROTOCOL])
    try:
        public = X25519PrivateKey.generate().public_key().public_bytes_raw()
        await write_frame(stream, encode(node.identity, CKPT_DATAPLANE_HELLO.name, {"key": public}), timeout=5)
        await wire.read_signed(stream, CKPT_DATAPLANE_OFFER, provider, timeout=5)
        return True
    except Exception:  # noqa: BLE001 - refused: the stream is reset
        return False
    finally:
        await stream.close()


async def test_one_peer_cannot_take_every_pending_handshake_slot(tmp_path, identity_factory):
    checkpoint_id = _checkpoint(tmp_path / "provider")
    service = CheckpointService(tmp_path / "provider")
    provider = Node.create(identity_factory(61), listen_addrs=LOOPBACK, services=[service])
    attacker = Node.create(identity_factory(62), listen_addrs=LOOPBACK)
    asker = Node.create(identity_factory(63), listen_addrs=LOOPBACK)
    async with trio.open_nursery() as nursery:
        for node in (provider, attacker, asker):
            await nursery.start(node.run)
        await attacker.connect(Multiaddr(provider.listen_addresses()[0]))
        with trio.fail_after(30):
            offers = [await _handshake_only(attacker, provider.peer_id) for _ in range(MAX_PENDING + 8)]
            await download_checkpoint(
                asker, tmp_path / "asker", checkpoint_id, [provider.listen_addresses()[0]], scores=PeerScores(),
                progress=DownloadProgress(checkpoint_id), transport="dataplane",
            )
        nursery.cancel_scope.cancel()
    assert sum(offers) == MAX_PENDING_PER_PEER
    assert provider.metrics["locomesh_protocol_errors_total"].get(code="busy") == MAX_PENDING + 8 - MAX_PENDING_PER_PEER
    assert service.dataplane_server.sessions_served >= 1
