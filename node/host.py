"""The one place a libp2p host is built: the daemon and the network simulator both call `build_host`.

What every locomesh host is, whatever carries its bytes:

* its key is the node's `Identity` (same Ed25519 key, so the same peer ID);
* Noise is the only security protocol offered (a default py-libp2p host
  would also accept plaintext, TLS and SECIO connections);
* Yamux is the only stream multiplexer;
* at most one connection per peer (`max_connections_per_peer=1`), which also
  turns off py-libp2p's fixed 250 ms happy-eyeballs delay on every dial;
* every transport is wrapped in a `MeteredTransport`, so the `ByteMeter`
  passed in counts every byte on the wire.

The transports are injectable: the daemon uses TCP (the default), the
simulator passes its in-memory transport.

py-libp2p's TCP listener sets SO_REUSEPORT (hole punching dials from the
listen port), so on Linux a second process that does the same can listen on
a port that is taken and the kernel splits the connections between the two.
`addresses_in_use` checks, before listening, with a socket of our own that
has no SO_REUSEPORT: it cannot bind where anyone listens. (Two daemons that
start within the same instant can still both pass it.) Listening happens later, in
``async with host.run(listen_addrs=...)``; leaving that block does not close
the listening sockets, so callers also ``await host.close()`` (see
`locomesh.node.runtime.Node.run`, which does both).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

from libp2p import new_host
from libp2p.abc import IHost, ITransport
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.network.config import ConnectionConfig
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from locomesh.protocol import Identity

from locomesh.node.meter import ByteMeter, MeteredTransport
from locomesh.node.listen_port import ListenPortTCP

DIAL_TIMEOUT = 10.0
UPGRADE_TIMEOUT = 10.0


def build_host(
    identity: Identity,
    *,
    listen_addrs: Sequence[Multiaddr],
    transports: Sequence[ITransport] | None = None,
    meter: ByteMeter | None = None,
    max_connections: int = 300,
) -> IHost:
    """A py-libp2p host for `identity`: Noise only, Yamux, one connection per peer.

    `transports` defaults to ``[ListenPortTCP()]`` (TCP dialling from our listen port); each is wrapped so that `meter`
    (a fresh one if None; read it back from the wrapper or pass your own)
    counts its traffic. `listen_addrs` is what the host will later be run
    with; py-libp2p looks at it when it builds the swarm.
    """
    key_pair = create_new_key_pair(identity.seed)
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    meter = meter if meter is not None else ByteMeter()
    metered = [MeteredTransport(transport, meter) for transport in (transports or [ListenPortTCP()])]
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
        listen_addrs=list(listen_addrs),
        transports=metered,
        connection_config=ConnectionConfig(
            max_connections=max_connections,
            max_connections_per_peer=1,
            dial_timeout=DIAL_TIMEOUT,
            inbound_upgrade_timeout=UPGRADE_TIMEOUT,
            outbound_upgrade_timeout=UPGRADE_TIMEOUT,
        ),
    )


def addresses_in_use(listen_addrs: Sequence[Multiaddr]) -> list[Multiaddr]:
    """The TCP addresses among `listen_addrs` that something already listens on (port 0 and
    non-IP addresses are never in use; an address that cannot be bound for another reason is left
    for the listener to report)."""
    return [address for address in listen_addrs if _in_use(address)]


def _in_use(address: Multiaddr) -> bool:
    endpoint = _tcp_endpoint(address)
    if endpoint is None or endpoint[2] == 0:
        return False
    family, host, port = endpoint
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def _tcp_endpoint(address: Multiaddr) -> tuple[socket.AddressFamily, str, int] | None:
    names = [protocol.name for protocol in address.protocols()]
    if len(names) < 2 or names[1] != "tcp" or names[0] not in ("ip4", "ip6"):
        return None
    family = socket.AF_INET if names[0] == "ip4" else socket.AF_INET6
    return family, address.value_for_protocol(names[0]), int(address.value_for_protocol("tcp"))
