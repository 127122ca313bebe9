"""The data plane: sealed framing and key agreement (sans-IO), then a real handshake between two hosts."""

from __future__ import annotations

import random
from functools import partial

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from multiaddr import Multiaddr

from locomesh.node.transfer.download import ProviderSession
from locomesh.node.transfer.dataplane import HELLO, DataPlaneServer, SealedStream, open_sealed_stream
from locomesh.node.transfer.dataplane_crypto import (
    HEADER_SIZE, TAG_SIZE, DataPlaneError, FrameOpener, FrameSealer, derive_keys, transcript,
)
from locomesh.node.runtime import Node
from locomesh.node.streams import read_frame, write_frame

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def key_pair_sessions():
    """Both ends of one key agreement, as the handshake makes them."""
    client, server = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    client_public = client.public_key().public_bytes_raw()
    server_public = server.public_key().public_bytes_raw()
    salt = transcript("client", "server", client_public, server_public)
    return (derive_keys(client, server_public, salt=salt, initiator=True),
            derive_keys(server, client_public, salt=salt, initiator=False))


def test_keys_agree_per_direction_and_differ_between_directions():
    client, server = key_pair_sessions()
    assert client.send == server.receive and client.receive == server.send and client.send != client.receive


def test_frames_open_in_order_whatever_the_byte_boundaries():
    client, server = key_pair_sessions()
    sealer, opener = FrameSealer(client.send), FrameOpener(server.receive, max_frame=1 << 20)
    messages = [random.Random(seed).randbytes(size) for seed, size in enumerate([0, 1, 5000, 70_000])]
    wire = b"".join(sealer.seal(message) for message in messages)
    rng = random.Random(7)
    received = []
    position = 0
    while position < len(wire):
        step = rng.randint(1, 9000)
        opener.feed(wire[position : position + step])
        position += step
        while (frame := opener.next_frame()) is not None:
            received.append(frame)
    assert received == messages


def test_a_tampered_frame_is_refused():
    client, server = key_pair_sessions()
    sealed = bytearray(FrameSealer(client.send).seal(b"chunk bytes"))
    sealed[HEADER_SIZE + 3] ^= 1
    opener = FrameOpener(server.receive, max_frame=1024)
    opener.feed(bytes(sealed))
    with pytest.raises(DataPlaneError) as caught:
        opener.next_frame()
    assert caught.value.code == "bad-frame"


def test_a_replayed_frame_is_refused():
    client, server = key_pair_sessions()
    sealer, opener = FrameSealer(client.send), FrameOpener(server.receive, max_frame=1024)
    first = sealer.seal(b"request 0")
    opener.feed(first)
    assert opener.next_frame() == b"request 0"
    opener.feed(first)
    with pytest.raises(DataPlaneError, match="does not open"):
        opener.next_frame()


def test_reordered_frames_are_refused():
    client, server = key_pair_sessions()
    sealer, opener = FrameSealer(client.send), FrameOpener(server.receive, max_frame=1024)
    first, second = sealer.seal(b"zero"), sealer.seal(b"one")
    opener.feed(second + first)
    with pytest.raises(DataPlaneError):
        opener.next_frame()


def test_a_frame_under_the_other_directions_key_is_refused():
    client, server = key_pair_sessions()
    opener = FrameOpener(server.receive, max_frame=1024)
    opener.feed(FrameSealer(server.send).seal(b"reflected"))  # our own frame sent back to us
    with pytest.raises(DataPlaneError):
        opener.next_frame()


def test_an_oversized_length_is_refused_before_its_payload_arrives():
    _, server = key_pair_sessions()
    opener = FrameOpener(server.receive, max_frame=1024)
    opener.feed((1025 + TAG_SIZE).to_bytes(HEADER_SIZE, "big"))  # only the header: nothing to buffer yet
    with pytest.raises(DataPlaneError) as caught:
        opener.next_frame()
    assert caught.value.code == "too-large"
    short = FrameOpener(server.receive, max_frame=1024)
    short.feed((TAG_SIZE - 1).to_bytes(HEADER_SIZE, "big"))
    with pytest.raises(DataPlaneError, match="cannot hold its tag"):
        short.next_frame()


def test_a_low_order_peer_key_is_refused():
    with pytest.raises(DataPlaneError) as caught:
        derive_keys(X25519PrivateKey.generate(), bytes(32), salt=b"", initiator=True)
    assert caught.value.code == "bad-key"


# --- over real hosts ------------------------------------------------------------------------


async def echo_frames(stream, peer_id: str) -> None:
    while True:
        await write_frame(stream, await read_frame(stream, max_size=1 << 22, timeout=10), timeout=10)


async def test_a_large_frame_is_sealed_and_read_back_in_whole_pieces():
    """Its length and its payload go as two sealed frames, and the reader takes the payload in one read:
    no copy of megabytes to prepend 4 bytes, no 64 KiB slices joined again."""
    asker_keys, provider_keys = key_pair_sessions()
    left, right = trio.testing.memory_stream_pair()
    writer, reader = SealedStream(left, asker_keys), SealedStream(right, provider_keys)
    written, reads = [], []
    real_write, real_read = writer.write, reader.read

    async def recording_write(data):
        written.append(data)
        await real_write(data)

    async def recording_read(n=None):
        reads.append(await real_read(n))
        return reads[-1]

    writer.write, reader.read = recording_write, recording_read
    payload, small = random.Random(2).randbytes(1_000_000), b"small"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(write_frame, writer, payload, timeout=10))
        assert await read_frame(reader, max_size=1 << 20, timeout=10) == payload
        nursery.start_soon(partial(write_frame, writer, small, timeout=10))
        assert await read_frame(reader, max_size=1 << 20, timeout=10) == small
    assert [len(data) for data in written] == [4, len(payload), 4 + len(small)] and written[1] is payload
    assert [len(data) for data in reads] == [4, len(payload), 4, len(small)]


async def test_a_sealed_stream_carries_frames_between_two_hosts_and_is_used_once(identity_factory):
    client = Node.create(identity_factory(1), listen_addrs=LOOPBACK)
    server_node = Node.create(identity_factory(2), listen_addrs=LOOPBACK)
    seen_peers = []

    async def serve(stream, peer_id):
        seen_peers.append(peer_id)
        with trio.move_on_after(5):
            await echo_frames(stream, peer_id)

    server = DataPlaneServer("127.0.0.1", serve)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server_node.run)
        await nursery.start(server.run, server_node)
        await client.connect(Multiaddr(server_node.listen_addresses()[0]))
        sealed = await open_sealed_stream(client, server_node.peer_id)
        payload = random.Random(1).randbytes(3_000_000)
        await write_frame(sealed, payload, timeout=10)
        assert await read_frame(sealed, max_size=1 << 22, timeout=10) == payload
        await sealed.close()
        assert seen_peers == [client.peer_id] and server.sessions.pending == []

        # A connection whose first frame opens under no pending session is dropped, unanswered, and counted.
        errors = server_node.metrics["locomesh_protocol_errors_total"]
        raw = await trio.open_tcp_stream("127.0.0.1", server.port)
        await raw.send_all(FrameSealer(bytes(32)).seal(HELLO))
        with trio.fail_after(5):
            assert await raw.receive_some(10) == b""
        await raw.aclose()
        assert errors.get(code="bad-frame") == 1 and seen_peers == [client.peer_id]
        nursery.cancel_scope.cancel()


async def test_the_download_session_falls_back_to_libp2p_when_the_peer_has_no_data_plane(identity_factory):
    client = Node.create(identity_factory(3), listen_addrs=LOOPBACK)
    plain = Node.create(identity_factory(4), listen_addrs=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(plain.run)
        session = ProviderSession(client, plain.peer_id, Multiaddr(plain.listen_addresses()[0]), "auto")
        with pytest.raises(Exception):  # plain has no checkpoint handler either: the libp2p stream is refused
            await session.ask(bytes(32), None, max_size=1024)
        assert session.transport == "libp2p"
        strict = ProviderSession(client, plain.peer_id, None, "dataplane")
        with pytest.raises(Exception):
            await strict.ask(bytes(32), None, max_size=1024)
        assert strict.transport == "dataplane"
        nursery.cancel_scope.cancel()


def test_hello_is_a_fixed_short_frame():
    assert 0 < len(HELLO) < 64
