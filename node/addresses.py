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
* `may_dial`, `dial_back_targets` and `punch_targets` are the filter every
  dial made on a peer's word passes (dial-backs, hole punches): public
  unicast addresses only, so no peer can make us open connections into our
  own host or LAN (and learn from the timing which ports are open there);
  a capped number of them.
* `is_relayed` / `is_private_ip` classify addresses for the connection table
  and the relay client.

``allow_private_addrs`` is the one switch that lifts the public-only rule
(any unicast address passes then): for tests and local swarms on loopback or
one LAN, where every address is private. A node on the internet leaves it
off, the default everywhere.
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


def addrs_at_ip(addrs: list[str], ip: str | None, *, limit: int, allow_private_addrs: bool = False) -> list[str]:
    """The TCP ports named in `addrs`, at `ip`: canonical addresses without peer ID, at most `limit`.

    A peer behind a NAT names its private addresses and listen port; a
    port-preserving NAT or a port forward makes that port answer at the IP we
    see the peer at, so that is where we try it. Addresses already at `ip`
    come first. None, an unparsable `ip`, or one `may_dial` refuses keeps
    nothing: we dial only where we saw the peer, and only there if it is public.
    """
    if ip is None or not may_dial(ip, allow_private_addrs=allow_private_addrs):
        return []
    wanted = str(ipaddress.ip_address(ip))
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


def may_dial(ip: str, *, allow_private_addrs: bool = False, allow_shared: bool = False) -> bool:
    """Whether a dial on a peer's word may go to `ip`: a public unicast address.

    Refused: private, loopback, link-local, shared (CGNAT), documentation,
    reserved, unspecified, broadcast and multicast addresses, and IPv6
    addresses that embed a refused IPv4 one (IPv4-mapped, NAT64, 6to4), since
    the dial would reach that IPv4 address. `allow_shared` lets the carrier's
    shared space (100.64.0.0/10) through: two homes behind one carrier NAT
    reach each other only there. With `allow_private_addrs` (tests, local
    swarms) any unicast address but the unspecified one passes.
    """
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return False
    embedded = _embedded_ipv4(parsed)
    if embedded is not None and embedded != parsed:
        return may_dial(str(embedded), allow_private_addrs=allow_private_addrs, allow_shared=allow_shared)
    if parsed.is_multicast or parsed.is_unspecified or parsed == ipaddress.IPv4Address("255.255.255.255"):
        return False
    if allow_private_addrs:
        return True
    if isinstance(parsed, ipaddress.IPv6Address):
        # Global unicast only: `is_global` also passes ranges that wrap IPv4 addresses (::/96).
        return parsed in _GLOBAL_UNICAST_V6 and parsed.is_global
    return parsed.is_global or (allow_shared and parsed in _SHARED)


def dial_back_targets(addrs: list[str], *, limit: int, allow_private_addrs: bool = False) -> list[str]:
    """The addresses a dialer dials back for a helper: canonical plain TCP ones at one IP, at most `limit`.

    The IP is the first one named that `may_dial` allows; addresses at any
    other IP are dropped. An honest helper names only the IP it saw the target
    come from (`addrs_at_ip`), so a request that names several IPs, or a
    private one, is someone using us to reach a host it cannot reach itself.
    """
    kept: list[str] = []
    chosen: str | None = None
    for endpoint in map(tcp_endpoint, addrs):
        if endpoint is None or not may_dial(endpoint[0], allow_private_addrs=allow_private_addrs):
            continue
        chosen = chosen or endpoint[0]
        canonical = tcp_address(*endpoint)
        if endpoint[0] == chosen and canonical not in kept:
            kept.append(canonical)
        if len(kept) == limit:
            break
    return kept


def punch_targets(
    addrs: list[str], *, limit: int, own: frozenset[str] = frozenset(), allow_private_addrs: bool = False
) -> list[str]:
    """The addresses a hole punch dials: canonical plain TCP ones `may_dial` allows, not in `own`, at most `limit`.

    `addrs` may end in ``/p2p/<id>``; the peer's order is kept. `own` holds
    canonical addresses of ours (a peer behind our NAT may name our mapping).
    The carrier's shared space passes here (not for dial-backs): a peer behind
    the same carrier NAT is reached at its router's address there, and what a
    hostile peer gains by naming one, a capped number of dials to its carrier's
    other customers, is what it could do from its own address.
    """
    kept: list[str] = []
    for address in addrs:
        endpoint = tcp_endpoint(address.split("/p2p/")[0])
        if endpoint is None or not may_dial(endpoint[0], allow_private_addrs=allow_private_addrs, allow_shared=True):
            continue
        canonical = tcp_address(*endpoint)
        if canonical not in own and canonical not in kept:
            kept.append(canonical)
        if len(kept) == limit:
            break
    return kept


def _embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, 6to4, NAT64 well-known prefix), else None."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # RFC 6598: carrier-grade NAT
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")


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
