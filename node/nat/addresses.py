"""Which addresses a NAT-traversal decision may use: plain TCP ones, at the IP a peer was seen at.

Pure functions over multiaddr *strings* (no libp2p, no I/O), shared by the
reachability check and the relay client:

* `tcp_endpoint` reads ``/ip4|ip6/<ip>/tcp/<port>[/p2p/<id>]`` and nothing
  else (no DNS, no circuit, no UDP): the only kind we ever dial on someone
  else's word.
* `addrs_at_ip` is the anti-amplification rule of the dial-back protocol:
  whatever addresses a peer names, we try only their ports, at the IP we see
  its connection come from, so nobody can make us (or a peer of ours) dial a
  third party.
* `is_relayed` / `is_private_ip` classify addresses for the connection table
  and the relay client.
"""

from __future__ import annotations

import ipaddress

CIRCUIT = "p2p-circuit"


def tcp_endpoint(address: str) -> tuple[str, int] | None:
    """``(ip, port)`` of a plain TCP multiaddr, optionally ending in ``/p2p/<id>``; None for anything else."""
    parts = address.split("/")
    if len(parts) not in (5, 7) or parts[0] != "" or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    if len(parts) == 7 and (parts[5] != "p2p" or not parts[6]):
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
        port = int(parts[4], 10)
    except ValueError:
        return None
    if ip.version != (4 if parts[1] == "ip4" else 6) or not 0 < port < 65536:
        return None
    return str(ip), port


def tcp_address(ip: str, port: int) -> str:
    """The canonical multiaddr string of a TCP endpoint (no peer ID)."""
    family = "ip6" if ":" in ip else "ip4"
    return f"/{family}/{ip}/tcp/{port}"


def addrs_at_ip(addrs: list[str], ip: str | None, *, limit: int) -> list[str]:
    """The TCP ports named in `addrs`, at `ip`: canonical addresses without peer ID, at most `limit`.

    A peer behind a NAT names its private addresses and listen port; a
    port-preserving NAT or a port forward makes that port answer at the IP we
    see the peer at, so that is where we try it. Addresses already at `ip`
    come first. None or an unparsable `ip` keeps nothing: we dial only where
    we saw the peer.
    """
    if ip is None:
        return []
    try:
        wanted = str(ipaddress.ip_address(ip))
    except ValueError:
        return []
    endpoints = [endpoint for endpoint in map(tcp_endpoint, addrs) if endpoint is not None]
    endpoints.sort(key=lambda endpoint: endpoint[0] != wanted)  # stable: keeps the peer's order otherwise
    kept: list[str] = []
    for _, port in endpoints:
        canonical = tcp_address(wanted, port)
        if canonical not in kept:
            kept.append(canonical)
        if len(kept) == limit:
            break
    return kept


def remote_ip(connection_addrs: list[str]) -> str | None:
    """The IP a direct connection comes from (the first plain TCP address); None for a relayed one."""
    for address in connection_addrs:
        if is_relayed(address):
            return None
        endpoint = tcp_endpoint(address)
        if endpoint is not None:
            return endpoint[0]
    return None


def is_relayed(address: str) -> bool:
    return f"/{CIRCUIT}" in address


def is_private_ip(ip: str) -> bool:
    """True for addresses no one outside this network can dial (RFC 1918, loopback, link-local, ...)."""
    try:
        return not ipaddress.ip_address(ip).is_global
    except ValueError:
        return True
