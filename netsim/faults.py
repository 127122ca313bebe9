"""Faults a scenario can inject: partitions over time, churn, slow nodes.

Crashes and restarts are `Simulation.crash` / `Simulation.restart`;
partitions are `Network.partition` / `Network.heal`; Byzantine behaviour is
`SimNode.hooks` (`node.ByzantineHooks`). This module schedules them:

* `at(sim, when, action)`: run an action at a virtual time (a partition at
  t=30, a heal at t=60, ...);
* `churn(...)`: crashes arrive as a Poisson process of `rate` per second
  over the running nodes; each crashed node comes back after `downtime`
  seconds (exponentially distributed with that mean), or never if None;
* `slow_down(...)`: a node's access link gets `extra_latency` and its
  capacity is cut to `rate` bytes/s both ways, at once for queued traffic
  and for connections made afterwards.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable, Sequence

import trio

from .node import SimNode
from .simulation import Simulation

Action = Callable[[], "Awaitable[None] | None"]


async def at(when: float, action: Action) -> None:
    """Sleep until virtual time `when`, then run `action` (sync or async)."""
    await trio.sleep_until(when)
    result = action()
    if result is not None:
        await result


async def churn(
    sim: Simulation,
    nodes: Sequence[SimNode],
    *,
    rate: float,
    downtime: float | None,
    until: float,
    rng: random.Random,
    on_event: Callable[[str, SimNode], None] = lambda kind, node: None,
) -> None:
    """Crash random running nodes of `nodes` at `rate` per second until `until`; restart them after `downtime`."""
    if rate <= 0:
        raise ValueError("churn rate must be positive")
    async with trio.open_nursery() as nursery:
        while True:
            next_at = trio.current_time() + rng.expovariate(rate)
            if next_at >= until:
                break
            await trio.sleep_until(next_at)
            running = [node for node in nodes if node.running]
            if not running:
                continue
            victim = rng.choice(running)
            sim.crash(victim)
            on_event("crash", victim)
            if downtime is not None:
                nursery.start_soon(_restart_later, sim, victim, rng.expovariate(1 / downtime), on_event)


async def _restart_later(
    sim: Simulation, node: SimNode, delay: float, on_event: Callable[[str, SimNode], None]
) -> None:
    await trio.sleep(delay)
    await sim.restart(node)
    on_event("restart", node)


def slow_down(node: SimNode, *, extra_latency: float = 0.0, rate: float | None = None) -> None:
    """Make `node` slow: more latency on new connections, and at most `rate` bytes/s up and down."""
    interface = node.interface
    interface.profile = dataclasses.replace(interface.profile, latency=interface.profile.latency + extra_latency)
    if rate is not None:
        interface.uplink.rate = rate
        interface.downlink.rate = rate
