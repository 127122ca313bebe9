"""State stewards (node/rounds/orders.py `state_stewards`): each round, a few members store the new
state for peers that sync; every member attests its checkpoint ID, and a syncing peer asks the
stewards first."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.orders import state_stewards
from locomesh.netsim.offload import run_inline
from locomesh.node.rounds.participation import RunParticipation
from locomesh.protocol import peer_id_from_public_key
from locomesh.node.transfer.store import manifest_path
from locomesh.training.participant import StateSnapshot

from .test_crdt_support import H2, certify, joined_replica, keys

MEMBERS = keys(4)
ROUND = 2  # certified by all four: round 1 admitted the joins of the three admitted at genesis


def certified_run():
    """A run of the four MEMBERS with rounds 1 and 2 certified; the seed of round 2's draws: round 1's state."""
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    certify(replica, MEMBERS, H2)
    assert replica.electorate(ROUND) == {member.public_key for member in MEMBERS}
    return replica, replica.state.certificates[ROUND - 1].hash


class Attestations:
    """The CRDT service's `write`, recording the ops a participation publishes."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, dict]] = []

    def write(self, run_id: bytes, kind: str, **fields) -> None:
        self.ops.append((kind, fields))


def participation(me, replica, directory) -> tuple[RunParticipation, Attestations]:
    node = SimpleNamespace(identity=me)
    participant = SimpleNamespace(settings=SimpleNamespace(delayed_updates=False))
    crdt = Attestations()
    return RunParticipation(node, crdt, replica, participant, directory, scores=None, timing=rm.Timing(),
                            offload=run_inline), crdt


@pytest.mark.trio
async def test_stewards_store_the_state_and_the_others_only_attest_it(tmp_path):
    replica, seed = certified_run()
    stewards = state_stewards(ROUND, seed, replica.electorate(ROUND))
    assert len(stewards) == 2
    snapshot = StateSnapshot({"theta": np.arange(50_000, dtype=np.float32)}, ROUND)
    expected = snapshot.manifest(replica.run_id)
    for member in MEMBERS:
        directory = tmp_path / member.public_key.hex()[:8]
        party, crdt = participation(member, replica, directory)
        await party.states.store(ROUND, snapshot, expected.state_hash)
        assert crdt.ops == [("checkpoint", {"round": ROUND, "id": expected.id, "size": expected.raw_size})]
        assert manifest_path(directory, expected.id).exists() == (member.public_key in stewards)


def test_a_syncing_peer_asks_the_stewards_first(tmp_path):
    replica, seed = certified_run()
    stewards = state_stewards(ROUND, seed, replica.electorate(ROUND))
    outsider = next(m for m in MEMBERS if m.public_key not in stewards)
    party, _ = participation(outsider, replica, tmp_path)
    providers = party.states.providers(ROUND)
    assert providers[:2] == [peer_id_from_public_key(key) for key in stewards]
    assert sorted(providers) == sorted(peer_id_from_public_key(m.public_key) for m in MEMBERS if m is not outsider)
