"""The dial-back reachability check: the sans-IO verdict, its limits, and three real nodes on loopback."""

from __future__ import annotations

import random
import socket

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.addresses import addrs_at_ip, is_private_ip, remote_ip, tcp_endpoint
from locomesh.node.nat.reach_service import PROTOCOL_ID, ReachabilityService
from locomesh.node.nat.reachability import PRIVATE, PUBLIC, UNKNOWN, ProbeState, RateLimiter, ReachabilityTracker
from locomesh.node.runtime import Node
from locomesh.node.streams import read_frame, write_frame
from locomesh.protocol import ProtocolError, decode, encode
from locomesh.protocol.kinds import REACH_DELEGATE, REACH_RESULT

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
NONCE_A, NONCE_B, NONCE_C = b"a" * 16, b"b" * 16, b"c" * 16


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# --- addresses ---------------------------------------------------------------------------------


def test_tcp_endpoint_reads_plain_tcp_only():
    assert tcp_endpoint("/ip4/1.2.3.4/tcp/4001") == ("1.2.3.4", 4001)
    assert tcp_endpoint("/ip6/::1/tcp/9/p2p/12D3KooWabc") == ("::1", 9)
    for bad in (
        "/dns4/example.com/tcp/1",
        "/ip4/1.2.3.4/udp/1",
        "/ip4/1.2.3.4/tcp/0",
        "/ip4/1.2.3.4/tcp/70000",
        "/ip4/::1/tcp/1",
        "/ip4/1.2.3.4/tcp/1/p2p-circuit/p2p/x",
        "/ip4/1.2.3.4/tcp/1/p2p/",
        "ip4/1.2.3.4/tcp/1",
    ):
        assert tcp_endpoint(bad) is None, bad


def test_only_the_observed_ip_is_dialled_at_the_named_ports():
    named = ["/ip4/10.0.0.5/tcp/1", "/ip4/8.8.8.8/tcp/2/p2p/12D3KooWx", "/dns4/x.org/tcp/4", "/ip4/8.8.8.8/tcp/2"]
    assert addrs_at_ip(named, "8.8.8.8", limit=5) == ["/ip4/8.8.8.8/tcp/2", "/ip4/8.8.8.8/tcp/1"]
    assert addrs_at_ip(named, "8.8.8.8", limit=1) == ["/ip4/8.8.8.8/tcp/2"]
    assert addrs_at_ip(named, None, limit=5) == [] and addrs_at_ip(named, "nonsense", limit=5) == []
    assert remote_ip(["/ip4/8.8.8.8/tcp/2"]) == "8.8.8.8"
    assert remote_ip(["/p2p/12D3KooWr/p2p-circuit/p2p/12D3KooWx"]) is None
    assert is_private_ip("10.1.2.3") and is_private_ip("127.0.0.1") and not is_private_ip("8.8.8.8")


# --- the verdict ------------------------------------------------------------------------------


def test_a_dialback_makes_us_public_and_nothing_undoes_it():
    clock = Clock()
    tracker = ReachabilityTracker(now=clock)
    tracker.start_probe(NONCE_A, "B", ["/ip4/8.8.8.8/tcp/1"])
    assert tracker.verdict() == UNKNOWN and tracker.pending_helpers() == {"B"}
    clock.t += 1
    assert tracker.on_dialback(NONCE_A, "/ip4/8.8.8.8/tcp/1", "C", opened_at=clock.t)
    assert not tracker.on_result(NONCE_A, "B", "unreachable", "/ip4/8.8.8.8/tcp/1", "C")  # too late to refute
    assert tracker.verdict() == PUBLIC
    status = tracker.status()
    assert status["confirmed_addrs"] == ["/ip4/8.8.8.8/tcp/1"]
    assert status["evidence"][0] | {"at": 0} == {
        "outcome": "confirmed", "helper": "B", "dialer": "C", "addr": "/ip4/8.8.8.8/tcp/1", "at": 0
    }


def test_a_strangers_inbound_connection_makes_us_public_once_per_stranger():
    clock = Clock()
    tracker = ReachabilityTracker(now=clock)
    tracker.on_stranger("/ip4/11.0.0.1/tcp/4001", "C")
    tracker.on_stranger("/ip4/11.0.0.1/tcp/4001", "C")  # the same stranger again: one piece of evidence
    assert tracker.verdict() == PUBLIC and tracker.confirmed_addrs() == ["/ip4/11.0.0.1/tcp/4001"]
    assert [(e["outcome"], e["helper"], e["dialer"]) for e in tracker.status()["evidence"]] == [("confirmed", "", "C")]
    clock.t += tracker.window + 1  # old evidence expires like any probe's
    assert tracker.verdict() == UNKNOWN


def test_dialbacks_that_prove_nothing_are_refused():
    clock = Clock()
    tracker = ReachabilityTracker(now=clock)
    tracker.start_probe(NONCE_A, "B", ["/ip4/8.8.8.8/tcp/1"])
    assert not tracker.on_dialback(NONCE_B, "/ip4/8.8.8.8/tcp/1", "C", opened_at=clock.t)  # unknown nonce
    assert not tracker.on_dialback(NONCE_A, "/ip4/8.8.8.8/tcp/2", "C", opened_at=clock.t)  # port not probed
    assert not tracker.on_dialback(NONCE_A, "/ip4/8.8.8.8/tcp/1", "B", opened_at=clock.t)  # the helper itself
    assert not tracker.on_dialback(NONCE_A, "/ip4/8.8.8.8/tcp/1", "C", opened_at=clock.t - 5)  # an old connection
    assert not tracker.on_result(NONCE_A, "C", "unreachable", "", "")  # only the asked helper reports
    assert tracker.verdict() == UNKNOWN


def test_refutations_make_us_private_and_expire():
    clock = Clock()
    tracker = ReachabilityTracker(now=clock, min_refutations=2, window=100.0)
    tracker.start_probe(NONCE_A, "B", ["/ip4/8.8.8.8/tcp/1"])
    tracker.start_probe(NONCE_B, "D", ["/ip4/8.8.8.8/tcp/1"])
    tracker.start_probe(NONCE_C, "E", ["/ip4/8.8.8.8/tcp/1"])
    assert tracker.on_result(NONCE_A, "B", "unreachable", "/ip4/8.8.8.8/tcp/1", "C")
    assert tracker.verdict() == UNKNOWN  # one report is not enough
    assert tracker.on_result(NONCE_B, "D", "dialed", "/ip4/8.8.8.8/tcp/1", "C")  # a claim without proof: waits
    assert tracker.on_result(NONCE_C, "E", "no-address", "", "")
    assert tracker.verdict() == PRIVATE and tracker.decisive() == 2
    clock.t += 31
    tracker.expire()
    assert tracker.recent()[0].state is ProbeState.INCONCLUSIVE  # the unproved "dialed" timed out
    clock.t += 100
    assert tracker.verdict() == UNKNOWN  # evidence too old


def test_probes_are_bounded():
    tracker = ReachabilityTracker(now=Clock(), max_probes=3)
    for index in range(5):
        tracker.start_probe(bytes([index]) * 16, f"H{index}", [])
    assert tracker.pending_helpers() == {"H2", "H3", "H4"}
    with pytest.raises(ValueError):
        tracker.start_probe(bytes([4]) * 16, "H9", [])


def test_rate_limiter_refills_and_forgets():
    clock = Clock()
    limiter = RateLimiter(clock, burst=2, interval=10.0, max_keys=2)
    assert limiter.allow("p") and limiter.allow("p") and not limiter.allow("p")
    clock.t += 10
    assert limiter.allow("p") and not limiter.allow("p")
    assert limiter.allow("q") and limiter.allow("r")  # "p" is forgotten now: full bucket again
    assert limiter.allow("p")


# --- three real nodes on loopback ------------------------------------------------------------


def dead_address() -> str:
    """A loopback TCP port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"/ip4/127.0.0.1/tcp/{port}"


async def wait_for(condition, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.02)


async def start_mesh(nursery, identity_factory, asker_addresses=None, *, allow_private_addrs=True):
    """Helper B, dialer C and asker A; A and C are connected to B only.

    On loopback every address is private: the mesh allows them (`allow_private_addrs`) unless a test
    checks the default, public-only filter."""
    allowed = {"allow_private_addrs": True} if allow_private_addrs else {}  # else the default, as a public node has it
    services = [ReachabilityService(first_delay=3600, rng=random.Random(index), **allowed) for index in range(3)]
    if asker_addresses is not None:
        services[0] = ReachabilityService(first_delay=3600, addresses=lambda node: asker_addresses, **allowed)
    helper = Node.create(identity_factory(11), listen_addrs=LOOPBACK, services=[services[1]])
    await nursery.start(helper.run)
    bootstrap = [Multiaddr(helper.listen_addresses()[0])]
    dialer = Node.create(identity_factory(12), listen_addrs=LOOPBACK, services=[services[2]], bootstrap=bootstrap)
    asker = Node.create(identity_factory(13), listen_addrs=LOOPBACK, services=[services[0]], bootstrap=bootstrap)
    await nursery.start(dialer.run)
    await nursery.start(asker.run)
    # Both ends of each connection: an asker that does not yet see its helper asks no one.
    await wait_for(
        lambda: asker.peer_id in helper.peers
        and dialer.peer_id in helper.peers
        and helper.peer_id in asker.peers
        and helper.peer_id in dialer.peers
    )
    return (asker, services[0]), (helper, services[1]), (dialer, services[2])


async def test_a_listening_node_is_confirmed_public_by_a_dialer_it_did_not_know(nursery, identity_factory):
    (asker, service), (helper, _), (dialer, _) = await start_mesh(nursery, identity_factory)
    assert dialer.peer_id not in asker.peers
    assert await service.probe_round() == PUBLIC
    [evidence] = service.tracker.status()["evidence"]
    assert evidence["helper"] == helper.peer_id and evidence["dialer"] == dialer.peer_id
    assert evidence["addr"] == asker.listen_addresses()[0].split("/p2p/")[0]
    assert asker.status()["reachability"]["verdict"] == PUBLIC
    await wait_for(lambda: dialer.peer_id not in asker.peers)  # the dialer hung up afterwards
    for node in (asker, helper, dialer):
        node.request_stop()


async def test_a_node_at_a_dead_port_is_private(nursery, identity_factory):
    dead = dead_address()
    (asker, service), (helper, _), (dialer, _) = await start_mesh(nursery, identity_factory, [dead])
    assert await service.probe_round() == UNKNOWN  # one helper, one refutation so far
    await trio.sleep(0.1)
    assert await service.probe_round() == PRIVATE
    evidence = service.tracker.status()["evidence"]
    assert {(item["outcome"], item["addr"], item["dialer"]) for item in evidence} == {
        ("refuted", dead, dialer.peer_id)
    }
    for node in (asker, helper, dialer):
        node.request_stop()


async def test_addresses_at_another_ip_are_dialled_only_at_the_ip_we_come_from(nursery, identity_factory):
    dead_port = dead_address().rsplit("/", 1)[1]
    named = [f"/ip4/192.0.2.7/tcp/{dead_port}"]  # a documentation address: never dialled
    (asker, service), (helper, _), (dialer, _) = await start_mesh(nursery, identity_factory, named)
    assert await service.probe_round() == UNKNOWN
    [evidence] = service.tracker.status()["evidence"]
    assert evidence["outcome"] == "refuted" and evidence["addr"] == f"/ip4/127.0.0.1/tcp/{dead_port}"
    assert evidence["dialer"] == dialer.peer_id
    for node in (asker, helper, dialer):
        node.request_stop()


async def test_a_dialer_refuses_to_dial_a_connected_peer_or_a_forged_delegation(nursery, identity_factory):
    (asker, _), (helper, _), (dialer, _) = await start_mesh(nursery, identity_factory)

    async def delegate(signer, body) -> str:
        stream = await helper.open_stream(dialer.peer_id, [PROTOCOL_ID])
        await write_frame(stream, encode(signer, REACH_DELEGATE.name, body), timeout=5)
        reply = decode(await read_frame(stream, max_size=REACH_RESULT.max_size, timeout=5))
        return reply.body["outcome"]

    # The helper asks the dialer to dial a peer it is connected to (the helper): no dial-back happens.
    assert await delegate(helper.identity, {"nonce": NONCE_A, "target": helper.peer_id, "addrs": [dead_address()]}) == (
        "no-dialer"
    )
    # Delegations from one helper are rate-limited (6 at once): the 7th is turned down.
    dead = {"target": asker.peer_id, "addrs": [dead_address()]}
    outcomes = [await delegate(helper.identity, {"nonce": bytes([index]) * 16, **dead}) for index in range(7)]
    assert outcomes == ["unreachable"] * 6 + ["busy"]
    # A delegation signed by someone else than the stream's peer is a protocol error, counted by the dialer.
    with pytest.raises(ProtocolError):
        await delegate(asker.identity, {"nonce": NONCE_B, "target": asker.peer_id, "addrs": []})
    counter = dialer.metrics["locomesh_protocol_errors_total"]
    assert {labels[0]: value for labels, value in counter.samples()} == {"wrong-author": 1}
    for node in (asker, helper, dialer):
        node.request_stop()


async def test_a_delegation_naming_our_own_host_or_lan_dials_nothing_by_default(nursery, identity_factory):
    """Issue #34: the helper that delegates a dial-back may be the attacker, and its filter is then no filter.

    With the default, public-only filter the dialer opens no connection to a loopback, private or
    link-local address a helper names (so no peer can probe the ports of the dialer's host or LAN),
    and answers ``no-address``. A local TCP server stands for a service on the dialer's host."""
    accepted = []

    async def count(stream) -> None:
        accepted.append(1)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, count, listeners)
    (asker, _), (helper, _), (dialer, _) = await start_mesh(nursery, identity_factory, allow_private_addrs=False)
    local = [f"/ip4/127.0.0.1/tcp/{port}", f"/ip4/10.0.0.1/tcp/{port}", f"/ip6/fe80::1/tcp/{port}"]
    stream = await helper.open_stream(dialer.peer_id, [PROTOCOL_ID])
    body = {"nonce": NONCE_C, "target": asker.peer_id, "addrs": local}
    await write_frame(stream, encode(helper.identity, REACH_DELEGATE.name, body), timeout=5)
    reply = decode(await read_frame(stream, max_size=REACH_RESULT.max_size, timeout=30))
    assert reply.body["outcome"] == "no-address"
    await trio.sleep(0.2)
    assert accepted == []
    for node in (asker, helper, dialer):
        node.request_stop()
