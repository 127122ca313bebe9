"""A simulation: one `Network`, its `SimNode`s, and a deterministic run of it in virtual time.

`run_simulation(seed, main)` runs ``main(sim)`` under trio's MockClock
(``autojump_threshold=0``: whenever every task is blocked, the clock jumps to
the next deadline, so a quiet minute costs nothing). The same seed gives the
same run, byte for byte, because everything that could differ is pinned:

* randomness: every random choice comes from `random.Random` instances
  derived from the seed (`Simulation.rng_for`); Python's global `random`
  (which py-libp2p uses) is seeded too, and restored afterwards;
* scheduling: trio's scheduler picks the order of runnable tasks at random
  unless told otherwise; we switch it to its deterministic mode (the one
  pytest-trio and Hypothesis use: tasks ordered by creation, shuffled by a
  seeded generator) for the duration of the run;
* garbage collection: paused, and run at virtual instants chosen by how
  much was allocated (`collector`);
* clocks: py-libp2p's own reads of `time.time()`/`time.monotonic()` are
  redirected to the virtual clock (`libp2p_time.py`), and locomesh code
  reads `locomesh.netsim.clock`, which a run sets to virtual wall time.

Retuned for speed only: garbage collection (`collector`: a large run spent
much of its time walking the same objects), Yamux's periodic RTT pings
and its one-window-update-per-read (`libp2p_chores`: go-yamux's batching
instead), and how pipe readers wait (one shared timer, `wakeups`).

What stays random: Noise's ephemeral keys (from the OS); they change bytes
on the wire, never their sizes or timing. Across *processes*, Python's hash
randomisation could reorder iteration over sets of strings inside
py-libp2p; run with a fixed ``PYTHONHASHSEED`` to compare runs made by
different processes (`locomesh sim` tells how it was run in the report).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import trio
import trio.testing

from locomesh.protocol import Identity

from . import clock, collector
from .libp2p_chores import libp2p_chores_retuned
from .libp2p_time import libp2p_on_virtual_time
from .links import Capacity, LinkProfile
from .nat import NatBox
from .network import Network
from .node import SimNode

T = TypeVar("T")

# 2030-01-01T00:00:00Z: virtual wall time starts here, whatever the real date.
VIRTUAL_EPOCH = 1_893_456_000.0


def derive_seed(seed: int, label: str) -> int:
    """An independent 64-bit seed for one purpose (`label`) of a run."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{label}".encode()).digest()[:8], "big")


class Simulation:
    """The network and nodes of one run; start, crash and restart nodes while it runs."""

    def __init__(self, seed: int, *, syn_timeout: float = 5.0) -> None:
        self.seed = seed
        self.network = Network(derive_seed(seed, "network"), syn_timeout=syn_timeout)
        self.nodes: dict[str, SimNode] = {}
        self.nursery: trio.Nursery | None = None

    def rng_for(self, label: str) -> random.Random:
        return random.Random(derive_seed(self.seed, label))

    def add_node(
        self,
        name: str,
        *,
        nat: NatBox | None = None,
        ip: str | None = None,
        profile: LinkProfile = LinkProfile(),
        capacity: Capacity = Capacity(),
    ) -> SimNode:
        """A node with a seed-derived identity, attached to the network (not started; `ip`: `Network.attach`'s)."""
        interface = self.network.attach(name, nat=nat, ip=ip, profile=profile, capacity=capacity)
        identity = Identity.from_seed(hashlib.sha256(f"{self.seed}/identity/{name}".encode()).digest())
        node = SimNode(name, identity, interface, self.network, rng=self.rng_for(f"node/{name}"))
        self.nodes[name] = node
        return node

    async def start(self, node: SimNode) -> None:
        """Run `node` in the simulation's nursery; returns once it listens."""
        if self.nursery is None:
            raise RuntimeError("start nodes from inside run_simulation")
        await self.nursery.start(node.run)

    def crash(self, node: SimNode) -> None:
        node.crash()

    async def restart(self, node: SimNode) -> None:
        """Bring a crashed node back: same identity, same address, a fresh host."""
        await node.wait_stopped()
        self.network.recover(node.interface)
        await self.start(node)


def run_simulation(seed: int, main: Callable[[Simulation], Awaitable[T]], *, syn_timeout: float = 5.0) -> T:
    """Run ``main(sim)`` in virtual time, deterministically for `seed`; returns what it returns."""
    sim = Simulation(seed, syn_timeout=syn_timeout)

    async def body() -> T:
        with clock.use_clock(clock.VirtualWallClock(VIRTUAL_EPOCH)):
            async with trio.open_nursery() as nursery:
                sim.nursery = nursery
                nursery.start_soon(collector.collect_when_grown)
                result = await main(sim)
                nursery.cancel_scope.cancel()
        return result

    with (
        _deterministic(seed),
        libp2p_on_virtual_time(VIRTUAL_EPOCH),
        libp2p_chores_retuned(),
        collector.paused_collection(),
    ):
        return trio.run(body, clock=_jumping_clock())


def _jumping_clock() -> trio.testing.MockClock:
    """trio's `MockClock` at rate 0 with autojump, whose "now" is read straight from its virtual base.

    At rate 0 `MockClock.current_time()` is ``base + 0 * (real - real_base)``: the base, after
    reading the real clock and converting. A 1,000-node run asks for the time millions of times
    (trio's deadlines, py-libp2p's timestamps, ours), so this clock answers with the same value
    without the detour (`MockClock` is final: the method is replaced on the instance)."""
    mock = trio.testing.MockClock(autojump_threshold=0)
    mock.current_time = lambda: mock._virtual_base  # type: ignore[method-assign]
    return mock


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seed Python's and trio's generators and make trio's scheduler deterministic; undo afterwards."""
    import trio._core._run as trio_run  # the switch pytest-trio and Hypothesis use

    saved_flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    saved_trio, saved_global = trio_run._r.getstate(), random.getstate()
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(derive_seed(seed, "trio-scheduler"))
    random.seed(derive_seed(seed, "python-random"))
    try:
        yield
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag  # type: ignore[misc]
        trio_run._r.setstate(saved_trio)
        random.setstate(saved_global)
