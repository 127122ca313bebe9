"""Circuit relay v2 and DCUtR between real nodes on loopback: reserve, dial through the relay, upgrade."""

from __future__ import annotations

import pytest
import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from locomesh.node.nat.reachability import PRIVATE, PUBLIC, UNKNOWN
from locomesh.node.nat.relay_plan import REFRESH_INTERVAL, RelayBounds, plan_reservations
from locomesh.node.nat.relay_service import RelayService
from locomesh.node.ping import PingService
from locomesh.node.runtime import Node

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


def test_plan_reservations_fills_refreshes_and_drops():
    assert plan_reservations({}, ["r1", "r2", "r3"], want=2, now=0.0) == (["r1", "r2"], [])
    held = {"r1": 0.0, "gone": 0.0}
    assert plan_reservations(held, ["r1", "r2"], want=2, now=10.0) == (["r2"], ["gone"])
    assert plan_reservations({"r1": 0.0, "r2": 5.0}, ["r1", "r2", "r3"], want=2, now=REFRESH_INTERVAL + 1) == (
        ["r1"],
        [],
    )
    assert plan_reservations({"r1": 0.0}, ["r1"], want=0, now=1.0) == ([], [])


def test_bounds_become_relay_limits_and_modes_are_checked():
    limits = RelayBounds(max_reservations=3, max_circuits=2, circuit_seconds=60, circuit_bytes=1000).limits()
    assert (limits.max_reservations, limits.max_circuit_conns, limits.duration, limits.data) == (3, 2, 60, 1000)
    with pytest.raises(ValueError):
        RelayService(lambda: UNKNOWN, mode="sometimes")


async def wait_for(condition, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.05)


async def start(nursery, identity, service, bootstrap=()) -> Node:
    node = Node.create(identity, listen_addrs=LOOPBACK, services=[PingService(), service], bootstrap=list(bootstrap))
    await nursery.start(node.run)
    return node


async def test_private_nodes_meet_through_a_relay_and_upgrade_to_direct(nursery, identity_factory):
    relay_service = RelayService(lambda: PUBLIC)  # mode "auto": offers hop once public
    relay = await start(nursery, identity_factory(21), relay_service)
    bootstrap = [Multiaddr(relay.listen_addresses()[0])]
    # On loopback every address is private: hole punches may go there only when allowed.
    listener_service = RelayService(lambda: PRIVATE, allow_private_addrs=True)
    listener = await start(nursery, identity_factory(22), listener_service, bootstrap)
    dialer_service = RelayService(lambda: PRIVATE, reservations=0, allow_private_addrs=True)
    dialer = await start(nursery, identity_factory(23), dialer_service, bootstrap)
    await wait_for(lambda: relay_service.offering and len(relay.peers) == 2)

    # Identify tells the listener that the relay speaks hop; then one check reserves a slot there.
    await wait_for(lambda: listener_service.relay_candidates() == [relay.peer_id])
    await listener_service.adjust(nursery)
    assert list(listener_service.reserved) == [relay.peer_id]
    [relay_addr] = listener_service.relay_addrs()
    assert relay_addr.endswith(f"/p2p/{relay.peer_id}/p2p-circuit/p2p/{listener.peer_id}")
    assert listener.status()["relay"]["reservations"] == [relay.peer_id]

    # The dialer knows a direct address that leads nowhere (TEST-NET-1) and the relay address: the
    # relayed dial runs beside the direct one and connects ...
    assert await dialer_service.connect(listener.peer_id, ["/ip4/192.0.2.1/tcp/4001", relay_addr]) == "relayed"
    ping = dialer.services[0]
    assert await ping.ping(listener.peer_id) > 0
    # ... and DCUtR finds the direct path (on loopback there is no NAT in the way).
    await wait_for(lambda: dialer_service.connection_kind(listener.peer_id) == "direct", timeout=20)
    assert await ping.ping(listener.peer_id) > 0
    # `locomesh peers` tells the upgraded connection from one that was direct from the start.
    kinds = {peer["peer_id"]: peer["connection"] for peer in dialer.peer_list()}
    assert kinds == {relay.peer_id: "direct", listener.peer_id: "hole-punched"}
    assert {peer["peer_id"]: peer["connection"] for peer in listener.peer_list()}[dialer.peer_id] == "hole-punched"
    for node in (relay, listener, dialer):
        node.request_stop()


async def test_one_circuit_ending_leaves_the_others_through_the_same_relay_alive(nursery, identity_factory):
    """py-libp2p's relay ended the newest circuit of a peer whenever any of its circuits ended
    (`locomesh.node.nat.circuit_relay`): two dialers reach one private node through one relay,
    the first hangs up, the second's relayed connection must still carry pings."""
    relay_service = RelayService(lambda: PUBLIC, hole_punch=False)
    relay = await start(nursery, identity_factory(31), relay_service)
    bootstrap = [Multiaddr(relay.listen_addresses()[0])]
    listener_service = RelayService(lambda: PRIVATE, hole_punch=False)
    listener = await start(nursery, identity_factory(32), listener_service, bootstrap)
    dialers = []
    for seed in (33, 34):
        service = RelayService(lambda: PRIVATE, reservations=0, hole_punch=False)
        dialers.append((await start(nursery, identity_factory(seed), service, bootstrap), service))
    await wait_for(lambda: relay_service.offering and len(relay.peers) == 3)
    await wait_for(lambda: listener_service.relay_candidates() == [relay.peer_id])
    await listener_service.adjust(nursery)
    [relay_addr] = listener_service.relay_addrs()
    for dialer, service in dialers:
        assert await service.connect(listener.peer_id, [relay_addr]) == "relayed"
        assert await dialer.services[0].ping(listener.peer_id) > 0

    (first, _), (second, second_service) = dialers
    await first.host.disconnect(ID.from_base58(listener.peer_id))
    await wait_for(lambda: listener.peer_id not in first.peers)
    await trio.sleep(1.0)  # what the relay does with the ended circuit, it has done by now
    assert second_service.connection_kind(listener.peer_id) == "relayed"
    for _ in range(3):
        assert await second.services[0].ping(listener.peer_id) > 0
    for node in (relay, listener, first, second):
        node.request_stop()


async def test_a_circuit_past_its_duration_cap_is_cut(nursery, identity_factory):
    relay_service = RelayService(lambda: PUBLIC, hole_punch=False, bounds=RelayBounds(circuit_seconds=2))
    relay = await start(nursery, identity_factory(41), relay_service)
    bootstrap = [Multiaddr(relay.listen_addresses()[0])]
    listener_service = RelayService(lambda: PRIVATE, hole_punch=False)
    listener = await start(nursery, identity_factory(42), listener_service, bootstrap)
    dialer_service = RelayService(lambda: PRIVATE, reservations=0, hole_punch=False)
    dialer = await start(nursery, identity_factory(43), dialer_service, bootstrap)
    await wait_for(lambda: relay_service.offering and len(relay.peers) == 2)
    await wait_for(lambda: listener_service.relay_candidates() == [relay.peer_id])
    await listener_service.adjust(nursery)
    assert await dialer_service.connect(listener.peer_id, listener_service.relay_addrs()) == "relayed"
    assert await dialer.services[0].ping(listener.peer_id) > 0
    await wait_for(lambda: listener.peer_id not in dialer.peers, timeout=10)  # cut at 2 s, idle or not
    for node in (relay, listener, dialer):
        node.request_stop()


def test_status_and_peers_tables_show_nat_traversal():
    from locomesh.cli.status_cmd import format_peers, format_status

    peers = [
        {"peer_id": "12D3KooWA", "direction": "outbound", "connection": "hole-punched", "connected_since": 0.0,
         "connection_addrs": ["/ip4/11.0.0.12/tcp/4001"]},
        {"peer_id": "12D3KooWB", "direction": "inbound", "connection": "relayed", "connected_since": 0.0},
    ]
    lines = format_peers(peers).splitlines()
    assert lines[0].split() == ["PEER", "ID", "DIRECTION", "CONNECTION", "CONNECTED", "SINCE", "ADDRESS"]
    assert lines[1].split()[2] == "hole-punched" and lines[2].split()[2] == "relayed"
    status = {
        "reachability": {"verdict": "private", "confirmed_addrs": [], "probes_pending": 0, "evidence": []},
        "relay": {"mode": "auto", "offering": False, "active_circuits": 0, "reservations": ["12D3KooWR"],
                  "relay_addrs": ["/ip4/11.0.0.1/tcp/4001/p2p/12D3KooWR/p2p-circuit/p2p/12D3KooWX"]},
    }
    text = format_status(status)
    assert "reachability     private" in text
    assert "relay            not offering; reserved on 1 relay(s)" in text
    assert "relayed at       /ip4/11.0.0.1/tcp/4001/p2p/12D3KooWR/p2p-circuit/p2p/12D3KooWX" in text
