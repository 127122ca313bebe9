"""The network half of ``locomesh doctor``: bootstrap, reachability, NAT behaviour, port mapping, relays.

Judged from what the node already knows (`Node.status()`: the reachability check's dial-back
evidence, the port mapping's state, the relay reservations) and, for bootstrap peers this node is
not connected to, one fresh dial each (bounded by `BOOTSTRAP_DIAL_TIMEOUT`, all at once), so that
the cause a failed dial gives ("connection refused", "peer ID mismatch") is shown as found now.
The judging functions are pure: they take the status dict and return `Check`s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio
from multiaddr import Multiaddr

from locomesh.node.bootstrap import _describe as describe_dial_error  # the bootstrap loop's own words
from locomesh.node.addresses import tcp_endpoint
from locomesh.node.dial_addrs import PUBLIC, RELAYED
from locomesh.node.runtime import DialError, Node

from .checks import Check, fail, ok, warn

BOOTSTRAP_DIAL_TIMEOUT = 5.0
MAX_BOOTSTRAP_DIALS = 16  # a config may list many; a doctor run dials this many at most


async def bootstrap_dials(node: Node) -> dict[str, str]:
    """Each configured bootstrap address this node is not connected to -> the error of one fresh dial
    ("" where it now worked)."""
    results: dict[str, str] = {}

    async def dial(address: Multiaddr) -> None:
        peer = address.value_for_protocol("p2p")
        node.forget_failed_dials(peer)
        try:
            await node.connect(address, timeout=BOOTSTRAP_DIAL_TIMEOUT)
            results[str(address)] = ""
        except DialError as error:
            results[str(address)] = describe_dial_error(error)

    pending = [address for address in node.bootstrap if address.value_for_protocol("p2p") not in node.peers]
    async with trio.open_nursery() as nursery:
        for address in pending[:MAX_BOOTSTRAP_DIALS]:
            nursery.start_soon(dial, address)
    return results


def network_checks(status: Mapping[str, Any], dials: Mapping[str, str]) -> list[Check]:
    """Every network check from `status` (`Node.status()`, taken after the fresh bootstrap `dials`, so
    its counts of connected peers include the dials that worked)."""
    reach = status.get("reachability")
    peers = int(status.get("peers_connected") or 0)
    checks = [bootstrap_check(status.get("bootstrap") or {}, dials, peers, status.get("dial_addrs") or [])]
    if isinstance(reach, dict):
        checks.append(reachability_check(reach, peers))
        checks.append(nat_behaviour_check(reach, status.get("listen_addrs") or [], status.get("observed_addrs") or [],
                                          peers))
    mapping = status.get("port_mapping")
    if isinstance(mapping, dict):
        checks.append(port_mapping_check(mapping, status.get("listen_addrs") or []))
    relay = status.get("relay")
    if isinstance(relay, dict):
        checks.append(relay_check(relay, reach.get("verdict") if isinstance(reach, dict) else None))
    return checks


def bootstrap_check(bootstrap: Mapping[str, int], dials: Mapping[str, str], peers: int,
                    dial_addrs: Sequence[Mapping[str, str]] = ()) -> Check:
    """`dial_addrs`: this node's addresses others can dial (node/dial_addrs.py), best first, for the
    fix of a first node."""
    configured = int(bootstrap.get("configured") or 0)
    if configured == 0:
        if peers:
            return ok("bootstrap", f"no bootstrap peers configured; connected to {peers} peer(s) that found this node")
        # A fail, not a warning: alone, the node trains with no one until some peer connects to it.
        return fail("bootstrap", "no bootstrap peers configured, and no peer is connected: this node cannot find "
                    "anyone", "start the node with --bootstrap /ip4/ADDRESS/tcp/PORT/p2p/PEER_ID (ask the run's "
                    "creator for an address), or set bootstrap in config.toml; if this is the first node of a new "
                    f"network, {_first_node_fix(dial_addrs)}")
    connected = int(bootstrap.get("connected") or 0)  # the dials that worked are connected by now
    failures = [f"{address}: {_cause(error)}" for address, error in dials.items() if error]
    if connected == 0:
        causes = f" ({'; '.join(failures)})" if failures else ""
        return fail("bootstrap", f"0/{configured} bootstrap peers reachable{causes}",
                    "check that each address and its peer ID are right (the peer ID is the last part, after "
                    "/p2p/), that the bootstrap node is running, and that your network lets this machine make "
                    "outgoing TCP connections to it")
    if failures:
        return warn("bootstrap", f"{connected}/{configured} bootstrap peers reachable; not: {'; '.join(failures)}",
                    "fix or remove the unreachable addresses in the bootstrap list")
    return ok("bootstrap", f"{connected}/{configured} bootstrap peers reachable")


def _first_node_fix(dial_addrs: Sequence[Mapping[str, str]]) -> str:
    """How to start the other nodes of a new network: with this node's best address, and for
    whom it works."""
    if not dial_addrs:
        return "start the other nodes with --bootstrap set to one of this node's addresses (`locomesh status` lists them)"
    best = dial_addrs[0]
    reach = "" if best["kind"] in (PUBLIC, RELAYED) else (
        "; nodes on other networks need a public or relayed address, see the reachability and relays checks")
    return (f"start the other nodes with: locomesh node start --bootstrap {best['addr']} ({best['kind']}{reach}; "
            "`locomesh status` lists every address)")


def _cause(error: str) -> str:
    """A dial error in plain words where we know the cause."""
    lowered = error.lower()
    if "peer id mismatch" in lowered:
        return error
    if "refused" in lowered:
        return f"connection refused: nothing listens there ({error})"
    if "within" in lowered or "timed out" in lowered or "unreachable" in lowered:
        return f"no route or no answer ({error})"
    return error


def reachability_check(reach: Mapping[str, Any], peers: int) -> Check:
    verdict = reach.get("verdict")
    confirmed = ", ".join(reach.get("confirmed_addrs") or [])
    if verdict == "public":
        return ok("reachability", f"public: a peer this node had never met dialled it back at {confirmed}")
    evidence = reach.get("evidence") or []
    refuted = sum(1 for probe in evidence if probe.get("outcome") == "refuted")
    if verdict == "private":
        return warn("reachability", f"private: {refuted} dial-back(s) to this node's addresses failed, so peers "
                    "cannot connect to it directly (it reaches them through relays and hole punching)",
                    "for direct connections, let the router map the port (UPnP or NAT-PMP on), or forward the "
                    "node's TCP port to this machine by hand")
    pending = reach.get("probes_pending", 0)
    found = f"not known yet: no dial-back has decided ({pending} pending, {len(evidence)} finished)"
    if not peers:
        return warn("reachability", found, "connect to peers first (see the bootstrap check): a few of them must "
                    "dial this node back")
    return warn("reachability", found, f"wait a minute after start: the {peers} connected peer(s) are asked to "
                "dial this node back")


def nat_behaviour_check(reach: Mapping[str, Any], listen: list[str], observed: list[str], peers: int) -> Check:
    """How the NAT in front of us maps our port, from the addresses peers saw us at (Identify) and
    the dial-back evidence: endpoint-dependent mappings (a new port per destination) defeat hole
    punching, so such a node lives on relays."""
    if reach.get("verdict") == "public":
        return ok("NAT", "no NAT in the way of inbound connections (or a port forward that works)")
    listen_ports = {endpoint[1] for endpoint in map(tcp_endpoint, listen) if endpoint}
    seen = [endpoint for endpoint in map(tcp_endpoint, observed) if endpoint]
    if not seen:
        return _nat_not_known(peers)
    by_ip: dict[str, set[int]] = {}
    for ip, port in seen:
        by_ip.setdefault(ip, set()).add(port)
    ports = max(by_ip.values(), key=len)
    if len(ports) > 1:
        return warn("NAT", f"endpoint-dependent mapping (symmetric NAT): peers see this node at {len(ports)} "
                    "different ports, so hole punching rarely works and its links go through relays",
                    "a router with UPnP or NAT-PMP, or a forwarded port, gives direct connections")
    kept = "keeps the port" if ports & listen_ports else "changes the port"
    return ok("NAT", f"endpoint-independent mapping that {kept} (seen at {', '.join(sorted(by_ip))}): hole "
              "punching can work")


def _nat_not_known(peers: int) -> Check:
    """No peer told us an address other than our own; the fix depends on whether any is connected."""
    if not peers:
        return warn("NAT", "not known yet: no peer is connected to tell this node the address it sees it at",
                    "connect to peers first (see the bootstrap check): the answer comes with the first connections")
    # Peers on this node's own network see it at an address it listens on: no NAT between them.
    return warn("NAT", f"not known yet: none of the {peers} connected peer(s) sees this node at an address other "
                "than the ones it listens on", "nothing to do if they are on this node's own network; otherwise "
                "wait a minute: peers tell the address they see with their first messages")


def port_mapping_check(mapping: Mapping[str, Any], listen: list[str]) -> Check:
    state, reason = mapping.get("state"), mapping.get("reason") or ""
    if state == "mapped":
        proof = "confirmed by a dial-back" if mapping.get("confirmed") else "not yet confirmed by a dial-back"
        return ok("port mapping", f"{mapping.get('protocol')} mapped {mapping.get('external_addr')} ({proof})")
    if state in ("off", "not-needed", "waiting", "mapping"):
        words = {"off": "turned off (port_mapping = off)", "not-needed": "not needed: reachable without one",
                 "waiting": "not tried: the node does not know yet whether it is private",
                 "mapping": "asking the gateway now"}
        return ok("port mapping", words[state])
    port = next((endpoint[1] for endpoint in map(tcp_endpoint, listen) if endpoint), None)
    forward = f"forward TCP port {port}" if port else "forward the node's TCP port"
    return warn("port mapping", f"the gateway did not map a port: {reason or state}",
                f"turn on UPnP or NAT-PMP in the router's settings, or {forward} to this machine by hand")


def relay_check(relay: Mapping[str, Any], verdict: str | None) -> Check:
    reservations = relay.get("reservations") or []
    if relay.get("offering"):
        return ok("relays", f"offering relay service to others ({relay.get('active_circuits', 0)} circuits)")
    if verdict != "private":
        return ok("relays", f"none needed while {verdict or 'not known to be private'}"
                  + (f"; reserved on {len(reservations)}" if reservations else ""))
    if reservations:
        return ok("relays", f"reserved on {len(reservations)} relay(s): peers reach this node through them")
    return warn("relays", "private and no relay reserved: peers cannot reach this node until one is",
                "wait a minute after start; if it stays so, check nat_traversal is \"on\" in config.toml and "
                "connect to more peers (a public peer that relays is needed)")
