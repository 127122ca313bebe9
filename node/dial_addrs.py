"""The addresses other nodes can dial this one at, best first, each with its kind: what `locomesh
status` offers as ready ``--bootstrap`` lines and what doctor's bootstrap fix names.

A node listening on 0.0.0.0 (the default) shows that address, which no one can dial: the addresses
behind it are the host's interfaces, so those are named instead. The kinds, best first:

* ``public``: a peer that had never met this node dialled it back there (the reachability
  check), so anyone can;
* ``relayed``: through a relay this node holds a reservation on; works behind any NAT while the
  reservation lasts;
* ``public, not confirmed``: a public IP that peers saw this node at, a port the gateway mapped, or
  one on an interface, that no dial-back has proved yet (a NAT or firewall may still refuse);
* ``LAN only``: a private address (an interface's, or one a peer on this network saw): nodes on
  the same network;
* ``this machine only``: loopback.

`dial_addresses` is pure (it reads `Node.status()`'s fields); `interface_ips` asks the host.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from locomesh.node.addresses import may_dial, tcp_address, tcp_endpoint

PUBLIC = "public"
RELAYED = "relayed"
UNCONFIRMED = "public, not confirmed"
LAN = "LAN only"
THIS_MACHINE = "this machine only"
KINDS = (PUBLIC, RELAYED, UNCONFIRMED, LAN, THIS_MACHINE)  # best first


def dial_addresses(status: Mapping[str, Any], interface_ips: Callable[[], Sequence[str]]) -> list[dict[str, str]]:
    """``[{"addr": "/ip4/…/tcp/…/p2p/<peer id>", "kind": …}]``: every address others may dial this
    node at, from `status` (`Node.status()`) and the host's `interface_ips()` (asked only behind a
    listen address of 0.0.0.0 or ::), best kind first, each once."""
    reach = _field(status, "reachability")
    confirmed = {endpoint for endpoint in map(tcp_endpoint, reach.get("confirmed_addrs") or []) if endpoint}
    found: dict[str, str] = {address: RELAYED for address in _field(status, "relay").get("relay_addrs") or []}
    for endpoint in filter(None, map(tcp_endpoint, _direct_addrs(status, interface_ips))):
        kind = PUBLIC if endpoint in confirmed else _kind_of_ip(endpoint[0])
        found.setdefault(f"{tcp_address(*endpoint)}/p2p/{status.get('peer_id')}", kind)
    ranked = sorted(found.items(), key=lambda item: KINDS.index(item[1]))  # stable: first seen first within a kind
    return [{"addr": address, "kind": kind} for address, kind in ranked]


def _direct_addrs(status: Mapping[str, Any], interface_ips: Callable[[], Sequence[str]]) -> list[str]:
    """Every plain address of this node that `status` names: where it listens (at the interfaces'
    IPs for 0.0.0.0), where peers saw it, where dial-backs reached it, the gateway's mapping."""
    mapped = _field(status, "port_mapping").get("external_addr")
    return [*concrete_addrs(status.get("listen_addrs") or [], interface_ips), *(status.get("observed_addrs") or []),
            *(_field(status, "reachability").get("confirmed_addrs") or []), *([mapped] if mapped else [])]


def _field(status: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A service's status field; {} when that service does not run."""
    value = status.get(name)
    return value if isinstance(value, dict) else {}


def concrete_addrs(listen_addrs: Sequence[str], interface_ips: Callable[[], Sequence[str]]) -> list[str]:
    """`listen_addrs` with each one on the unspecified address (0.0.0.0, ::) replaced by the same
    port at each of `interface_ips()` of its family (IPv6 link-local ones left out: they need a zone)."""
    concrete: list[str] = []
    for address in listen_addrs:
        endpoint = tcp_endpoint(address)
        if endpoint is None or not ipaddress.ip_address(endpoint[0]).is_unspecified:
            concrete.append(address)
            continue
        version = ipaddress.ip_address(endpoint[0]).version
        concrete.extend(tcp_address(str(ip), endpoint[1]) for ip in _usable_ips(interface_ips()) if ip.version == version)
    return concrete


def interface_ips() -> list[str]:
    """The IP addresses of this host's interfaces that are up, loopback included; [] where psutil
    cannot read them (some sandboxes refuse)."""
    import psutil

    try:
        up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
        interfaces = psutil.net_if_addrs()
    except OSError:
        return []
    return [entry.address for name, entries in interfaces.items() if name in up for entry in entries
            if entry.family in (socket.AF_INET, socket.AF_INET6)]


class CachedInterfaceIps:
    """`interface_ips`, asked again at most every `seconds`: `Node.status()` is polled (the dashboard,
    every 2 s), and reading the interfaces is several system calls each."""

    def __init__(self, seconds: float = 30.0, read: Callable[[], list[str]] = interface_ips) -> None:
        self.seconds, self.read = seconds, read
        self._ips: list[str] = []
        self._at: float | None = None

    def __call__(self) -> list[str]:
        now = time.monotonic()
        if self._at is None or now - self._at >= self.seconds:
            self._ips, self._at = self.read(), now
        return self._ips


def _usable_ips(ips: Sequence[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    usable = []
    for text in ips:
        try:
            ip = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            continue
        if not (ip.is_link_local or ip.is_unspecified or ip.is_multicast):
            usable.append(ip)
    return usable


def _kind_of_ip(ip: str) -> str:
    parsed = ipaddress.ip_address(ip)
    if parsed.is_loopback:
        return THIS_MACHINE
    return UNCONFIRMED if may_dial(ip) else LAN  # may_dial: no IPv4 private address hides in an IPv6 one
