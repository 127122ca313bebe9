"""py-libp2p's `KadDHT` with the lookups locomesh needs: gets that stop early, walks that work on our keys.

What is changed, and why (measured in ``bench/dht_get.py``):

* `KadDHT.get_value` first runs a full iterative FIND_NODE lookup, then asks
  *every* candidate it heard of for the value (up to 10 at a time), then
  writes the value back to every close peer that lacked it, and only then
  returns. `lookup_values` asks the closest known peers for the value
  directly (GET_VALUE answers carry closer peers too, so the lookup still
  converges), `parallelism` at a time with hedged starts, and returns as soon
  as `enough` valid values are in hand. A run record is bound to its key by
  hash, so one valid copy is enough.
* Requests go over kept-open streams (`locomesh.dht.kad_client`): opening a
  stream costs two round trips of multistream-select, more than the request.
* A value is valid only if the caller's `validate` accepts it; a remote
  node may run no validator at all, so nothing is trusted for having come
  back from the DHT.
* py-libp2p's servers refuse FIND_NODE for keys over 50 bytes that are not
  multihashes, which our ``/locomesh/...`` keys are, so its `put_value` and
  `provide` only reached the peers already in the routing table; here every
  walk uses GET_VALUE or GET_PROVIDERS, which accept keys up to 128 bytes.
* `KadDHT.find_providers` answers from the local store alone when it holds
  any provider, so a node that provides a key never hears of the others;
  `lookup_providers` always asks the network, and de-duplicates (py-libp2p
  returns the same provider many times).
* The built-in maintenance loop refreshes the routing table, republishes and
  expires records on a fixed 10-minute beat, at the same moment on every node
  started together; `locomesh.dht.discovery` does that work itself, with
  jitter, so it is switched off here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from libp2p.kad_dht.kad_dht import KadDHT
from libp2p.kad_dht.utils import sort_peer_ids_by_distance
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from .kad_client import KadStreamPool

logger = logging.getLogger(__name__)


class _CleanEofFilter(logging.Filter):
    """Drops py-libp2p's warning for an asker closing its DHT stream after the answer (a StreamEOF).

    That is how every query ends, so the warning came once per query served
    and buried the log lines that matter.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.msg.startswith("Failed to read DHT message") and args and isinstance(args[0], StreamEOF))


logging.getLogger("libp2p.kad_dht.kad_dht").addFilter(_CleanEofFilter())

PARALLELISM = 3  # queries in flight per lookup (Kademlia's alpha)
HEDGE_DELAY = 0.05  # seconds before the next ask of a batch goes out anyway (see `_walk`)
K_CLOSEST = 20  # a lookup ends when the closest K peers it knows of have all been asked
QUERY_TIMEOUT = 5.0  # one peer's answer (dial included)
INBOUND_STREAMS = 128  # Kademlia streams served at once (py-libp2p: 12)


@dataclass
class _Lookup:
    """The state of one iterative lookup: who to ask next, who was asked, who answered."""

    key: bytes
    candidates: list[ID]
    queried: set[ID] = field(default_factory=set)
    answered: list[ID] = field(default_factory=list)

    def next_batch(self, size: int) -> list[ID]:
        """Up to `size` unqueried peers among the K closest known; empty when the lookup is over."""
        batch = [peer for peer in self.candidates[:K_CLOSEST] if peer not in self.queried][:size]
        self.queried.update(batch)
        return batch

    def learn(self, peer: ID, closer: list[ID]) -> None:
        """`peer` answered and named `closer` peers."""
        self.answered.append(peer)
        known = set(self.candidates)
        fresh = [candidate for candidate in closer if candidate not in known]
        if fresh:
            self.candidates = sort_peer_ids_by_distance(self.key, self.candidates + fresh)

    def closest_answered(self) -> list[ID]:
        return sort_peer_ids_by_distance(self.key, self.answered)[:K_CLOSEST]


# ask(peer) -> the closer peers it named, or None if it did not answer; it records what it found.
Ask = Callable[[ID], Awaitable[list[ID] | None]]


class LocomeshKadDHT(KadDHT):
    """`KadDHT` with `lookup_values`, `put_value`, `lookup_providers` and `provide_key` as described above.

    Maintenance (refresh, republish, expiry) is left to the owner.
    """

    def __init__(
        self,
        *args,
        parallelism: int = PARALLELISM,
        hedge_delay: float = HEDGE_DELAY,
        inbound_streams: int = INBOUND_STREAMS,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.parallelism = parallelism
        self.hedge_delay = hedge_delay
        self.pool = KadStreamPool(self.host)
        # Each peer keeps a stream to us open between its requests (see kad_client), so serve
        # more at once than py-libp2p's 12; an idle stream costs memory, not CPU.
        self._inbound_limiter = trio.CapacityLimiter(inbound_streams)

    async def _run_main_loop(self) -> None:
        """Replaced: `Discovery` schedules refresh, republish and expiry itself (with jitter)."""
        return

    def _start_peers(self, key: bytes) -> list[ID]:
        local = self.routing_table.find_local_closest_peers(key, K_CLOSEST)
        if not local:  # an empty table (just bootstrapped): start from whoever we are connected to
            local = [peer for peer in self.host.get_connected_peers() if peer != self.local_peer_id]
        return sort_peer_ids_by_distance(key, local)

    async def _walk(self, key: bytes, ask: Ask, done: Callable[[], bool] = lambda: False) -> _Lookup:
        """Ask the closest known peers in batches of `parallelism`, until `done()` or the K closest all answered.

        Within a batch the asks are hedged: the first goes out at once, each
        next one `hedge_delay` s later, or at once when an earlier ask of the
        batch came back without finishing the lookup. When the closest peer
        holds the value (the common case) a get costs one request, not
        `parallelism` of them; a slow or dead peer delays it by `hedge_delay`.
        """
        lookup = _Lookup(key, self._start_peers(key))

        async def one(position: int, peer: ID, hurry: trio.Event, batch_scope: trio.CancelScope) -> None:
            with trio.move_on_after(position * self.hedge_delay):
                await hurry.wait()
            closer = None
            with trio.move_on_after(QUERY_TIMEOUT):
                try:
                    closer = await ask(peer)
                except Exception as error:  # noqa: BLE001 - a peer's failure only ends its branch
                    logger.debug("DHT query to %s failed: %s", peer, error)
            if closer is not None:
                lookup.learn(peer, closer)
            if done():
                batch_scope.cancel()  # the other answers are no longer needed
            hurry.set()

        while not done() and (batch := lookup.next_batch(self.parallelism)):
            hurry = trio.Event()
            async with trio.open_nursery() as nursery:
                for position, peer in enumerate(batch):
                    nursery.start_soon(one, position, peer, hurry, nursery.cancel_scope)
        return lookup

    # --- values ---------------------------------------------------------------------------

    async def lookup_values(
        self, key: str, *, validate: Callable[[bytes], object], enough: int = 1, local: bool = True
    ) -> list[bytes]:
        """Valid values for `key` from the network (distinct), stopping once `enough` are found.

        `validate(value)` raises for a value that must be ignored. The local
        store is consulted too (its value is re-validated like any other),
        unless `local` is False. Returns ``[]`` when no peer holds a valid value.
        """
        key_bytes = key.encode("utf-8")
        found: list[bytes] = []

        def accept(value: bytes | None) -> None:
            if value is None or value in found:
                return
            try:
                validate(value)
            except Exception as error:  # noqa: BLE001 - a validator's verdict, whatever its type
                logger.debug("ignored an invalid value for %s: %s", key[:80], error)
                return
            found.append(value)

        async def ask(peer: ID) -> list[ID] | None:
            value, closer = await self.pool.get_value(peer, key_bytes)
            accept(value)
            return closer

        held = self.value_store.get(key_bytes) if local else None
        accept(None if held is None else held.value)
        await self._walk(key_bytes, ask, done=lambda: len(found) >= enough)
        return found

    async def put_value(self, key: str, value: bytes) -> None:
        """Validate, keep locally, and store at the K closest peers that answer a walk to `key`."""
        self.validator.validate(key, value)
        key_bytes = key.encode("utf-8")
        self.value_store.put(key_bytes, value)

        async def ask(peer: ID) -> list[ID] | None:
            return (await self.pool.get_value(peer, key_bytes))[1]

        lookup = await self._walk(key_bytes, ask)
        await self._to_each(lookup.closest_answered(), lambda peer: self.value_store._store_at_peer(peer, key_bytes, value))

    # --- providers ------------------------------------------------------------------------

    async def lookup_providers(self, key: bytes, *, limit: int = 20) -> list[PeerInfo]:
        """Providers of `key`: the local store's and the network's, one entry per peer, at most `limit`."""
        providers: dict[ID, PeerInfo] = {}

        def add(found: list[PeerInfo]) -> None:
            for info in found:
                if info.peer_id not in providers and len(providers) < limit:
                    providers[info.peer_id] = info

        async def ask(peer: ID) -> list[ID] | None:
            found, closer = await self.pool.get_providers(peer, key)
            add(found)
            return closer

        add(self.provider_store.get_providers(key))
        await self._walk(key, ask, done=lambda: len(providers) >= limit)
        return list(providers.values())

    async def provide_key(self, key: bytes) -> None:
        """Record ourselves as a provider of `key` locally and at the K closest peers."""
        store = self.provider_store
        store.providing_keys.add(key)
        store.add_provider(key, PeerInfo(self.local_peer_id, list(self.host.get_addrs())))

        async def ask(peer: ID) -> list[ID] | None:
            return (await self.pool.get_providers(peer, key))[1]

        lookup = await self._walk(key, ask)
        await self._to_each(lookup.closest_answered(), lambda peer: store._send_add_provider(peer, key))

    async def _to_each(self, peers: list[ID], send: Callable[[ID], Awaitable[object]]) -> None:
        """`send(peer)` to every peer at once, each bounded by `QUERY_TIMEOUT`; failures are logged."""

        async def one(peer: ID) -> None:
            with trio.move_on_after(QUERY_TIMEOUT):
                try:
                    await send(peer)
                except Exception as error:  # noqa: BLE001 - one peer's failure must not stop the others
                    logger.debug("DHT store at %s failed: %s", peer, error)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(one, peer)
