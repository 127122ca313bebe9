"""Kept links, hole-punch candidates, and dials that never lead back to ourselves."""

from __future__ import annotations

import random

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.nat.hole_punch import MAX_CANDIDATES, punch_candidates
from locomesh.node.nat.link_keeper import BACKOFF_CAP, MAX_DIALS, MAX_KEPT, LinkKeeper
from locomesh.node.listen_port import ListenPortTCP, OwnAddressError, is_own_endpoint
from locomesh.node.nat.reachability import PRIVATE, PUBLIC
from locomesh.node.nat.relay_service import RelayService
from locomesh.node.ping import PingService
from locomesh.node.runtime import DialError, Node

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


# --- LinkKeeper: who to dial again, and when -------------------------------------------------


def test_a_lost_link_is_due_at_once_then_waits_a_growing_backoff():
    keeper = LinkKeeper(rng=random.Random(1))
    assert keeper.due(["a", "b"], connected={"a", "b"}, now=0.0) == []
    assert keeper.due(["a", "b"], connected={"a"}, now=1.0) == ["b"]
    assert keeper.due(["a", "b"], connected={"a"}, now=1.5) == []  # its dial is still under way
    keeper.finished("b", connected=False, now=2.0)
    waits = []
    for attempt in range(12):
        now = 10.0 + 100.0 * attempt
        [peer] = keeper.due(["a", "b"], connected={"a"}, now=now)
        keeper.finished(peer, connected=False, now=now)
        waits.append(keeper.links["b"].not_before - now)
    assert waits[0] < waits[3] <= BACKOFF_CAP and max(waits) <= BACKOFF_CAP
    keeper.due(["a", "b"], connected={"a", "b"}, now=5000.0)  # seen connected: the backoff starts afresh
    assert keeper.links["b"].backoff.failures == 0 and keeper.status(5000.0) == {}


def test_the_keeper_is_bounded_and_forgets_peers_no_longer_wanted():
    keeper = LinkKeeper(rng=random.Random(2))
    wanted = [f"p{index}" for index in range(MAX_KEPT + 10)]
    assert len(keeper.due(wanted, connected=set(), now=0.0)) == MAX_DIALS
    assert len(keeper.links) == MAX_KEPT
    assert keeper.due(["p0"], connected=set(), now=1.0) == [] and list(keeper.links) == ["p0"]
    keeper.finished("p1", connected=False, now=1.0)  # a peer forgotten meanwhile: nothing to do
    assert list(keeper.links) == ["p0"]


# --- what a hole punch advertises --------------------------------------------------------------


def test_punch_candidates_are_the_observed_mappings_first_and_never_private():
    observed = [("/ip4/11.0.0.20/tcp/3192", 2), ("/ip4/11.0.0.20/tcp/51000", 1), ("/ip4/100.64.0.3/tcp/4001", 3)]
    listening = ["/ip4/192.168.30.2/tcp/4001", "/ip4/11.0.0.20/tcp/3192", "/ip4/8.8.4.4/tcp/4001"]
    assert punch_candidates(observed, listening) == [
        "/ip4/11.0.0.20/tcp/3192", "/ip4/11.0.0.20/tcp/51000", "/ip4/8.8.4.4/tcp/4001",
    ]
    # No observation and no public listen address: nothing (no "outside IP + listen port" guess).
    assert punch_candidates([], ["/ip4/192.168.30.2/tcp/4001", "/ip4/127.0.0.1/tcp/4001"]) == []
    many = [(f"/ip4/11.0.0.{index}/tcp/4001", 1) for index in range(1, 10)]
    assert len(punch_candidates(many, [])) == MAX_CANDIDATES


# --- never dialling ourselves ------------------------------------------------------------------


def test_own_endpoints_include_every_local_ip_of_a_wildcard_listener():
    assert is_own_endpoint(("192.168.30.2", 4001), [("192.168.30.2", 4001)])
    assert not is_own_endpoint(("192.168.30.2", 4002), [("192.168.30.2", 4001)])
    assert is_own_endpoint(("127.0.0.1", 4001), [("0.0.0.0", 4001)])
    assert not is_own_endpoint(("192.0.2.1", 4001), [("0.0.0.0", 4001)])  # TEST-NET-1: not ours


async def test_a_dial_to_our_own_listen_address_is_refused_before_any_socket(nursery, identity_factory):
    node = Node.create(identity_factory(51), listen_addrs=LOOPBACK, services=[PingService()])
    await nursery.start(node.run)
    [own] = node.listen_addresses()
    other = identity_factory(52)
    with pytest.raises(DialError):
        await node.connect(Multiaddr(own.split("/p2p/")[0] + f"/p2p/{Node.create(other, listen_addrs=LOOPBACK).peer_id}"))
    transport = ListenPortTCP()
    transport._listeners = [_FakeListener(own.split("/p2p/")[0])]
    with pytest.raises(OwnAddressError):
        await transport.dial(Multiaddr(own.split("/p2p/")[0]))
    node.request_stop()


class _FakeListener:
    """Stands in for a TCPListener's `get_addrs` only: the transport under test asks nothing else."""

    def __init__(self, address: str) -> None:
        self.address = address

    def get_addrs(self) -> tuple[Multiaddr, ...]:
        return (Multiaddr(self.address),)


# --- a relay that appears later is found; a kept link comes back ------------------------------


async def wait_for(condition, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.05)


async def test_a_node_that_starts_relaying_later_is_pushed_to_its_peers_and_reserved(nursery, identity_factory):
    """Peers learn a node's protocols when they meet it; one that turns public later pushes them again,
    and a private node then holds two reservations, one on each relay."""
    first_service = RelayService(lambda: PUBLIC)
    first = await _start(nursery, identity_factory(60), first_service)
    bootstrap = [Multiaddr(first.listen_addresses()[0])]
    verdict = {"now": PRIVATE}
    later_service = RelayService(lambda: verdict["now"])
    later = await _start(nursery, identity_factory(61), later_service, bootstrap)
    private_service = RelayService(lambda: PRIVATE)
    private = await _start(nursery, identity_factory(62), private_service, bootstrap)
    await private.connect(Multiaddr(later.listen_addresses()[0]))
    await wait_for(lambda: private_service.relay_candidates() == [first.peer_id])
    await trio.sleep(1.0)  # Identify with `later` has run: a peer without hop
    assert private_service.relay_candidates() == [first.peer_id]
    verdict["now"] = PUBLIC
    await later_service.adjust(nursery)
    await wait_for(lambda: set(private_service.relay_candidates()) == {first.peer_id, later.peer_id})
    await private_service.adjust(nursery)
    assert set(private_service.reserved) == {first.peer_id, later.peer_id}


async def test_a_kept_link_is_dialled_again_after_it_drops(nursery, identity_factory):
    first = RelayService(lambda: PUBLIC, hole_punch=False)
    a = await _start(nursery, identity_factory(71), first)
    second = RelayService(lambda: PUBLIC, hole_punch=False)
    b = await _start(nursery, identity_factory(72), second)  # no bootstrap: nothing else dials `a` again
    await b.connect(Multiaddr(a.listen_addresses()[0]))
    second.keep_linked(lambda: [a.peer_id])
    await b.host.disconnect(a.host.get_id())
    await wait_for(lambda: a.peer_id not in b.peers)
    await wait_for(lambda: a.peer_id in b.peers, timeout=20)  # no one asked: the keeper dialled
    assert second.links.links[a.peer_id].backoff.failures == 0


async def _start(nursery, identity, service, bootstrap=()) -> Node:
    node = Node.create(identity, listen_addrs=LOOPBACK, services=[PingService(), service], bootstrap=list(bootstrap))
    await nursery.start(node.run)
    return node
