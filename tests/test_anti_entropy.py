"""The anti-entropy schedule: new peers at once, a few peers per sweep, back-off while pulls find nothing."""

from __future__ import annotations

import random

import pytest
from multiaddr import Multiaddr

from locomesh.node.replication.anti_entropy import AntiEntropySchedule
from locomesh.protocol.runs import sign_manifest

from .test_node_crdt_sync import in_mesh, start_node, wait_for

PEERS = [f"peer{i:02d}" for i in range(7)]


def schedule(**options) -> AntiEntropySchedule:
    return AntiEntropySchedule(random.Random(4), **{"base_interval": 5.0, "max_interval": 40.0, "fanout": 2, **options})


def test_new_peers_are_pulled_from_at_once_and_only_once():
    s = schedule()
    assert s.due(0.0, PEERS[:2]) == (PEERS[:2], False)
    assert s.due(0.5, PEERS[:2]) == ([], False)
    assert s.due(1.0, PEERS[:3]) == ([PEERS[2]], False)
    assert s.due(1.5, PEERS[1:3]) == ([], False)  # peer00 left
    assert s.due(2.0, PEERS[:3]) == ([PEERS[0]], False)  # and came back: it may hold a backlog


def test_new_peers_beyond_fanout_are_asked_first_at_the_next_sweeps():
    s = schedule(max_interval=5.0)
    s.due(0.0, PEERS[:2])
    assert s.due(1.0, PEERS) == ([PEERS[2], PEERS[3]], False)  # 5 new ones: 2 at once
    assert s.due(5.0, PEERS) == ([PEERS[4], PEERS[5]], True)  # then the other 3 before anyone else
    due, swept = s.due(10.0, PEERS)
    assert swept and due[0] == PEERS[6] and len(due) == 2


def test_a_sweep_asks_fanout_peers_and_every_peer_within_a_round():
    s = schedule(max_interval=5.0)  # no back-off: one sweep every 5 s
    s.due(0.0, PEERS)
    asked = []
    for sweep in range(1, 5):  # ceil(7 / 2) = 4 sweeps
        assert s.due(sweep * 5.0 - 0.5, PEERS) == ([], False)
        due, swept = s.due(sweep * 5.0, PEERS)
        assert swept and len(due) == 2 and len(set(due)) == 2
        asked += due
    assert set(asked) == set(PEERS)


def test_a_sweep_never_asks_more_peers_than_are_connected():
    s = schedule(fanout=3)
    s.due(0.0, PEERS[:2])
    due, swept = s.due(5.0, PEERS[:2])
    assert swept and sorted(due) == PEERS[:2]
    assert s.due(20.0, []) == ([], True)


def test_quiet_sweeps_back_off_and_found_ops_or_a_gap_reset():
    s = schedule()
    s.due(0.0, PEERS)
    now, gaps = 0.0, []
    for _ in range(6):  # every pull finds nothing: 5 -> 10 -> 20 -> 40 -> 40
        now += s.interval
        due, swept = s.due(now, PEERS)
        assert swept
        for _peer in due:
            s.pulled(0)
        gaps.append(s.interval)
    assert gaps == [10.0, 20.0, 40.0, 40.0, 40.0, 40.0]

    s.pulled(3)  # gossip missed something: back to the base interval, and the next sweep does not double it
    assert s.interval == 5.0
    assert s.due(now + 39.0, PEERS) == ([], False)  # the sweep already planned stays planned
    assert s.due(now + 40.0, PEERS)[1] and s.interval == 5.0
    now += 40.0

    s.behind(now + 1.0)  # a gap: sweep at the next look
    due, swept = s.due(now + 1.0, PEERS)
    assert swept and len(due) == 2 and s.interval == 5.0


def test_the_choice_is_deterministic_for_a_seed():
    def sweeps(seed: int) -> list[list[str]]:
        s = AntiEntropySchedule(random.Random(seed), base_interval=1.0, max_interval=1.0, fanout=2)
        s.due(0.0, PEERS)
        return [s.due(float(t), PEERS)[0] for t in range(1, 8)]

    assert sweeps(1) == sweeps(1)
    assert sweeps(1) != sweeps(2)


def test_bad_settings_are_refused():
    for options in ({"base_interval": 0.0}, {"max_interval": 1.0}, {"fanout": 0}):
        with pytest.raises(ValueError):
            schedule(**options)


# --- in the service: a gap in gossip is repaired from the op's author, without waiting for a sweep ----


async def test_an_op_gossiped_without_its_parents_is_completed_from_its_author(nursery, identity_factory):
    keys = [identity_factory(1), identity_factory(2)]
    manifest = sign_manifest(keys[0], task="synthetic", created=1)
    # Sweeps an hour apart: only the gap repair can bring what gossip never carried.
    first, first_crdt = await start_node(nursery, keys[0], sync_interval=3600)
    second, second_crdt = await start_node(nursery, keys[1], bootstrap=[Multiaddr(first.listen_addresses()[0])],
                                           sync_interval=3600)
    replicas = [await first_crdt.open_run(manifest), await second_crdt.open_run(manifest)]
    run_id = replicas[0].run_id
    await wait_for(lambda: in_mesh(first_crdt, second, run_id) and in_mesh(second_crdt, first, run_id))
    await wait_for(lambda: not second_crdt._syncing and not first_crdt._syncing)  # the pulls at connection are over
    replicas[0].create(keys[0], "join", round=1)  # written, never gossiped: the parent
    first_crdt.write(run_id, "commit", round=1, hash=bytes(32), size=1000)  # gossiped: the child
    await wait_for(lambda: len(replicas[1].pending) == 1, timeout=10.0)  # the child arrived alone
    await wait_for(lambda: len(replicas[1]) == 2, timeout=10.0)
    assert replicas[1].op_ids() == replicas[0].op_ids() and not replicas[1].pending
    assert second_crdt.schedule.interval == 3600  # the repair reset the back-off to the base interval
    first.request_stop()
    second.request_stop()
