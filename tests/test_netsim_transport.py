"""The simulated link: bytes intact and in order, latency, bandwidth, back-pressure, loss, routing."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from libp2p.transport.exceptions import OpenConnectionError

from locomesh.netsim.links import Capacity, Direction, LinkProfile, Serializer
from locomesh.netsim.nat import NatType
from locomesh.netsim.network import DialOutcome, Network
from locomesh.netsim.pipe import ConnectionBroken, Pipe
from locomesh.netsim.transport import SimTransport, endpoint_of, multiaddr_of
from locomesh.netsim.wakeups import Wakeups


def pipe(**profile: float) -> Pipe:
    return Pipe(Direction(LinkProfile(**profile), random.Random(0)))


async def read_all(p: Pipe, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await p.read(4096)
    return data


async def test_bytes_arrive_intact_in_order_after_the_latency(autojump_clock):
    p = pipe(latency=0.05, jitter=0.01)
    payload = random.Random(1).randbytes(100_000)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.write, payload)
        first = await p.read(10)
        first_at = trio.current_time() - start
        rest = await read_all(p, len(payload) - 10)
    assert first + rest == payload
    assert 0.05 <= first_at <= 0.06


async def test_bandwidth_gives_the_serialization_delay(autojump_clock):
    p = pipe(latency=0.01, bandwidth=100_000, buffer=1_000_000)
    start = trio.current_time()
    await p.write(b"x" * 50_000)  # 0.5 s on the wire, then 10 ms of flight
    assert await read_all(p, 50_000) == b"x" * 50_000
    assert trio.current_time() - start == pytest.approx(0.51)


async def test_a_full_buffer_blocks_the_writer_until_the_reader_reads(autojump_clock):
    p = pipe(latency=0.01, buffer=1000)
    await p.write(b"a" * 1000)
    with trio.move_on_after(5) as waited:
        await p.write(b"b")
    assert waited.cancelled_caught, "the writer should wait while 1000 bytes are in flight"
    assert p.in_flight == 1000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.write, b"b")
        assert await p.read(500) == b"a" * 500
        assert await read_all(p, 501) == b"a" * 500 + b"b"


async def test_loss_delays_by_retransmission_timeouts(autojump_clock):
    direction = Direction(LinkProfile(latency=0.01, loss=0.5), random.Random(3))
    delays = [direction.arrival(0.0, 1460) for _ in range(200)]
    extra = sorted({round(d - 0.01, 6) for d in delays})
    assert extra[0] == 0.0 and all(round(e / 0.2, 6).is_integer() for e in extra)
    assert delays == sorted(delays), "a stream delivers in order: arrival times never go back"


def test_node_capacity_is_shared_by_its_connections():
    uplink = Serializer(1000.0)  # 1000 B/s shared
    a = Direction(LinkProfile(latency=0.0), random.Random(0), uplink=uplink)
    b = Direction(LinkProfile(latency=0.0), random.Random(0), uplink=uplink)
    assert a.arrival(0.0, 500) == pytest.approx(0.5)
    assert b.arrival(0.0, 500) == pytest.approx(1.0), "the second connection queues behind the first"


async def test_close_gives_end_of_stream_and_a_reset_gives_an_error(autojump_clock):
    p = pipe(latency=0.02)
    await p.write(b"last")
    p.close()
    assert await p.read() == b"last"
    assert await p.read() == b""
    q = pipe(latency=0.02)
    q.break_("crash")
    with pytest.raises(ConnectionBroken):
        await q.read()


async def test_dial_takes_a_round_trip_and_connects_the_listener(autojump_clock):
    network = Network(0)
    a = network.attach("a", profile=LinkProfile(latency=0.03))
    b = network.attach("b", profile=LinkProfile(latency=0.02))
    accepted = []
    network.listen(b, b.port, accepted.append)
    start = trio.current_time()
    stream = await network.connect(a, b.endpoint)
    assert trio.current_time() - start == pytest.approx(0.1)
    await stream.write(b"ping")
    assert await accepted[0].read() == b"ping"
    assert accepted[0].get_remote_address() == a.endpoint
    assert network.dials[-1].outcome is DialOutcome.DIRECT


async def test_refused_and_unroutable_dials_fail(autojump_clock):
    network = Network(0, syn_timeout=5.0)
    a = network.attach("a")
    b = network.attach("b")
    with pytest.raises(OpenConnectionError, match="refused"):
        await network.connect(a, b.endpoint)  # nobody listens
    start = trio.current_time()
    with pytest.raises(OpenConnectionError, match="dropped"):
        await network.connect(a, ("9.9.9.9", 4001))
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_partition_resets_connections_and_drops_dials_until_healed(autojump_clock):
    network = Network(0, syn_timeout=2.0)
    a, b = network.attach("a"), network.attach("b")
    network.listen(b, b.port, lambda stream: None)
    stream = await network.connect(a, b.endpoint)
    network.partition(["a"], ["b"])
    with pytest.raises(ConnectionBroken):
        await stream.write(b"x")
    with pytest.raises(OpenConnectionError, match="dropped"):
        await network.connect(a, b.endpoint)
    network.heal()
    await network.connect(a, b.endpoint)


async def test_outbound_through_a_nat_appears_from_the_mapped_address(autojump_clock):
    network = Network(0)
    box = network.add_nat(NatType.PORT_RESTRICTED)
    inside = network.attach("inside", nat=box)
    server = network.attach("server")
    accepted = []
    network.listen(server, server.port, accepted.append)
    await network.connect(inside, server.endpoint)
    seen = accepted[0].get_remote_address()
    assert seen[0] == box.public_ip and seen != inside.endpoint
    assert box.inbound(seen[1], server.endpoint) == inside.endpoint


async def test_transport_speaks_multiaddrs(autojump_clock):
    network = Network(0)
    a = network.attach("a")
    transport = SimTransport(network, a)
    assert transport.can_dial(multiaddr_of(("1.2.3.4", 4001)))
    from multiaddr import Multiaddr

    assert not transport.can_dial(Multiaddr("/ip4/1.2.3.4/udp/4001/quic-v1"))
    assert endpoint_of(Multiaddr("/ip4/1.2.3.4/tcp/5")) == ("1.2.3.4", 5)


def test_capacity_and_profile_validation():
    with pytest.raises(ValueError):
        LinkProfile(loss=1.0)
    with pytest.raises(ValueError):
        LinkProfile(bandwidth=0)
    assert Capacity().upload is None


class CountingWakeups(Wakeups):
    def __init__(self, tick: float) -> None:
        super().__init__(tick)
        self.asked: list[float] = []

    def wake_at(self, instant: float, lot: trio.lowlevel.ParkingLot) -> None:
        self.asked.append(instant)
        super().wake_at(instant, lot)


async def test_arrivals_lie_on_the_delivery_grid_and_a_reader_is_woken_once_per_chunk(autojump_clock):
    wakeups = CountingWakeups(tick=0.001)
    p = Pipe(Direction(LinkProfile(latency=0.0104), random.Random(0)), wakeups)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.write, b"abc")
        assert await p.read() == b"abc"  # parks before the write: nothing there yet
    assert trio.current_time() - start == pytest.approx(0.011), "10.4 ms rounded up to the 1 ms grid"
    assert wakeups.asked == [pytest.approx(start + 0.011)], "one wake-up, at the arrival"


async def test_one_timer_serves_many_pipes_and_wakes_each_at_its_own_arrival(autojump_clock):
    wakeups = Wakeups(tick=0.0)
    latencies = [0.03, 0.01, 0.02, 0.01]
    pipes = [Pipe(Direction(LinkProfile(latency=latency), random.Random(0)), wakeups) for latency in latencies]
    arrived: dict[int, float] = {}

    async def reader(index: int) -> None:
        assert await pipes[index].read() == bytes([index])
        arrived[index] = trio.current_time()

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for index in range(len(pipes)):
            nursery.start_soon(reader, index)
        await trio.sleep(0.001)
        for index, p in enumerate(pipes):
            await p.write(bytes([index]))
    assert [round(arrived[i] - start, 6) for i in range(len(pipes))] == [0.031, 0.011, 0.021, 0.011]


def test_rounding_up_to_the_grid_keeps_grid_instants_and_order():
    wakeups = Wakeups(tick=0.001)
    assert wakeups.round_up(0.003) == pytest.approx(0.003) and wakeups.round_up(0.0030001) == pytest.approx(0.004)
    instants = sorted(random.Random(5).uniform(0, 10) for _ in range(1000))
    rounded = [wakeups.round_up(t) for t in instants]
    assert rounded == sorted(rounded) and all(0 <= r - t < 0.001 + 1e-9 for r, t in zip(rounded, instants))
    assert Wakeups(tick=0).round_up(0.0123456) == 0.0123456
    with pytest.raises(ValueError):
        Wakeups(tick=-1)


def test_a_wakeups_timer_works_again_in_a_later_trio_run():
    wakeups = Wakeups()

    async def one_delivery() -> bytes:
        p = Pipe(Direction(LinkProfile(latency=0.01), random.Random(0)), wakeups)
        await p.write(b"x")
        return await p.read()

    for _ in range(2):
        assert trio.run(one_delivery, clock=trio.testing.MockClock(autojump_threshold=0)) == b"x"
