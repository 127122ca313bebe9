"""Garbage collection and py-libp2p chores during a run: paused or retuned inside, restored after."""

from __future__ import annotations

import gc
import weakref
from functools import partial

import trio
from libp2p.stream_muxer.yamux import yamux

from locomesh.netsim import collector
from locomesh.netsim.libp2p_chores import SIMULATED_RTT_INTERVAL, libp2p_chores_retuned
from locomesh.netsim.simulation import run_simulation


class _Cycle:
    """An object that only the cyclic collector can free (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


def test_collection_is_paused_inside_and_restored_after():
    assert gc.isenabled()
    with collector.paused_collection():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0, "what existed before the run is frozen"
    assert gc.isenabled() and gc.get_freeze_count() == 0


async def test_a_full_collection_runs_once_enough_was_allocated(autojump_clock):
    with collector.paused_collection():
        cycle = _Cycle()
        dead = weakref.ref(cycle)
        del cycle
        filler = [[index] for index in range(2_000)]  # tracked objects: the growth the collector looks at
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(collector.collect_when_grown, check_every=1.0, min_growth=1_000))
            await trio.sleep(0.5)
            assert dead() is not None, "no collection before the first check"
            await trio.sleep(1.0)
            assert dead() is None, "the check after 1 s collected the cycle"
            nursery.cancel_scope.cancel()
        del filler


async def test_a_collection_runs_after_the_longest_interval_once_a_tenth_accrued(autojump_clock):
    with collector.paused_collection():
        cycle = _Cycle()
        dead = weakref.ref(cycle)
        del cycle
        filler = [[index] for index in range(2_000)]  # a tenth of min_growth, not all of it
        check = partial(collector.collect_when_grown, check_every=1.0, min_growth=10_000, max_interval=3.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(check)
            await trio.sleep(2.5)
            assert dead() is not None, "no collection before max_interval"
            await trio.sleep(1.0)
            assert dead() is None, "collected once max_interval had passed"
            nursery.cancel_scope.cancel()
        del filler


async def test_survivors_are_frozen_until_every_few_collections_one_looks_at_everything(autojump_clock):
    with collector.paused_collection():
        kept = []
        check = partial(collector.collect_when_grown, check_every=1.0, min_growth=1_000, full_every=3)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(check)
            cycle = _Cycle()
            dead = weakref.ref(cycle)
            kept.append([[index] for index in range(5_000)])
            await trio.sleep(1.5)  # collection 1: the cycle is alive, so it survives and is frozen
            del cycle
            kept.append([[index] for index in range(5_000)])
            await trio.sleep(1.0)  # collection 2 looks only at what is younger than the freeze
            assert dead() is not None, "a frozen cycle waits for a full collection"
            kept.append([[index] for index in range(20_000)])  # more than half of all survivors
            await trio.sleep(1.0)  # collection 3 thaws everything and collects it
            assert dead() is None
            nursery.cancel_scope.cancel()


async def test_no_collection_while_little_was_allocated(autojump_clock):
    with collector.paused_collection():
        cycle = _Cycle()
        dead = weakref.ref(cycle)
        del cycle
        with trio.move_on_after(5.0):
            await collector.collect_when_grown(check_every=1.0, min_growth=10**9, max_interval=2.0)
        assert dead() is not None


def test_a_run_spaces_out_yamux_pings_and_restores_the_interval_after():
    before = yamux.RTT_MEASURE_INTERVAL

    async def main(sim):
        return yamux.RTT_MEASURE_INTERVAL, gc.isenabled()

    assert run_simulation(0, main) == (SIMULATED_RTT_INTERVAL, False)
    assert yamux.RTT_MEASURE_INTERVAL == before and gc.isenabled()
    with libp2p_chores_retuned():
        assert yamux.RTT_MEASURE_INTERVAL == SIMULATED_RTT_INTERVAL
    assert yamux.RTT_MEASURE_INTERVAL == before
