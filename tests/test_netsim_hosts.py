"""Real py-libp2p hosts (built by the daemon's factory) over the simulated network."""

from __future__ import annotations

import json

import trio
from libp2p.stream_muxer.yamux.yamux import Yamux

from locomesh.netsim.flood import FLOOD_PROTOCOL, Flood
from locomesh.netsim.links import LinkProfile
from locomesh.netsim.report import to_json
from locomesh.netsim.scenarios import connectivity
from locomesh.netsim.simulation import Simulation, run_simulation

ECHO = "/test/echo/1.0.0"


async def echo(stream) -> None:
    data = await stream.read(1024)
    await stream.write(data[::-1])


def two_nodes(sim: Simulation, latency: float = 0.02):
    a = sim.add_node("a", profile=LinkProfile(latency=latency))
    b = sim.add_node("b", profile=LinkProfile(latency=latency))
    b.add_service(ECHO, echo)
    return a, b


async def two_running_nodes(sim: Simulation):
    a, b = two_nodes(sim)
    await sim.start(a)
    await sim.start(b)
    return a, b


async def echo_once(a, b) -> bytes | None:
    stream = await a.open_stream(b.peer_id, ECHO)
    if stream is None:
        return None
    await stream.write(b"hello")
    return await stream.read(1024)


def test_two_real_hosts_connect_with_noise_and_yamux_and_exchange_a_stream():
    async def main(sim: Simulation):
        a, b = await two_running_nodes(sim)
        start = trio.current_time()
        assert await a.connect(b.peer_id, b.listen_addr)
        connected_after = trio.current_time() - start
        reply = await echo_once(a, b)
        connection = a.host.get_network().get_connections(b.peer_id)[0]
        return reply, connected_after, type(connection.muxed_conn), type(connection.muxed_conn.secured_conn).__name__

    reply, connected_after, muxer, security = run_simulation(1, main)
    assert reply == b"olleh"
    assert muxer is Yamux
    assert "Noise" in security or "Secure" in security
    assert connected_after >= 0.08, "TCP, Noise and Yamux negotiation take several 40 ms round trips"


def test_partition_blocks_new_connections_and_heal_restores_them():
    async def main(sim: Simulation):
        a, b = await two_running_nodes(sim)
        sim.network.partition(["a"], ["b"])
        blocked = await a.connect(b.peer_id, b.listen_addr, timeout=8)
        sim.network.heal()
        healed = await a.connect(b.peer_id, b.listen_addr)
        return blocked, healed, await echo_once(a, b)

    assert run_simulation(2, main) == (False, True, b"olleh")


def test_crash_and_restart():
    async def main(sim: Simulation):
        a, b = await two_running_nodes(sim)
        assert await a.connect(b.peer_id, b.listen_addr)
        sim.crash(b)
        await trio.sleep(1)
        refused = await a.connect(b.peer_id, b.listen_addr, timeout=5)
        await sim.restart(b)
        await trio.sleep(61)  # py-libp2p blocks a peer for 60 s after a failed dial (virtual seconds here)
        back = await a.connect(b.peer_id, b.listen_addr)
        return refused, back, await echo_once(a, b)

    refused, back, reply = run_simulation(3, main)
    assert not refused and back and reply == b"olleh"


def test_a_byzantine_hook_corrupts_frames_and_the_receiver_rejects_them():
    async def main(sim: Simulation):
        a, b = two_nodes(sim)
        floods = {node.name: Flood(node) for node in (a, b)}
        for flood in floods.values():
            flood.serve()
        a.hooks.outgoing = lambda protocol, frame: frame.replace(b"honest", b"forged") if protocol == FLOOD_PROTOCOL else frame
        await sim.start(a)
        await sim.start(b)
        assert await a.connect(b.peer_id, b.listen_addr)
        floods["a"].attach(b.peer_id)
        await trio.sleep(1)
        ident = floods["a"].publish(b"honest words")
        await trio.sleep(1)
        return ident in floods["b"].arrivals, dict(b.errors)

    delivered, errors = run_simulation(4, main)
    assert not delivered
    assert errors.get("bad-id") == 1


SMALL = {"rounds": 2, "messages": 4, "settle": 5.0, "join_window": 10.0}


def test_connectivity_scenario_at_50_nodes_is_deterministic_by_seed():
    first = to_json(connectivity.run(nodes=50, seed=11, **SMALL))
    second = to_json(connectivity.run(nodes=50, seed=11, **SMALL))
    assert first == second
    parsed = json.loads(first)
    gossip = {row[0]: row[1] for row in parsed["tables"][2]["rows"]}
    assert gossip["delivery ratio"] > 0.9
    dials = parsed["tables"][0]
    pairs = [dict(zip(dials["columns"], row)) for row in dials["rows"]]
    assert any(row["nat-mapping"] > 0 for row in pairs), "some dials get in through a NAT mapping"
    assert any(row["failed"] > 0 for row in pairs), "some dials fail at a NAT"


def test_peer_exchange_reports_observed_addresses_and_counts_a_forged_reply():
    from locomesh.netsim.nat import NatType
    from locomesh.netsim.pex import PEX_PROTOCOL, PeerExchange

    async def main(sim: Simulation):
        box = sim.network.add_nat(NatType.SYMMETRIC)
        boot = sim.add_node("boot")
        inside = sim.add_node("inside", nat=box)
        liar = sim.add_node("liar")
        for node in (boot, liar):
            PeerExchange(node, sim.rng_for(node.name)).serve()
        liar.hooks.outgoing = lambda protocol, frame: b"\xc1" if protocol == PEX_PROTOCOL else frame
        for node in (boot, inside, liar):
            await sim.start(node)
        asker = PeerExchange(inside, sim.rng_for("inside"))
        assert await inside.connect(boot.peer_id, boot.listen_addr)
        observed, _ = await asker.ask(boot.peer_id, 8)
        assert await inside.connect(liar.peer_id, liar.listen_addr)
        forged = await asker.ask(liar.peer_id, 8)
        return observed, box.public_ip, forged, dict(inside.errors)

    observed, public_ip, forged, errors = run_simulation(8, main)
    assert observed[0] == public_ip, "the bootstrap sees the NAT's public address"
    assert forged is None and errors.get("pex-malformed") == 1


def test_a_graceful_stop_closes_the_connections():
    async def main(sim: Simulation):
        a, b = await two_running_nodes(sim)
        assert await a.connect(b.peer_id, b.listen_addr)
        b.stop()
        with trio.fail_after(10):
            await b.wait_stopped()
        await trio.sleep(1)
        return b.running, b.peer_id in a.connected_peers()

    assert run_simulation(9, main) == (False, False)


def test_connect_any_tries_each_address_in_turn_until_one_answers():
    """A participant's provider record may list an address nobody answers at before the one that
    works: each is dialled (py-libp2p's `host.connect` would try only one per transport)."""
    from multiaddr import Multiaddr

    from locomesh.netsim.transport import multiaddr_of
    from locomesh.node.runtime import DialError

    async def main(sim: Simulation):
        a, b = await two_running_nodes(sim)
        ip, port = b.listen_addr
        dead = Multiaddr(f"/ip4/{ip}/tcp/{port + 1}/p2p/{b.peer_id}")
        live = multiaddr_of(b.listen_addr).encapsulate(f"/p2p/{b.peer_id}")
        with trio.fail_after(30):
            worked = await a.node.connect_any([dead, live], timeout=5)
        absent = sim.add_node("absent")  # never started: nothing answers at its address
        nowhere = multiaddr_of(absent.listen_addr).encapsulate(f"/p2p/{absent.peer_id}")
        with trio.fail_after(30):
            try:
                wrong_port = Multiaddr(f"/ip4/{ip}/tcp/{port + 1}/p2p/{absent.peer_id}")
                await a.node.connect_any([wrong_port, nowhere], timeout=5)
                failed = ""
            except DialError as error:
                failed = str(error)
        return worked == live, b.peer_id in a.connected_peers(), await echo_once(a, b), failed

    worked, connected, reply, failed = run_simulation(10, main)
    assert worked and connected and reply == b"olleh"
    assert failed.count("no connection to") == 2, "both failures are named"


def test_yamux_returns_credit_in_batches_in_a_simulation_and_streams_still_flow():
    """go-yamux's rule (`libp2p_chores`): small reads send no WINDOW_UPDATE; a 1 MiB stream does not stall."""
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    from locomesh.netsim.libp2p_chores import libp2p_chores_retuned

    updates = []
    real_send = YamuxStream.send_window_update

    async def counting_send(self, increment: int, skip_lock: bool = False) -> None:
        updates.append(increment)
        await real_send(self, increment, skip_lock)

    expected = 100 * 100 + 64 * 16384

    async def sink(stream) -> None:
        total = 0
        while total < expected:
            total += len(await stream.read(65536))
        await stream.write(str(total).encode())

    async def main(sim: Simulation):
        a, b = two_nodes(sim)
        b.add_service("/test/sink/1.0.0", sink)
        await sim.start(a)
        await sim.start(b)
        assert await a.connect(b.peer_id, b.listen_addr)
        stream = await a.open_stream(b.peer_id, "/test/sink/1.0.0")
        updates.clear()  # (the stream's own negotiation reads come before)
        for _ in range(100):
            await stream.write(b"x" * 100)
        small_updates = len(updates)
        for _ in range(64):
            await stream.write(b"y" * 16384)
        return small_updates, await stream.read(64)

    YamuxStream.send_window_update = counting_send
    try:
        small_updates, answer = run_simulation(3, main)
    finally:
        YamuxStream.send_window_update = real_send
    assert answer == str(expected).encode()
    assert small_updates == 0, "100 small reads returned no credit one by one"
    assert 1 <= len(updates) <= 16, "1 MiB read: credit comes back in half-window batches"
    with libp2p_chores_retuned():
        pass
    assert YamuxStream._auto_tune_and_send_window_update.__name__ == "_auto_tune_and_send_window_update"
