"""Fault injection: churn by rate, timed actions, slow nodes."""

from __future__ import annotations

import trio

from locomesh.netsim import faults
from locomesh.netsim.links import Capacity, LinkProfile
from locomesh.netsim.simulation import Simulation, run_simulation


def churn_run(seed: int):
    async def main(sim: Simulation):
        nodes = [sim.add_node(f"n{i}") for i in range(4)]
        for node in nodes:
            await sim.start(node)
        events = []

        def record(kind, node):
            events.append((round(trio.current_time(), 3), kind, node.name))

        await faults.churn(sim, nodes, rate=0.1, downtime=5.0, until=60.0, rng=sim.rng_for("churn"), on_event=record)
        await trio.sleep(30)  # let the last restarts happen
        return events, [node.running for node in nodes]

    return run_simulation(seed, main)


def test_churn_crashes_and_restarts_nodes_deterministically():
    events, running = churn_run(5)
    crashes = [e for e in events if e[1] == "crash"]
    restarts = [e for e in events if e[1] == "restart"]
    assert len(crashes) >= 2 and len(restarts) == len(crashes)
    assert all(running), "every crashed node came back"
    assert churn_run(5)[0] == events


def test_timed_partition_and_slow_node():
    async def main(sim: Simulation):
        a = sim.add_node("a", profile=LinkProfile(latency=0.01), capacity=Capacity(upload=1e6))
        b = sim.add_node("b", profile=LinkProfile(latency=0.01))
        await sim.start(a)
        await sim.start(b)
        sim.nursery.start_soon(faults.at, 10.0, lambda: sim.network.partition(["a"]))
        await trio.sleep(11)
        during = await a.connect(b.peer_id, b.listen_addr, timeout=6)
        faults.slow_down(a, extra_latency=0.5, rate=1000.0)
        return during, a.interface.profile.latency, a.interface.uplink.rate

    during, latency, rate = run_simulation(6, main)
    assert not during
    assert latency == 0.51 and rate == 1000.0
