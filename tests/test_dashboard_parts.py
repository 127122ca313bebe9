"""The dashboard's parts without a server: login tokens, sessions, CSRF and origin checks, the traffic
ring buffer, and pings while someone looks (with the per-connection byte counts of a real node)."""

from __future__ import annotations

from multiaddr import Multiaddr

from locomesh.node.dashboard.auth import MAX_SESSIONS, MAX_TOKENS, LoginTokens, Sessions, same_origin
from locomesh.node.dashboard.telemetry import Telemetry, TrafficHistory
from locomesh.node.ping import PingService
from locomesh.node.runtime import Node

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_login_token_works_once_and_only_in_time():
    clock = Clock()
    tokens = LoginTokens(now=clock, ttl=60)
    first, second = tokens.issue(), tokens.issue()
    assert first != second and len(first) >= 40
    assert tokens.redeem(first) and not tokens.redeem(first)  # used up
    clock.now += 61
    assert not tokens.redeem(second)  # expired
    for bad in (None, "", "x" * 10_000, first + "x"):
        assert not tokens.redeem(bad)


def test_only_the_newest_tokens_are_kept():
    tokens = LoginTokens(now=Clock())
    issued = [tokens.issue() for _ in range(MAX_TOKENS + 3)]
    assert not any(tokens.redeem(token) for token in issued[:3])
    assert all(tokens.redeem(token) for token in issued[3:])


def test_sessions_expire_close_and_are_bounded():
    clock = Clock()
    sessions = Sessions(now=clock, ttl=3600)
    session_id, session = sessions.open()
    assert sessions.get(session_id) is session and sessions.get(session_id + "x") is None
    assert session.csrf_matches(session.csrf) and not session.csrf_matches(None)
    assert not session.csrf_matches(session.csrf[:-1]) and not session.csrf_matches("é" * 40)
    clock.now += 3600
    assert sessions.get(session_id) is None and len(sessions) == 0
    opened = [sessions.open()[0] for _ in range(MAX_SESSIONS + 2)]
    assert sessions.get(opened[0]) is None and sessions.get(opened[-1]) is not None
    sessions.close(opened[-1])
    assert sessions.get(opened[-1]) is None


def test_same_origin_trusts_the_browser_headers_it_gets():
    host = "127.0.0.1:8080"
    assert same_origin(None, None, host)  # no headers: the CSRF token decides
    assert same_origin("http://127.0.0.1:8080", "same-origin", host)
    assert not same_origin("http://evil.example", None, host)
    assert not same_origin("http://127.0.0.1:8081", None, host)
    assert not same_origin("null", None, host)
    assert not same_origin(None, "cross-site", host) and not same_origin(None, "same-site", host)


def test_the_traffic_history_is_a_bounded_ring():
    history = TrafficHistory(size=3)
    for second in range(5):
        history.add(float(second), second * 10, second * 20, 1)
    assert history.since(0) == [(2.0, 20, 40, 1), (3.0, 30, 60, 1), (4.0, 40, 80, 1)]
    assert history.since(3.0) == [(4.0, 40, 80, 1)]


class CountingPing:
    """A node's real ping service, counting the pings asked of it."""

    def __init__(self, service: PingService) -> None:
        self.service = service
        self.pings = 0

    async def ping(self, peer_id: str) -> float:
        self.pings += 1
        return await self.service.ping(peer_id)


async def test_telemetry_pings_peers_only_while_someone_looks(nursery, identity_factory):
    nodes, pings = [], [PingService(), PingService()]
    for index, service in zip((1, 2), pings):
        node = Node.create(identity_factory(index), listen_addrs=[Multiaddr(LOOPBACK)], services=[service])
        await nursery.start(node.run)
        nodes.append(node)
    first, second = nodes
    await first.connect(Multiaddr(second.listen_addresses()[0]))
    counting = CountingPing(pings[0])
    telemetry = Telemetry(first, ping=counting)
    await telemetry.ping_due_peers()
    assert telemetry.round_trips == {} and counting.pings == 0  # nobody has asked for node.traffic yet
    await telemetry.rpc_traffic()
    await telemetry.ping_due_peers()
    traffic = await telemetry.rpc_traffic()
    peer = traffic["peers"][second.peer_id]
    assert peer["rtt_ms"] > 0 and peer["rtt_age_s"] >= 0
    assert peer["bytes_in"] > 0 and peer["bytes_out"] > 0  # this connection's own wire bytes
    assert peer["bytes_in"] <= first.meter.bytes_in and peer["bytes_out"] <= first.meter.bytes_out
    await telemetry.ping_due_peers()  # measured just now: not due again
    assert counting.pings == 1
    for node in nodes:
        node.request_stop()
