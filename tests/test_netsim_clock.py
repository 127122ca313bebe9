"""Virtual time: locomesh's clock and py-libp2p's clock reads follow trio's MockClock in a simulation."""

from __future__ import annotations

import time

import libp2p.network.swarm as swarm_module
import libp2p.pubsub.gossipsub as gossipsub_module
import trio

from locomesh.netsim import clock
from locomesh.netsim.simulation import VIRTUAL_EPOCH, run_simulation


def test_clocks_are_virtual_inside_a_simulation_and_real_outside():
    async def main(sim):
        await trio.sleep(3600)
        return clock.wall(), clock.monotonic(), swarm_module.time.time(), gossipsub_module.time.monotonic()

    wall, monotonic, libp2p_wall, libp2p_monotonic = run_simulation(0, main)
    assert wall == libp2p_wall == VIRTUAL_EPOCH + 3600
    assert monotonic == libp2p_monotonic == 3600
    assert swarm_module.time is time, "the patch is undone after the run"
    assert abs(clock.wall() - time.time()) < 5
