"""Two nodes on loopback TCP replicate one run: gossip for new ops, anti-entropy for the backlog."""

from __future__ import annotations

import random

import pytest
import trio
from multiaddr import Multiaddr

from locomesh.cli.run_state import format_state
from locomesh.node.agreement.proposing import own_value
from locomesh.node.replication.service import CrdtService, topic_of
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import Node
from locomesh.protocol.runs import format_run_id, sign_manifest

from .test_crdt_support import H1

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]


async def wait_for(condition, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.05)


async def start_node(nursery, identity, *, bootstrap=(), sync_interval: float = 1.0,
                     service: CrdtService | None = None) -> tuple[Node, CrdtService]:
    service = service or CrdtService(sync_interval=sync_interval)
    node = Node.create(identity, listen_addrs=LOOPBACK, services=[service], bootstrap=list(bootstrap),
                       rng=random.Random(1))
    await nursery.start(node.run)
    return node, service


def in_mesh(service: CrdtService, peer: Node, run_id: bytes) -> bool:
    """Has GossipSub put `peer` in our mesh for the run's topic (built at its 1 s heartbeat)?"""
    mesh = service.pubsub.router.mesh.get(topic_of(run_id), set())
    return peer.peer_id in {str(member) for member in mesh}


def fill(service: CrdtService, run_id: bytes, identity, count: int) -> None:
    """`count` ops written straight into the replica (not gossiped): a backlog for anti-entropy. A
    precommit and three attestations a round, by the run's creator: trusted at genesis, its own
    precommits back its next rounds (crdt/limits.py)."""
    replica = service.replicas[run_id]
    replica.create(identity, "join", round=1)
    for i in range(count - 1):
        round_ = 1 + i // 4
        if i % 4 == 0:
            replica.create(identity, "precommit", round=round_, epoch=0, attempt=0, value=(i % 251).to_bytes(32, "big"),
                           state=H1)
        else:
            replica.create(identity, "attest", round=round_, id=(i % 251).to_bytes(32, "big"), size=i)


async def _backlog_reaches_a_newcomer(nursery, identity_factory, count: int) -> None:
    first_key, second_key = identity_factory(1), identity_factory(2)
    manifest = sign_manifest(first_key, task="synthetic", created=1)
    first, first_crdt = await start_node(nursery, first_key)
    replica = await first_crdt.open_run(manifest)
    fill(first_crdt, replica.run_id, first_key, count)
    second, second_crdt = await start_node(nursery, second_key, bootstrap=[Multiaddr(first.listen_addresses()[0])])
    copy = await second_crdt.open_run(manifest)
    await wait_for(lambda: len(copy) == count, timeout=60.0)
    assert copy.op_ids() == replica.op_ids() and copy.state == replica.state
    first.request_stop()
    second.request_stop()


async def test_a_backlog_reaches_a_newcomer_by_anti_entropy(nursery, identity_factory):
    await _backlog_reaches_a_newcomer(nursery, identity_factory, 1_000)


async def test_applying_ops_does_not_derive_the_state_per_op(nursery, identity_factory, monkeypatch):
    """The service watches every op for a ban of its own key; deriving the run state for that
    after each op made a 10k-op backlog quadratic. A ban is read off the chain and the facts when
    asked; the state is derived when asked, once until the next op."""
    from locomesh.crdt import replica as replica_module

    derived = []
    real_derive = replica_module.derive
    monkeypatch.setattr(replica_module, "derive", lambda *args: derived.append(1) or real_derive(*args))
    key = identity_factory(1)
    _, service = await start_node(nursery, key)
    replica = await service.open_run(sign_manifest(key, task="synthetic", created=1))
    fill(service, replica.run_id, key, 300)
    assert len(replica) == 300 and derived == []
    assert service.ban_reason(replica.run_id) is None and derived == []
    assert replica.state.ops == 300 and replica.state.ops == 300 and len(derived) == 1


@pytest.mark.slow
async def test_ten_thousand_ops_reach_a_newcomer(nursery, identity_factory):
    await _backlog_reaches_a_newcomer(nursery, identity_factory, 10_000)


async def test_new_ops_travel_both_ways_and_the_state_is_served_over_rpc(nursery, identity_factory):
    keys = [identity_factory(1), identity_factory(2)]
    manifest = sign_manifest(keys[0], task="synthetic", created=1, admitted=[keys[1].public_key])
    # No periodic anti-entropy: what is written after the peers met can only come by gossip.
    first, first_crdt = await start_node(nursery, keys[0], sync_interval=3600)
    second, second_crdt = await start_node(nursery, keys[1], bootstrap=[Multiaddr(first.listen_addresses()[0])],
                                           sync_interval=3600)
    replicas = [await first_crdt.open_run(manifest), await second_crdt.open_run(manifest)]
    run_id = replicas[0].run_id
    await wait_for(lambda: in_mesh(first_crdt, second, run_id) and in_mesh(second_crdt, first, run_id))
    first_crdt.write(run_id, "join", round=1)
    first_crdt.write(run_id, "commit", round=1, hash=bytes([0]) * 32, size=1000)
    second_crdt.write_batch(run_id, [  # two ops under one seal
        ("join", {"round": 1}),
        ("commit", {"round": 1, "hash": bytes([1]) * 32, "size": 1001}),
    ])
    await wait_for(lambda: all(len(r) == 4 for r in replicas))
    # Round 1's electorate is the creator alone: its proposal (both payloads, the admitted key's
    # join) and its precommit certify the round, again under one seal.
    value = own_value(replicas[0].chain, replicas[0].facts, {key.public_key for key in keys})
    assert value is not None and len(value.set) == 2
    first_crdt.write_batch(run_id, [
        ("proposal", {"round": 1, "epoch": 0, "attempt": 0, "valid": 0, **value.fields()}),
        ("precommit", {"round": 1, "epoch": 0, "attempt": 0, "value": value.id, "state": H1}),
    ])
    await wait_for(lambda: all(len(r) == 6 for r in replicas))
    assert replicas[0].state == replicas[1].state and replicas[0].state.round == 1
    assert replicas[1].chain.certificates[1].accepted == {key.public_key for key in keys}
    expected = {key.public_key: (bytes([i]) * 32, 1000 + i) for i, key in enumerate(keys)}
    assert replicas[0].commits(1) == replicas[1].commits(1) == expected

    state = await first.rpc.call("run.state", {"run_id": format_run_id(run_id)})
    assert state["round"] == 1 and state["ops"] == 6 and len(state["members"]) == 2
    text = format_state(state)  # what `locomesh run state RUN_ID` prints
    assert f"run id      {format_run_id(run_id)}" in text and "\nround       1\n" in text
    with pytest.raises(RpcError):
        await first.rpc.call("run.state", {"run_id": "0" * 64})
    with pytest.raises(RpcError):
        await first.rpc.call("run.state", {"run_id": "not an id"})
    first.request_stop()
    second.request_stop()
