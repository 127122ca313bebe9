"""Nodes in one process on loopback: bootstrap, ping, byte counting, and garbage on the ping protocol."""

from __future__ import annotations

import random

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.datadir import DataDir, DataDirError
from locomesh.node.ping import PROTOCOL_ID, PingService
from locomesh.node.runtime import DialError, Node
from locomesh.node.streams import read_frame, write_frame
from locomesh.protocol import decode, encode

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


async def wait_for(condition, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.02)


@pytest.fixture
async def two_nodes(nursery, identity_factory):
    first_ping, second_ping = PingService(), PingService()
    first = Node.create(identity_factory(1), listen_addrs=LOOPBACK, services=[first_ping], rng=random.Random(1))
    await nursery.start(first.run)
    bootstrap = [Multiaddr(first.listen_addresses()[0])]
    second = Node.create(
        identity_factory(2), listen_addrs=LOOPBACK, services=[second_ping], bootstrap=bootstrap, rng=random.Random(2)
    )
    await nursery.start(second.run)
    await wait_for(lambda: second.peer_id in first.peers and first.peer_id in second.peers)
    yield first, first_ping, second, second_ping
    first.request_stop()
    second.request_stop()


async def test_bootstrap_ping_and_status(two_nodes):
    first, first_ping, second, second_ping = two_nodes
    assert await second_ping.ping(first.peer_id) > 0
    assert await first_ping.ping(second.peer_id) > 0

    status = first.status()
    assert status["peer_id"] == first.peer_id
    assert status["peers_connected"] == 1 and status["runs"] == [] and status["services"] == ["ping"]
    assert status["listen_addrs"][0].startswith("/ip4/127.0.0.1/tcp/")
    assert status["bytes_in"] > 0 and status["bytes_out"] > 0
    assert status["protocol_errors"] == 0

    [peer] = second.peer_list()
    assert peer["peer_id"] == first.peer_id and peer["direction"] == "outbound"
    assert [entry["direction"] for entry in first.peer_list()] == ["inbound"]


async def test_ping_refuses_an_unknown_peer(two_nodes, identity_factory):
    _, _, _, second_ping = two_nodes
    with pytest.raises(DialError):
        await second_ping.ping(identity_factory(99).peer_id)


def protocol_errors(node: Node) -> dict[str, float]:
    counter = node.metrics["locomesh_protocol_errors_total"]
    return {labels[0]: value for labels, value in counter.samples()}


async def send_garbage(intruder: Node, target: str, data: bytes) -> None:
    """Open a ping stream to peer `target`, send `data`, close our side, and drain until the stream is dropped."""
    stream = await intruder.open_stream(target, [PROTOCOL_ID])
    await stream.write(data)
    await stream.close_write()
    with trio.fail_after(5):
        try:
            while await stream.read(1024):
                pass
        except Exception:  # noqa: BLE001 - a reset is what we expect
            pass


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


async def test_garbage_on_the_ping_protocol_is_counted_and_harmless(two_nodes, identity_factory, nursery):
    first, _, second, second_ping = two_nodes
    intruder = Node.create(identity_factory(3), listen_addrs=LOOPBACK)
    await nursery.start(intruder.run)
    await intruder.connect(Multiaddr(first.listen_addresses()[0]))
    rng = random.Random(5)
    someone_else = identity_factory(4)
    cases = {
        "too-large": (100_000).to_bytes(4, "big") + b"x" * 100,
        "truncated": b"\x00\x00\x00\x40" + b"y" * 10,
        "bad-envelope": frame(b"\x93\x01\x02\x03"),  # a msgpack array, not an envelope map
        "unexpected-kind": frame(
            encode(intruder.identity, "peer.record", {"addrs": [], "relay_addrs": [], "seq": 1, "expires": 2})
        ),
        "wrong-author": frame(encode(someone_else, "node.ping", {"nonce": b"12345678"})),
    }
    for expected_code, data in cases.items():
        before = protocol_errors(first).get(expected_code, 0)
        await send_garbage(intruder, first.peer_id, data)
        await wait_for(lambda: protocol_errors(first).get(expected_code, 0) == before + 1)
    for _ in range(5):
        await send_garbage(intruder, first.peer_id, bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))))
    await wait_for(lambda: sum(protocol_errors(first).values()) >= len(cases) + 5)
    assert "internal" not in protocol_errors(first)
    # The node is still whole: pings work, the intruder stays connected.
    assert await second_ping.ping(first.peer_id) > 0
    assert intruder.peer_id in first.peers
    assert first.status()["protocol_errors"] == sum(protocol_errors(first).values())
    intruder.request_stop()


async def test_a_good_ping_from_a_raw_stream(two_nodes, identity_factory, nursery):
    first, *_ = two_nodes
    client = Node.create(identity_factory(5), listen_addrs=LOOPBACK)
    await nursery.start(client.run)
    await client.connect(Multiaddr(first.listen_addresses()[0]))
    stream = await client.open_stream(first.peer_id, [PROTOCOL_ID])
    await write_frame(stream, encode(client.identity, "node.ping", {"nonce": b"abcdefgh"}), timeout=5)
    reply = decode(await read_frame(stream, max_size=512, timeout=5))
    assert reply.author_peer_id == first.peer_id and reply.body == {"nonce": b"abcdefgh"}
    client.request_stop()


def test_a_data_dir_takes_one_daemon(tmp_path):
    first, second = DataDir(tmp_path), DataDir(tmp_path)
    assert not first.daemon_running()
    first.lock()
    try:
        assert second.daemon_running()
        with pytest.raises(DataDirError, match="another locomesh daemon"):
            second.lock()
    finally:
        first.unlock()
    assert not second.daemon_running()
    second.lock()
    second.unlock()


def test_rpc_files_round_trip_and_damage_is_reported(tmp_path):
    from locomesh.node.datadir import RpcInfo

    datadir = DataDir(tmp_path)
    assert datadir.read_rpc_info() is None and datadir.read_cookie() is None
    cookie = datadir.new_cookie()
    assert len(cookie) == 64 and datadir.read_cookie() == cookie
    assert (tmp_path / "rpc.cookie").stat().st_mode & 0o777 == 0o600
    datadir.write_rpc_info(RpcInfo(port=1234, pid=5, peer_id="p"))
    assert datadir.read_rpc_info() == RpcInfo(port=1234, pid=5, peer_id="p")
    (tmp_path / "rpc.json").write_text("{damaged")
    with pytest.raises(DataDirError, match="damaged"):
        datadir.read_rpc_info()
    datadir.remove_rpc_files()
    assert datadir.read_rpc_info() is None


async def test_bootstrap_retries_until_the_peer_appears(nursery, identity_factory):
    import socket

    with socket.socket() as probe:  # a port nothing listens on (yet)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    late_identity = identity_factory(8)
    address = Multiaddr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{late_identity.peer_id}")
    early = Node.create(identity_factory(9), listen_addrs=LOOPBACK, bootstrap=[address], rng=random.Random(3))
    await nursery.start(early.run)
    await trio.sleep(1.0)  # a few dials fail meanwhile
    assert late_identity.peer_id not in early.peers
    late = Node.create(late_identity, listen_addrs=[Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")])
    await nursery.start(late.run)
    await wait_for(lambda: late_identity.peer_id in early.peers, timeout=15)
    early.request_stop()
    late.request_stop()
