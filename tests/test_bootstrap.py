"""Staying connected to a bootstrap peer (node/bootstrap.py): backoff, and no busy loop."""

from __future__ import annotations

import random

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.node.bootstrap import Backoff, keep_connected

ADDRESS = Multiaddr("/ip4/127.0.0.1/tcp/4001")


async def _dials_within(seconds: float, *, connects: bool, succeeds: bool) -> int:
    """How many dials `keep_connected` makes in `seconds` of (mock-clock) time."""
    dials = 0

    async def dial(address: Multiaddr) -> None:
        nonlocal dials
        dials += 1
        await trio.sleep(0.01)  # a loopback dial's round trips
        if not succeeds:
            raise OSError("refused")

    with trio.move_on_after(seconds):
        await keep_connected(ADDRESS, dial=dial, is_connected=lambda: connects and dials > 0,
                             backoff=Backoff(rng=random.Random(1)), dial_timeout=5.0)
    return dials


@pytest.mark.parametrize("succeeds", [True, False])
async def test_a_dial_that_leaves_the_peer_unconnected_backs_off(autojump_clock, succeeds):
    # 60 s of backoff from 0.5 s doubling to a 60 s cap is a handful of dials, not thousands.
    assert 3 <= await _dials_within(60.0, connects=False, succeeds=succeeds) <= 10


async def test_a_connected_peer_is_dialled_once(autojump_clock):
    assert await _dials_within(60.0, connects=True, succeeds=True) == 1


def test_backoff_doubles_up_to_its_cap_with_jitter():
    backoff = Backoff(base=1.0, cap=8.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(6)]
    assert all(ceiling / 2 <= d <= ceiling for d, ceiling in zip(delays, [1, 2, 4, 8, 8, 8]))
    backoff.reset()
    assert backoff.next_delay() <= 1.0
