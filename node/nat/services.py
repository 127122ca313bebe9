"""The NAT-traversal services a daemon runs, built from its configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .reach_service import ReachabilityService
from .relay_service import RelayService


def nat_services(*, relay: str, nat_traversal: str, discovery: Callable[[], Any]) -> list[Any]:
    """The reachability check, then the relay service that acts on its verdict.

    `relay` is the relay mode (auto / on / off); `nat_traversal` "off" keeps
    the relay client and hole punching off; `discovery` returns the node's
    `Discovery` (or None before it runs), where relay addresses are published.
    """
    reach = ReachabilityService()
    traversal = nat_traversal == "on"
    relay_service = RelayService(
        lambda: reach.verdict,
        mode=relay,
        reservations=2 if traversal else 0,
        hole_punch=traversal,
        discovery=discovery,
    )
    return [reach, relay_service]
