"""Run cards: what a public run tells the directory, which members keep it, and keeping it published.

A public run is listed in the DHT's directory (dht/records.py) by its **card keepers**: the
`KEEPERS` active members whose SHA-256(run ID || member key) is lowest, plus the run's creator
while it is a member. Every member computes the same set from its CRDT replica, so no one
decides it, and a run of a thousand members still fills only a few of the directory's provider
slots (a holder keeps 20 per key). Active: a member of the next round's electorate, or a key on its
roster earning a say (not one away from the electorate), so keepers
that crashed long ago hand the job over as their membership lapses.

A keeper's `CardPublisher` signs one cards record under ``/locomesh/cards/<its peer id>`` with a
card per public run it keeps, and provides the directory key of each such run's shard for the
current epoch and every epoch starting within `records.DIRECTORY_LEAD` (early, so it holds a
provider slot before strangers who race for the key later; a browser counts its card only if it
is verifiably a participant of the run: node/runs/directory.py). It looks at its replicas every
`POLL_INTERVAL` seconds: a run it starts or stops keeping (a join, a leave, a lapse, a new
keeper) is published at once; otherwise the record is re-signed every `REFRESH_INTERVAL` (well
inside `MAX_CARDS_TTL`, after which it is refused). Once it keeps nothing, it publishes one
empty record (a browser then drops the runs it listed before its expiry) and stops providing.

A card's static fields come from the run's manifest (a browser checks them against it); its
sizes from `training.footprint` (parameters, the memory a member needs, its payload, and the
payloads it fetches from the run's current members); members and certified rounds from the replica.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from locomesh.crdt import Replica
from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol import ProtocolError, decode
from locomesh.protocol.kinds import MAX_CARDS, RUN_MANIFEST
from locomesh.protocol.runs import short_run_id
from locomesh.training.footprint import Footprint, run_footprint

logger = logging.getLogger(__name__)

KEEPERS = 3
POLL_INTERVAL = 5.0
REFRESH_INTERVAL = 15 * 60.0
CARDS_TTL = records.MAX_CARDS_TTL
_FOOTPRINT_CACHE = 64

Offload = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Standing:
    """What a member's replica says of a public run now."""

    run_id: bytes
    body: dict[str, Any]  # the manifest's
    creator: bytes
    members: tuple[bytes, ...]  # active members (the next round's electorate and keys earning a say), sorted
    rounds: int  # the newest certified round
    joining: int = 0  # keys whose join waits for a round to take it in (they train from it: members to a browser)


def card_keepers(run_id: bytes, members: Iterable[bytes], creator: bytes, count: int = KEEPERS) -> frozenset[bytes]:
    """The members that keep `run_id`'s card: the `count` lowest by SHA-256(run ID || key), and the
    creator if it is a member. The same on every node that sees the same members."""
    members = set(members)
    ranked = sorted(members, key=lambda member: hashlib.sha256(run_id + member).digest())[:count]
    return frozenset(ranked) | ({creator} & members)


def standing(replica: Replica, body: dict[str, Any]) -> Standing:
    """`replica`'s run as a card needs it (`body`: its manifest's)."""
    state = replica.state
    tip = replica.chain.tip
    active = tuple(sorted(tip.electorate | set(tip.membership.fresh)))  # the dormant (away for a while) aside
    return Standing(replica.run_id, body, replica.genesis.creator, active, state.round, len(replica.joining()))


def make_card(run: Standing, footprint: Footprint) -> dict[str, Any]:
    """The card of `run` (a `run.cards` entry, protocol/kinds.py)."""
    body = run.body
    return {
        "run": run.run_id,
        "task": body["task"],
        "name": body["name"],
        "dataset": manifest_dataset(body),
        "params": footprint.parameters,
        "memory": footprint.memory_needed,
        "upload": footprint.payload_bytes,
        "download": footprint.exchange_bytes_down(),
        "inner_steps": footprint.inner_steps,
        "round_deadline_s": float(footprint.round_deadline_s),
        "members": len(run.members) + run.joining,
        "rounds": run.rounds,
        "created": body["created"],
    }


def manifest_dataset(body: Mapping[str, Any]) -> str:
    """The dataset a run's manifest names ("" for a task whose data is built in): at most 128 characters."""
    dataset = body["task_config"].get("dataset", "")
    return dataset[:128] if isinstance(dataset, str) else ""


class CardPublisher:
    """Keeps this node's cards record and directory keys in step with the runs it keeps."""

    def __init__(self, discovery: Discovery, replicas: Callable[[], Iterable[Replica]], *,
                 offload: Offload = trio.to_thread.run_sync, poll_interval: float = POLL_INTERVAL,
                 refresh_interval: float = REFRESH_INTERVAL) -> None:
        """`replicas()`: the replicas this node holds now (node/replication/service.py's).
        `offload(function, *args)`: runs the footprint (it builds the task's model on torch's meta
        device): a thread in the daemon, inline in the simulator."""
        self.discovery = discovery
        self.replicas = replicas
        self.offload = offload
        self.poll_interval = poll_interval
        self.refresh_interval = refresh_interval
        self.me = discovery.identity.public_key
        self.cards: list[dict[str, Any]] = []  # the last record published
        self.provided: set[str] = set()
        self._published: frozenset[bytes] | None = None  # the runs of the last record; None: none yet
        self._next_refresh = 0.0
        self._bodies: dict[bytes, dict[str, Any] | None] = {}  # run -> manifest body if public
        self._footprints: dict[tuple[bytes, int], Footprint | None] = {}

    async def run(self) -> None:
        """Publish and refresh until cancelled (starts once the DHT's routing table holds a peer)."""
        await self.discovery.wait_seeded()
        while True:
            try:
                await self.update()
            except Exception:  # a bug in the directory must not take the node down
                logger.exception("updating this node's run cards failed")
            await trio.sleep(self.poll_interval)

    def kept(self) -> list[Standing]:
        """The public runs whose card this node keeps now, by run ID (at most `MAX_CARDS`)."""
        kept = []
        for replica in list(self.replicas()):
            body = self._public_body(replica)
            if body is None:
                continue
            run = standing(replica, body)
            if self.me in card_keepers(run.run_id, run.members, run.creator):
                kept.append(run)
        return sorted(kept, key=lambda run: run.run_id)[:MAX_CARDS]

    async def update(self) -> None:
        """Publish our cards if the runs we keep changed or the refresh is due; provide the directory
        keys of those runs for this epoch, and stop providing the others."""
        now = self.discovery.clock()
        cards = [card for run in self.kept() if (card := await self._card(run)) is not None]
        runs = frozenset(card["run"] for card in cards)
        changed = runs != (self._published or frozenset())
        if (changed or (runs and now >= self._next_refresh)) and await self._publish(cards):
            self._published, self._next_refresh = runs, now + self.refresh_interval
        wanted = {records.directory_key(epoch, records.directory_shard(run))
                  for epoch in records.keeper_epochs(now) for run in runs}
        for key in self.provided - wanted:
            self.discovery.stop_providing(key)
        for key in sorted(wanted - self.provided):
            await self.discovery.provide(key)
        self.provided = wanted

    async def _publish(self, cards: list[dict[str, Any]]) -> bool:
        try:
            await self.discovery.publish_cards(cards, ttl=CARDS_TTL)
        except (DiscoveryError, ProtocolError) as error:
            logger.info("publishing the cards of %d runs failed: %s", len(cards), error)
            return False
        self.cards = cards
        if cards or self._published:
            logger.info("published the cards of %s", ", ".join(short_run_id(card["run"]) for card in cards) or "no run")
        return True

    def _public_body(self, replica: Replica) -> dict[str, Any] | None:
        run_id = replica.run_id
        if run_id not in self._bodies:
            body = decode(replica.genesis.manifest, kinds=frozenset({RUN_MANIFEST.name})).body
            self._bodies[run_id] = body if body["public"] else None  # a run that is not public gets no card
        return self._bodies[run_id]

    async def _card(self, run: Standing) -> dict[str, Any] | None:
        key = (run.run_id, len(run.members))
        if key not in self._footprints:
            if len(self._footprints) >= _FOOTPRINT_CACHE:
                self._footprints.clear()
            try:
                self._footprints[key] = await self.offload(_footprint, run.body, len(run.members))
            except Exception as error:  # noqa: BLE001 - a user task's model code is code we do not know
                logger.warning("run %s gets no card: its footprint failed: %s", short_run_id(run.run_id), error)
                self._footprints[key] = None
        footprint = self._footprints[key]
        return None if footprint is None else make_card(run, footprint)


def _footprint(body: dict[str, Any], members: int) -> Footprint:
    return run_footprint(body, contributors=members)
