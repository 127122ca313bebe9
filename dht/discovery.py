"""Discovery over Kademlia: publish and find public runs, peer records and providers.

`Discovery` wraps one `LocomeshKadDHT` on a running libp2p host::

    discovery = Discovery(host, identity)
    async with trio.open_nursery() as nursery:
        await nursery.start(discovery.run)           # DHT service + maintenance
        await discovery.publish_run(manifest_bytes)  # value under /locomesh/run/<id>, and provide it
        found = await discovery.find_run(run_id)     # (bytes, envelope) or None, always re-validated

Maintenance (all in `run`, each wait bounded):

* routing table: every `SEED_INTERVAL` s (more often while it is empty), connected peers that speak the DHT
  protocol and are missing from the table are added (this is how the
  configured bootstrap peers, dialled by the node, enter it); the first time
  the table is non-empty, and then every `REFRESH_INTERVAL` s, a refresh
  runs, each after a random delay, so nodes started together do not
  all refresh at once (that starves some tables of peers). A refresh
  (`refresh_now`) looks up our own ID and one random key in each non-empty
  bucket with our own walk (kept-open streams, stops once the K closest
  answered), and every peer that answered joins the table. py-libp2p's
  `refresh_routing_table` does the same lookups its own way, with a new
  stream per query and random keys from `secrets` (so a simulation could
  not repeat itself); ours reuse streams and draw keys from `rng`;
* republishing: values we published, keys we provide, and our own peer
  record (re-signed with a higher `seq` and a later expiry) are sent again
  every `REPUBLISH_INTERVAL` s, jittered, well before anything expires.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

import trio
from libp2p.abc import IHost
from libp2p.kad_dht.kad_dht import DHTMode
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.records.validator import NamespacedValidator
from libp2p.tools.anyio_service import background_trio_service

from locomesh.protocol import Envelope, Identity
from locomesh.protocol.runs import run_id

from . import records
from .kademlia import LocomeshKadDHT
from .validator import LocomeshValidator, select, validate

logger = logging.getLogger(__name__)

SEED_INTERVAL = 2.0
SEED_INTERVAL_EMPTY = 0.2  # while the table is empty, look for DHT peers more often
REFRESH_INTERVAL = 600.0
REPUBLISH_INTERVAL = 3600.0  # remote nodes keep values 24 h and providers 48 h
PEER_RECORD_TTL = 3 * 3600
OPERATION_TIMEOUT = 20.0  # one put, get, provide or lookup, end to end
PEER_RECORD_QUORUM = 3  # peer records change: ask a few holders and keep the highest seq
KAD_PROTOCOL = "/ipfs/kad/1.0.0"
IDLE_SWEEP_INTERVAL = 5.0  # how often kept-open Kademlia streams are checked for idleness

Clock = Callable[[], float]


class DiscoveryError(Exception):
    """A DHT operation failed or ran out of time."""


class Discovery:
    """One node's view of the DHT. See the module docstring."""

    def __init__(self, host: IHost, identity: Identity, *, clock: Clock = time.time, rng: random.Random | None = None) -> None:
        self.host = host
        self.identity = identity
        self.clock = clock
        self.rng = rng or random.SystemRandom()
        validator = NamespacedValidator({records.NAMESPACE: LocomeshValidator(clock)}, strict_validation=True)
        # strict: a key outside a namespace we registered is refused, not stored unchecked.
        self.dht = LocomeshKadDHT(host, DHTMode.SERVER, validator=validator, validator_changed=True, strict_validation=True)
        self._published: dict[str, bytes] = {}
        self._provided: set[bytes] = set()
        self._peer_record_seq = 0
        self._peer_addrs: tuple[list[str], list[str]] | None = None  # what our peer record says
        self._table_seeded = trio.Event()

    # --- life cycle ------------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the DHT service and its maintenance until cancelled."""
        async with background_trio_service(self.dht):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._seed_routing_table)
                nursery.start_soon(self._refresh_routing_table)
                nursery.start_soon(self._republish)
                nursery.start_soon(self._close_idle_streams)
                task_status.started()

    async def wait_seeded(self) -> None:
        """Return once the routing table has held a peer (bootstrap done)."""
        await self._table_seeded.wait()

    def routing_table_size(self) -> int:
        return self.dht.get_routing_table_size()

    # --- runs ------------------------------------------------------------------------------

    async def publish_run(self, manifest: bytes) -> None:
        """Put a public run's manifest under its key and provide the key (we take part in it)."""
        key = records.run_key(run_id(manifest))
        validate(key, manifest, now=self.clock())  # never publish what others would refuse
        self._published[key] = manifest
        await self._put(key, manifest)
        await self.provide(key)

    async def find_run(self, run: bytes, *, local: bool = True) -> tuple[bytes, Envelope] | None:
        """Run `run`'s manifest bytes and envelope, validated here, or None if no peer holds a valid one
        (with `local` False, only a copy from another peer counts)."""
        key = records.run_key(run)
        values = await self._get(key, enough=1, local=local)
        return (values[0], records.validate_run_record(key, values[0])) if values else None

    # --- peer records ----------------------------------------------------------------------

    async def publish_peer_record(self, addrs: Sequence[str], relay_addrs: Sequence[str] = ()) -> bytes:
        """Sign and put our peer record (a `seq` above any we signed before); returns its bytes."""
        self._peer_addrs = (list(addrs), list(relay_addrs))
        now = self.clock()
        self._peer_record_seq = max(self._peer_record_seq + 1, int(now * 1000))
        value = records.sign_peer_record(
            self.identity,
            addrs=addrs,
            relay_addrs=list(relay_addrs),
            seq=self._peer_record_seq,
            expires=int(now) + PEER_RECORD_TTL,
        )
        await self._put(records.peer_key(self.identity.peer_id), value)
        return value

    async def find_peer_record(self, peer_id: str) -> Envelope | None:
        """The newest valid peer record of `peer_id` that a few holders know, or None."""
        return await self._find_newest(records.peer_key(peer_id))

    # --- the directory of public runs ------------------------------------------------------

    async def publish_cards(self, cards: Sequence[dict], *, ttl: float) -> bytes:
        """Sign and put our cards record (`ttl` s at most `records.MAX_CARDS_TTL`); returns its bytes.
        Its refresh is the caller's (node/runs/cards.py): the cards' counts change, our peer record's
        addresses do not."""
        now = self.clock()
        self._peer_record_seq = max(self._peer_record_seq + 1, int(now * 1000))  # one counter: both only grow
        value = records.sign_cards_record(self.identity, cards=cards, seq=self._peer_record_seq, updated=int(now),
                                          expires=int(now + min(ttl, records.MAX_CARDS_TTL)))
        await self._put(records.cards_key(self.identity.peer_id), value)
        return value

    async def find_cards(self, peer_id: str) -> Envelope | None:
        """The newest valid cards record of `peer_id` that a few holders know, or None."""
        return await self._find_newest(records.cards_key(peer_id))

    async def _find_newest(self, key: str) -> Envelope | None:
        """The valid record under a peer-bound `key` with the highest seq among a few holders', or None."""
        values = await self._get(key, enough=PEER_RECORD_QUORUM)
        if not values:
            return None
        now = self.clock()
        return validate(key, values[select(key, values, now=now)], now=now)

    # --- providers -------------------------------------------------------------------------

    async def provide(self, key: str) -> None:
        """Announce that we serve `key` (a run key or `records.checkpoint_key`), and keep announcing it."""
        raw = records.provider_key(key)
        self._provided.add(raw)
        with trio.move_on_after(OPERATION_TIMEOUT):
            await self.dht.provide_key(raw)

    def stop_providing(self, key: str) -> None:
        """Stop announcing `key` (the provider records out there expire with their TTL)."""
        self._provided.discard(records.provider_key(key))

    async def find_providers(self, key: str, *, limit: int = 20) -> list[PeerInfo]:
        """Peers that announced `key`, one entry each (ourselves included if we do)."""
        with trio.move_on_after(OPERATION_TIMEOUT):
            return await self.dht.lookup_providers(records.provider_key(key), limit=limit)
        raise DiscoveryError(f"provider lookup for {key[:80]} took over {OPERATION_TIMEOUT:g} s")

    # --- the DHT calls, bounded ------------------------------------------------------------

    async def _put(self, key: str, value: bytes) -> None:
        with trio.move_on_after(OPERATION_TIMEOUT):
            await self.dht.put_value(key, value)
            return
        raise DiscoveryError(f"put of {key[:80]} took over {OPERATION_TIMEOUT:g} s")

    async def _get(self, key: str, *, enough: int, local: bool = True) -> list[bytes]:
        with trio.move_on_after(OPERATION_TIMEOUT):
            return await self.dht.lookup_values(
                key, validate=lambda value: validate(key, value, now=self.clock()), enough=enough, local=local
            )
        raise DiscoveryError(f"lookup of {key[:80]} took over {OPERATION_TIMEOUT:g} s")

    # --- maintenance -----------------------------------------------------------------------

    async def _seed_routing_table(self) -> None:
        while True:
            for peer in self._dht_peers_missing_from_table():
                with trio.move_on_after(OPERATION_TIMEOUT):  # a full bucket pings its oldest peer first
                    await self.dht.add_peer(peer)
            if self.routing_table_size():
                self._table_seeded.set()
            await trio.sleep(SEED_INTERVAL if self._table_seeded.is_set() else SEED_INTERVAL_EMPTY)

    def _dht_peers_missing_from_table(self) -> list[ID]:
        store = self.host.get_peerstore()
        missing = []
        for peer in self.host.get_connected_peers():
            try:
                speaks_dht = KAD_PROTOCOL in store.get_protocols(peer)
            except Exception:  # noqa: BLE001 - identify has not run yet: try next time
                speaks_dht = False
            if speaks_dht and not self.dht.routing_table.peer_in_table(peer):
                missing.append(peer)
        return missing

    async def _refresh_routing_table(self) -> None:
        await self._table_seeded.wait()
        delay = self.rng.uniform(0.0, 2.0)  # first lookup soon, but not in step with the others
        while True:
            await trio.sleep(delay)
            await self.refresh_now()
            # (py-libp2p's own loop, switched off in LocomeshKadDHT, expired records on this beat)
            self.dht.value_store.cleanup_expired()
            self.dht.provider_store.cleanup_expired()
            delay = REFRESH_INTERVAL * self.rng.uniform(0.75, 1.25)

    async def refresh_now(self) -> None:
        """Look up our own ID and a random key in each non-empty bucket; add the peers that answered."""
        table = self.dht.routing_table
        keys = [self.host.get_id().to_bytes()] + [
            self.rng.randrange(bucket.min_range, max(bucket.min_range + 1, bucket.max_range)).to_bytes(32, "big")
            for bucket in table.buckets
            if bucket.size() > 0
        ]
        for key in keys:
            with trio.move_on_after(OPERATION_TIMEOUT):
                lookup = await self.dht._walk(key, lambda peer, key=key: self.dht.pool.find_node(peer, key))
                for peer in lookup.answered:
                    if not table.peer_in_table(peer):
                        await self.dht.add_peer(peer)  # a full bucket pings its oldest peer first

    async def _close_idle_streams(self) -> None:
        while True:
            await trio.sleep(IDLE_SWEEP_INTERVAL)
            await self.dht.pool.close_idle()

    async def _republish(self) -> None:
        while True:
            await trio.sleep(REPUBLISH_INTERVAL * self.rng.uniform(0.75, 1.0))
            await self.republish_now()

    async def republish_now(self) -> None:
        """Send every value we published and every key we provide again (peer record re-signed)."""
        for key, value in list(self._published.items()):
            try:
                await self._put(key, value)
            except DiscoveryError as error:
                logger.info("republishing %s failed: %s", key[:80], error)
        if self._peer_addrs is not None:  # re-signed: a later expiry needs a higher seq
            try:
                await self.publish_peer_record(*self._peer_addrs)
            except DiscoveryError as error:
                logger.info("republishing our peer record failed: %s", error)
        for raw in list(self._provided):
            with trio.move_on_after(OPERATION_TIMEOUT):
                await self.dht.provide_key(raw)
