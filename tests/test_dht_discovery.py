"""Discovery on real TCP hosts in one process: runs, peer records, providers, and values not to trust."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack, asynccontextmanager

import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from locomesh.dht import kad_client, records
from locomesh.dht.discovery import Discovery
from locomesh.node.host import build_host
from locomesh.protocol.runs import run_id, sign_manifest

LOOPBACK = Multiaddr("/ip4/127.0.0.1/tcp/0")
NOW = 1_800_000_000


@asynccontextmanager
async def network(identities):
    """Hosts for `identities`, each with a running `Discovery`, all bootstrapped off the first."""
    hosts = [build_host(identity, listen_addrs=[LOOPBACK]) for identity in identities]
    async with AsyncExitStack() as stack:
        for host in hosts:
            stack.push_async_callback(host.close)
            await stack.enter_async_context(host.run(listen_addrs=[LOOPBACK]))
        nodes = [
            Discovery(host, identity, clock=lambda: NOW, rng=random.Random(index))
            for index, (host, identity) in enumerate(zip(hosts, identities))
        ]
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await nursery.start(node.run)
            bootstrap = info_from_p2p_addr(hosts[0].get_addrs()[0])
            for host in hosts[1:]:
                await host.connect(bootstrap)
            with trio.fail_after(20):
                for node in nodes:
                    await node.wait_seeded()
            yield nodes
            nursery.cancel_scope.cancel()


async def test_a_public_run_put_by_one_node_is_found_by_another(identity_factory):
    async with network([identity_factory(i) for i in range(4)]) as nodes:
        manifest = sign_manifest(identity_factory(1), task="toy", created=NOW, public=True)
        await nodes[1].publish_run(manifest)
        found = await nodes[3].find_run(run_id(manifest))
        assert found is not None and found[0] == manifest and found[1].body["task"] == "toy"
        assert await nodes[2].find_run(b"\x01" * 32) is None


async def test_a_bad_value_held_by_a_peer_is_never_returned(identity_factory):
    async with network([identity_factory(i) for i in range(3)]) as nodes:
        manifest = sign_manifest(identity_factory(1), task="toy", created=NOW, public=True)
        key = records.run_key(run_id(manifest))
        # A peer that runs no validator (or lies) holds junk under the key; it must not reach the caller.
        nodes[0].dht.value_store.put(key.encode(), b"junk")
        assert await nodes[2].find_run(run_id(manifest)) is None
        await nodes[1].publish_run(manifest)
        found = await nodes[2].find_run(run_id(manifest))
        assert found is not None and found[0] == manifest


async def test_providers_are_found_once_each_including_from_a_provider(identity_factory):
    async with network([identity_factory(i) for i in range(4)]) as nodes:
        key = records.checkpoint_key(b"\x07" * 32)
        for node in nodes[1:3]:
            await node.provide(key)
        # twice, to make sure repeated announcements do not repeat providers
        await nodes[1].provide(key)
        expected = {nodes[1].host.get_id(), nodes[2].host.get_id()}
        for asker in (nodes[0], nodes[1], nodes[3]):
            providers = await asker.find_providers(key)
            ids = [info.peer_id for info in providers]
            assert set(ids) == expected and len(ids) == len(set(ids))


async def test_the_newest_peer_record_wins(identity_factory):
    async with network([identity_factory(i) for i in range(4)]) as nodes:
        owner = nodes[2]
        await owner.publish_peer_record(["/ip4/127.0.0.1/tcp/1"])
        await owner.publish_peer_record(["/ip4/127.0.0.1/tcp/2"])
        record = await nodes[0].find_peer_record(owner.identity.peer_id)
        assert record is not None and record.body["addrs"] == ["/ip4/127.0.0.1/tcp/2"]
        assert await nodes[0].find_peer_record(identity_factory(9).peer_id) is None


async def test_requests_reuse_one_stream_and_a_cancelled_one_is_dropped(identity_factory, monkeypatch):
    async with network([identity_factory(i) for i in range(2)]) as nodes:
        asker, holder = nodes[1].dht, nodes[0]
        manifest = sign_manifest(identity_factory(0), task="toy", created=NOW, public=True)
        await holder.publish_run(manifest)
        key = records.run_key(run_id(manifest)).encode()
        asker.pool._streams.clear()  # start from no kept stream
        for _ in range(3):
            value, _closer = await asker.pool.get_value(holder.host.get_id(), key)
            assert value == manifest
        assert len(asker.pool) == 1
        # Cancelled after the request went out, before the answer was read: the stream must not be reused.
        with monkeypatch.context() as patch:
            patch.setattr(kad_client, "read_varint_prefixed_bytes_limited", lambda *_: trio.sleep_forever())
            with trio.move_on_after(0.05):
                await asker.pool.get_value(holder.host.get_id(), key)
        assert len(asker.pool) == 0
        value, _closer = await asker.pool.get_value(holder.host.get_id(), key)
        assert value == manifest and len(asker.pool) == 1
        await asker.pool.close_idle(idle=0)
        assert len(asker.pool) == 0


async def test_republishing_restores_records_the_network_lost(identity_factory):
    async with network([identity_factory(i) for i in range(3)]) as nodes:
        manifest = sign_manifest(identity_factory(1), task="toy", created=NOW, public=True)
        key = records.run_key(run_id(manifest))
        await nodes[1].publish_run(manifest)
        for node in nodes:  # every copy and provider record is gone (expired, nodes restarted)
            node.dht.value_store.remove(key.encode())
            node.dht.provider_store.providers.clear()
        assert await nodes[2].find_run(run_id(manifest)) is None
        await nodes[1].republish_now()
        nodes[1].dht.value_store.remove(key.encode())
        assert (await nodes[2].find_run(run_id(manifest)))[0] == manifest
        assert [info.peer_id for info in await nodes[0].find_providers(key)] == [nodes[1].host.get_id()]
