"""A cancelled writer never cuts a write on a libp2p connection short (`locomesh.node.whole_writes`)."""

from __future__ import annotations

import struct
from contextlib import AsyncExitStack

import pytest
import trio
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.io.trio import TrioTCPStream
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from locomesh.node.host import build_host
from locomesh.node.whole_writes import WholeWriteStream

LOOPBACK = Multiaddr("/ip4/127.0.0.1/tcp/0")
ECHO = "/locomesh-test/echo/1"
YAMUX_PING_SYN = struct.pack(">BBHII", 0, 2, 1, 0, 7)  # version, type ping, flag SYN, session, opaque


async def test_a_write_on_a_connection_whose_writer_was_cancelled_leaves_the_noise_session_intact(identity_factory):
    """Noise takes a nonce when it seals a message; the write after it used to be cancellable, so
    the peer failed to authenticate the next message and dropped the connection."""
    hosts = [build_host(identity_factory(i), listen_addrs=[LOOPBACK]) for i in range(2)]
    async with AsyncExitStack() as stack:
        for host in hosts:
            stack.push_async_callback(host.close)
            await stack.enter_async_context(host.run(listen_addrs=[LOOPBACK]))
        alice, bob = hosts

        async def echo(stream):
            try:
                await stream.write(await stream.read(64))
            finally:
                await stream.close()

        bob.set_stream_handler(ECHO, echo)
        with trio.fail_after(20):
            await alice.connect(info_from_p2p_addr(bob.get_addrs()[0]))
            (connection,) = alice.get_network().connections[bob.get_id()]

            with trio.CancelScope() as scope:
                scope.cancel()  # the writer is cancelled before the sealed message reaches the socket
                await connection.muxed_conn.secured_conn.write(YAMUX_PING_SYN)

            stream = await alice.new_stream(bob.get_id(), [ECHO])
            await stream.write(b"still here")
            assert await stream.read(64) == b"still here"
        assert not connection.is_closed
        assert alice.get_network().connections[bob.get_id()] == [connection]


async def test_a_write_the_peer_never_reads_closes_the_stream_after_the_timeout():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted = []
        nursery.start_soon(trio.serve_listeners, lambda tcp: _hold(tcp, accepted), listeners)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        stream = WholeWriteStream(TrioTCPStream(tcp), timeout=0.5)
        with trio.fail_after(10), pytest.raises(ConnectionClosedError, match="took over 0.5 s"):
            await stream.write(bytes(64 * 1024 * 1024))  # far more than both socket buffers hold
        with pytest.raises(trio.ClosedResourceError):
            await tcp.send_all(b"x")
        nursery.cancel_scope.cancel()


async def _hold(tcp: trio.SocketStream, accepted: list) -> None:
    accepted.append(tcp)
    await trio.sleep_forever()  # accepts, never reads
