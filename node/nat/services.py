"""The NAT-traversal services a daemon runs, built from its configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from locomesh.node.nat.port_mapping import PortMappingService
from locomesh.node.nat.reach_service import ReachabilityService, advertised_addrs
from locomesh.node.nat.relay_service import RelayService


def nat_services(
    *, relay: str, nat_traversal: str, discovery: Callable[[], Any], port_mapping: str = "on",
    allow_private_addrs: bool = False,
) -> list[Any]:
    """The reachability check, the gateway port mapper and the relay service, all acting on its verdict.

    `relay` is the relay mode (auto / on / off); `nat_traversal` "off" keeps
    the relay client and hole punching off; `port_mapping` "off" keeps the
    gateway alone; `discovery` returns the node's `Discovery` (or None before
    it runs), where our peer record (mapped and relay addresses) is published.
    The reachability check also tries the mapped address, which is advertised
    only once a dial-back proves it. Every address a dial-back proved (a mapped
    one, or the observed one of a port-preserving NAT or a port forward) goes
    into the peer record: a node found public at such an address reserves no
    relay, so without it nobody could reach it. Dial-backs and hole punches
    go to public unicast addresses only unless `allow_private_addrs` (tests and
    local swarms on loopback or one LAN; `locomesh.node.addresses`).
    """
    mapper = PortMappingService(
        lambda: reach.verdict,
        lambda: reach.tracker.confirmed_addrs(),
        enabled=port_mapping == "on",
        on_mapped=lambda: reach.probe_soon(),
    )
    reach = ReachabilityService(addresses=lambda node: advertised_addrs(node) + mapper.candidate_addrs(),
                                allow_private_addrs=allow_private_addrs)
    traversal = nat_traversal == "on"
    relay_service = RelayService(
        lambda: reach.verdict,
        mode=relay,
        reservations=2 if traversal else 0,
        hole_punch=traversal,
        discovery=discovery,
        extra_addrs=lambda: _unique(mapper.advertised_addrs() + reach.tracker.confirmed_addrs()),
        allow_private_addrs=allow_private_addrs,
    )
    return [reach, mapper, relay_service]


def _unique(addrs: list[str]) -> list[str]:
    return list(dict.fromkeys(addrs))
