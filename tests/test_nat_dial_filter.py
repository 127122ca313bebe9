"""Issue #34: what a peer can make a node dial. Dial-backs and hole punches go to public unicast
addresses only (unless `allow_private_addrs`, for tests and local swarms), capped in number, one
punch session per peer and a bounded number in all. The dial-back handler's test is in test_reach.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from locomesh.node.addresses import addrs_at_ip, dial_back_targets, may_dial, punch_targets
from locomesh.node.nat.hole_punch import (
    DIRECT_DIAL_TIMEOUT, MAX_CANDIDATES, MAX_PUNCH_ADDRS, MAX_PUNCH_SESSIONS, PUNCH_ROUND_TIMEOUT, HolePuncher,
)
from locomesh.node.nat.reach_service import MAX_DIAL_ADDRS

PEER = ID(b"\x00\x02\x01\x02")  # any peer ID will do: nothing checks it here
LOCAL = ["127.0.0.1", "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1", "169.254.1.1", "::1", "fe80::1",
         "fc00::1", "0.0.0.0", "::", "::ffff:127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1", "192.0.2.1",
         "::7f00:1", "64:ff9b:1::7f00:1"]
NOT_UNICAST = ["224.0.0.1", "239.1.2.3", "255.255.255.255", "ff0e::1"]
SHARED = "100.64.0.1"  # a carrier NAT's inside: homes behind one carrier punch each other there


# --- the filter, sans-IO ------------------------------------------------------------------------


@pytest.mark.parametrize("ip", LOCAL + NOT_UNICAST)
def test_only_public_unicast_addresses_may_be_dialled_by_default(ip):
    assert not may_dial(ip)
    assert may_dial(ip, allow_private_addrs=True) == (ip not in NOT_UNICAST + ["0.0.0.0", "::"])


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.2.3.4", "2606:4700::1", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_public_unicast_addresses_may_be_dialled(ip):
    assert may_dial(ip) and may_dial(ip, allow_private_addrs=True)


def test_a_helper_forwards_nothing_for_a_peer_seen_at_a_private_address():
    named = ["/ip4/127.0.0.1/tcp/22", "/ip4/8.8.8.8/tcp/4001"]
    assert addrs_at_ip(named, "127.0.0.1", limit=3) == []
    assert addrs_at_ip(named, "10.0.0.7", limit=3) == []
    assert addrs_at_ip(named, "127.0.0.1", limit=3, allow_private_addrs=True) == [
        "/ip4/127.0.0.1/tcp/22", "/ip4/127.0.0.1/tcp/4001"
    ]


def test_a_dialer_dials_back_public_addresses_at_one_ip_only_and_a_few():
    named = [
        "/ip4/127.0.0.1/tcp/22",  # the dialer's own host
        "/ip4/192.168.1.1/tcp/80",  # its LAN
        "/dns4/localhost/tcp/1",  # not plain TCP
        "/ip4/8.8.8.8/tcp/4001/p2p/12D3KooWx",  # the first public one: its IP is the one dialled
        "/ip4/9.9.9.9/tcp/4001",  # a second host
        "/ip4/8.8.8.8/tcp/4001",  # a repeat
        "/ip4/8.8.8.8/tcp/4002", "/ip4/8.8.8.8/tcp/4003", "/ip4/8.8.8.8/tcp/4004",
    ]
    assert dial_back_targets(named, limit=MAX_DIAL_ADDRS) == [
        "/ip4/8.8.8.8/tcp/4001", "/ip4/8.8.8.8/tcp/4002", "/ip4/8.8.8.8/tcp/4003"
    ][:MAX_DIAL_ADDRS]
    assert dial_back_targets(named[:3], limit=MAX_DIAL_ADDRS) == []
    assert dial_back_targets(named[:3], limit=MAX_DIAL_ADDRS, allow_private_addrs=True) == ["/ip4/127.0.0.1/tcp/22"]


def test_punch_targets_are_public_not_ours_and_capped():
    named = [f"/ip4/{ip}/tcp/4001" for ip in LOCAL if ip != SHARED] + [f"/ip4/1.2.3.{n}/tcp/4001" for n in range(10)]
    own = frozenset({"/ip4/1.2.3.0/tcp/4001"})
    targets = punch_targets(named, limit=MAX_CANDIDATES, own=own)
    assert targets == [f"/ip4/1.2.3.{n}/tcp/4001" for n in range(1, MAX_CANDIDATES + 1)]
    assert punch_targets(["/ip4/127.0.0.1/tcp/1"], limit=4, allow_private_addrs=True) == ["/ip4/127.0.0.1/tcp/1"]


def test_a_punch_may_go_to_the_carrier_shared_space_a_dial_back_may_not():
    named = [f"/ip4/{SHARED}/tcp/4001", "/ip4/::ffff:100.64.0.2/tcp/4001"]
    assert punch_targets(named, limit=4) == [f"/ip4/{SHARED}/tcp/4001"]
    assert dial_back_targets(named, limit=MAX_DIAL_ADDRS) == []
    assert addrs_at_ip(named, SHARED, limit=3) == []


# --- the hole puncher, over a stand-in host -----------------------------------------------------


class FakeNetwork:
    """Records every dial; every dial fails (nothing answers)."""

    def __init__(self) -> None:
        self.connections: dict = {}
        self.dialled: list[str] = []

    async def dial_addr(self, addr, peer_id, source=None):
        self.dialled.append(str(addr))
        raise OSError("connection refused")

    dial_addr_as_responder = dial_addr


class FakeHost:
    """The little of a py-libp2p host DCUtR touches: a peerstore that knows `known`, and `FakeNetwork`."""

    def __init__(self, known: list[str]) -> None:
        self.network = FakeNetwork()
        self.known = [Multiaddr(address) for address in known]
        self.peerstore = SimpleNamespace(addrs=lambda peer_id: list(self.known), add_addrs=lambda *args: None,
                                         peer_info=lambda peer_id: SimpleNamespace(addrs=[]))

    def get_network(self):
        return self.network

    def get_peerstore(self):
        return self.peerstore

    def get_id(self):
        return ID(b"\x00\x02\x09\x09")

    def get_addrs(self):
        return []

    def get_transport_addrs(self):
        return []


HOSTILE = ["/ip4/127.0.0.1/tcp/22", "/ip4/192.168.1.1/tcp/80", "/ip6/::1/tcp/631"] + [
    f"/ip4/8.8.{n}.8/tcp/4001" for n in range(12)
]


def test_a_connect_message_keeps_only_a_few_public_addresses():
    puncher = HolePuncher(FakeHost([]))
    decoded = puncher._decode_observed_addrs([Multiaddr(address).to_bytes() for address in HOSTILE])
    assert [str(address) for address in decoded] == [f"/ip4/8.8.{n}.8/tcp/4001" for n in range(MAX_CANDIDATES)]


async def test_a_punch_dials_only_public_addresses_and_a_few(autojump_clock):
    host = FakeHost(HOSTILE[::-1])  # what Identify and peer records told us of the peer
    puncher = HolePuncher(host)
    named = [Multiaddr(address) for address in HOSTILE]  # as if a CONNECT had not been filtered
    for attempt in (puncher._perform_hole_punch(PEER, named), puncher._try_unilateral_upgrade(PEER)):
        host.network.dialled.clear()
        assert not await attempt
        dialled = set(host.network.dialled)
        assert dialled and all(address.startswith("/ip4/8.8.") for address in dialled)
        assert len(dialled) <= MAX_PUNCH_ADDRS


async def test_private_addresses_are_punched_only_when_allowed(autojump_clock):
    host = FakeHost(["/ip4/127.0.0.1/tcp/4001"])
    assert not await HolePuncher(host)._try_unilateral_upgrade(PEER)
    assert host.network.dialled == []
    assert not await HolePuncher(host, allow_private_addrs=True)._try_unilateral_upgrade(PEER)
    assert host.network.dialled == ["/ip4/127.0.0.1/tcp/4001"]


async def test_a_try_gives_up_on_dropped_syns_soon_and_punches_one_round(autojump_clock):
    """The next session's plain dial is what gets through after a failed punch (hole_punch.py): a try must not
    sit out py-libp2p's whole dial timeout on SYNs a NAT drops, nor two more rounds that fail as the first did."""
    host = FakeHost(["/ip4/8.8.8.8/tcp/4001"])

    async def dropped(addr, peer_id, source=None):
        host.network.dialled.append(str(addr))
        await trio.sleep_forever()

    host.network.dial_addr = host.network.dial_addr_as_responder = dropped
    puncher = HolePuncher(host)
    started = trio.current_time()
    assert not await puncher._try_unilateral_upgrade(PEER)
    assert trio.current_time() - started == pytest.approx(DIRECT_DIAL_TIMEOUT, abs=0.5)
    started = trio.current_time()
    assert not await puncher._perform_hole_punch(PEER, [Multiaddr("/ip4/8.8.8.8/tcp/4001")], as_responder=True)
    assert trio.current_time() - started == pytest.approx(PUNCH_ROUND_TIMEOUT, abs=0.5)
    assert host.network.dialled == ["/ip4/8.8.8.8/tcp/4001"] * 2


class FakeStream:
    def __init__(self, peer_id: ID) -> None:
        self.muxed_conn = SimpleNamespace(peer_id=peer_id)
        self.events: list[str] = []

    async def read(self, n: int = -1) -> bytes:
        self.events.append("read")
        return b""

    async def write(self, data: bytes) -> None:
        self.events.append("write")

    async def close(self) -> None:
        self.events.append("close")

    async def reset(self) -> None:
        self.events.append("reset")


async def test_one_punch_session_per_peer_and_a_bounded_number_in_all():
    puncher = HolePuncher(FakeHost([]))
    puncher._in_progress.add(PEER)  # a session with this peer runs: a second one is refused unread
    second = FakeStream(PEER)
    await puncher._handle_dcutr_stream(second)
    assert second.events == ["reset"]
    puncher._in_progress = {ID(bytes([0, 2, 7, n])) for n in range(MAX_PUNCH_SESSIONS)}
    other = FakeStream(ID(b"\x00\x02\x08\x08"))
    await puncher._handle_dcutr_stream(other)
    assert other.events == ["reset"]
    puncher._in_progress.clear()
    free = FakeStream(ID(b"\x00\x02\x08\x08"))
    await puncher._handle_dcutr_stream(free)
    assert free.events and free.events[0] == "read"  # under the caps, the session is answered
