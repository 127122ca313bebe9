"""TCP whose dials leave from the port we listen on, and never lead back to ourselves.

Why the listen port: behind a NAT that maps endpoint-independently (home
routers, and carrier-grade NATs, which RFC 6888 asks to), every flow from one
inside port leaves from one outside port, whatever its destination. When all
our connections leave from the listen port, what any peer sees us at (Identify's
observed address) is that one mapping, and it is the address a hole punch
must aim at (`locomesh.node.nat.hole_punch`). A dial from an ephemeral port
shows a peer a mapping nobody can reach us at, and a NAT that had to remap our
listen port (another host behind it holds it) is then invisible. go-libp2p
dials the same way (SO_REUSEPORT on listener and dialer).

A dial-back of the reachability check goes out from an ephemeral port
(`from_ephemeral_port`): it is a one-off probe, and from the listen port it
would cross a dial-back going the other way (peers check each other at the
same time) and open a connection by TCP simultaneous open that neither side
asked for; its failed handshake then leaves TIME_WAIT on the very endpoint
pair a later hole punch between the two needs.

When the kernel cannot give us the listen port for a destination (that exact
pair of endpoints is in use: a live connection, or TIME_WAIT after one), the
dial goes out from an ephemeral port instead: it works, and only the
observation is lost. Loopback destinations are dialled from an ephemeral port:
no NAT lies between us and them.

Why never ourselves: two homes may use the same private subnet, and a peer's
record then names an address that is ours (192.168.1.2:4001 on both sides).
Dialling it reaches our own listener, fails the security handshake and, while
punching, leaves a socket in TIME_WAIT on the endpoint pair the punch needs.
Every dial to one of our own listen endpoints is refused here, before a
socket exists, whichever layer asked (the DHT, the relay client, DCUtR).
"""

from __future__ import annotations

import contextvars
import errno
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from libp2p.abc import IRawConnection
from libp2p.transport.exceptions import OpenConnectionError
from libp2p.transport.tcp.tcp import TCP, TCPListener
from multiaddr import Multiaddr

from locomesh.node.addresses import tcp_endpoint

logger = logging.getLogger(__name__)

_EPHEMERAL = contextvars.ContextVar("locomesh_ephemeral_dials", default=False)

# The errors that say "this endpoint pair is taken", not "the peer is unreachable".
_PAIR_IN_USE = frozenset({errno.EADDRNOTAVAIL, errno.EADDRINUSE})


@contextmanager
def from_ephemeral_port() -> Iterator[None]:
    """Within this block, this task's dials leave from an ephemeral port (see the module docstring)."""
    token = _EPHEMERAL.set(True)
    try:
        yield
    finally:
        _EPHEMERAL.reset(token)


class OwnAddressError(OpenConnectionError):
    """A dial to one of our own listen endpoints: it would reach ourselves."""


class ListenPortTCP(TCP):
    """py-libp2p's TCP transport; dials leave from our listen port, and never go to our own listen endpoints."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listeners: list[TCPListener] = []

    def create_listener(self, handler_function: Any) -> TCPListener:
        listener = super().create_listener(handler_function)
        self._listeners.append(listener)
        return listener

    def listen_endpoints(self) -> list[tuple[str, int]]:
        """(ip, port) of every socket we listen on (wildcard ones as the wildcard IP)."""
        found = []
        for listener in self._listeners:
            for address in listener.get_addrs():
                endpoint = tcp_endpoint(str(address).split("/p2p/")[0])
                if endpoint is not None:
                    found.append(endpoint)
        return found

    async def dial(self, maddr: Multiaddr) -> IRawConnection:
        target = tcp_endpoint(str(maddr).split("/p2p/")[0])
        if target is None:
            return await super().dial(maddr)  # DNS and the like: py-libp2p resolves them
        self._refuse_own(target, maddr)
        source = None if _EPHEMERAL.get() else self._source_for(target)
        if source is None:
            return await super().dial(maddr)
        try:
            return await super().dial_with_source(maddr, source)
        except OpenConnectionError as error:
            if _errno_of(error) not in _PAIR_IN_USE:
                raise
            logger.debug("dial %s from port %d: pair in use; dialling from an ephemeral port", maddr, source[1])
            return await super().dial(maddr)

    async def dial_with_source(self, maddr: Multiaddr, source: tuple[str, int]) -> IRawConnection:
        """A hole-punch dial. Its socket closes with a reset, leaving no TIME_WAIT behind: a punch whose
        handshake failed must not hold the one endpoint pair the next round needs (EADDRNOTAVAIL)."""
        target = tcp_endpoint(str(maddr).split("/p2p/")[0])
        if target is not None:
            self._refuse_own(target, maddr)
        connection = await super().dial_with_source(maddr, source)
        sock = getattr(getattr(getattr(connection, "stream", None), "stream", None), "socket", None)
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return connection

    def _refuse_own(self, target: tuple[str, int], maddr: Multiaddr) -> None:
        if is_own_endpoint(target, self.listen_endpoints()):
            raise OwnAddressError(f"{maddr} is our own listen address")

    def _source_for(self, target: tuple[str, int]) -> tuple[str, int] | None:
        """Our listen endpoint of the target's address family, or None (loopback target, or none listening)."""
        target_ip = ipaddress.ip_address(target[0])
        if target_ip.is_loopback:
            return None
        for ip, port in self.listen_endpoints():
            listen_ip = ipaddress.ip_address(ip)
            if listen_ip.version == target_ip.version and not listen_ip.is_loopback:
                return ip, port
        return None


def is_own_endpoint(target: tuple[str, int], listening: list[tuple[str, int]]) -> bool:
    """Does a dial to `target` reach one of our `listening` endpoints (a wildcard one: at any IP of this host)?"""
    for ip, port in listening:
        if port != target[1]:
            continue
        if ip == target[0] or (ipaddress.ip_address(ip).is_unspecified and _is_local_ip(target[0])):
            return True
    return False


def _is_local_ip(ip: str) -> bool:
    """Is `ip` one of this host's own addresses? (Only an address of ours can be bound.)"""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


def _errno_of(error: BaseException) -> int | None:
    """The errno of the OSError behind a py-libp2p dial error, if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None
