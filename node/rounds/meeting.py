"""Meeting a run's participants as a node joins: find them in the DHT, connect, and pull the run's
CRDT state from them, so that the join op builds on the run as it is (a stale view could fork our
own ops). `RoundService.join` (service.py) calls it before writing the join; a participation
resumed after a restart catches up (`catch_up`) before its round machine acts.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from multiaddr import Multiaddr

from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol.runs import short_run_id

from locomesh.node.replication.service import CrdtService
from locomesh.node.runtime import DialError, Node

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
CATCH_UP_SECONDS = 30.0
CATCH_UP_RETRY = 1.0


async def meet_participants(node: Node, discovery: Discovery, crdt: CrdtService, run_id: bytes,
                            nursery: trio.Nursery) -> None:
    """Connect to the run's participants (its DHT providers) and pull their CRDT state, each step
    within CONNECT_TIMEOUT; announce ourselves as a participant in the background (`nursery`)."""
    key = records.run_key(run_id)
    with trio.move_on_after(CONNECT_TIMEOUT):
        try:
            found = await discovery.find_providers(key)
        except DiscoveryError as error:
            logger.info("no participants found for %s: %s", short_run_id(run_id), error)
            found = []
        async with trio.open_nursery() as dials:
            for info in found:
                if str(info.peer_id) != node.peer_id:
                    dials.start_soon(_connect_quietly, node, info)
    nursery.start_soon(discovery.provide, key)
    with trio.move_on_after(CONNECT_TIMEOUT):
        async with trio.open_nursery() as pulls:
            for peer in node.host.get_connected_peers():
                pulls.start_soon(_pull_quietly, crdt, str(peer), run_id)


async def catch_up(node: Node, crdt: CrdtService, run_id: bytes, *, patience: float = CATCH_UP_SECONDS) -> bool:
    """Pull the run's state from one connected peer that has it, trying each in turn (and waiting
    for connections) for up to `patience` seconds; whether a pull went through. A node restarted on
    an old op log calls it before its round machine acts: otherwise it commits, times out or joins
    for rounds the run left long ago, and such ops change the electorates of those rounds after the
    fact (crdt/view.py): a certificate can be taken back. At once if a pull went through already
    (`meet_participants` pulls from the peers connected when the run is taken up)."""
    if crdt.has_pulled(run_id):
        return True
    with trio.move_on_after(patience):
        while True:
            for peer in node.host.get_connected_peers():
                with trio.move_on_after(CONNECT_TIMEOUT):
                    try:
                        await crdt.pull(str(peer), run_id)
                        return True
                    except Exception as error:  # noqa: BLE001 - a peer without the run or a broken stream
                        logger.debug("catch-up pull of %s from %s failed: %s", short_run_id(run_id), peer, error)
            await trio.sleep(CATCH_UP_RETRY)
    logger.info("run %s: no peer to catch up from within %.0f s; going on with the state held", short_run_id(run_id),
                patience)
    return False


async def _connect_quietly(node: Node, info: Any) -> None:
    """Dial a participant at each address its provider record gave (each exactly: py-libp2p's
    `host.connect` dials one address per transport class, so a public address after a private
    one was never tried); if none works, through the relay service with the addresses of its
    DHT peer record, relayed ones included (a participant behind a NAT has no other)."""
    node.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)  # for later streams
    peer = str(info.peer_id)
    given = [text if "/p2p/" in (text := str(address)) else f"{text}/p2p/{peer}" for address in info.addrs]
    relay = next((service for service in node.services if service.name == "relay"), None)
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            if relay is None:
                await node.connect_any([Multiaddr(address) for address in given])
                return
            try:
                await relay.connect(peer, given)
                return
            except DialError as error:
                logger.debug("could not dial participant %s at %s: %s", peer, given, error)
            kind = await relay.connect(peer, await relay.lookup_addrs(peer))
            logger.info("reached participant %s through its DHT peer record (%s)", peer, kind)
    except Exception as error:  # noqa: BLE001 - DialError, RpcError, TooSlowError: it may be gone
        logger.debug("could not reach participant %s: %s", peer, error)


async def _pull_quietly(crdt: CrdtService, peer: str, run_id: bytes) -> None:
    try:
        await crdt.pull(peer, run_id)
    except Exception as error:  # noqa: BLE001 - a peer without the run or a broken stream
        logger.debug("pull of %s from %s failed: %s", short_run_id(run_id), peer, error)
