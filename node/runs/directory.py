"""Browsing the directory of public runs: find the card keepers, read their cards, check, merge, rank.

`browse(discovery)` knows no run ID beforehand. It asks the DHT for the providers of every
directory key of this epoch (dht/records.py: `directory_keys`), fetches
those keepers' cards records (each re-validated: signed by the keeper, not expired), and groups
the cards by run. A card is a claim: the browser fetches each listed run's manifest from the DHT
(``/locomesh/run/<id>``, bound to its key by hash) and drops the cards whose static fields
(task, name, dataset, created, inner steps, round deadline) contradict it, and a run without a
findable manifest. The numbers keepers may differ on (parameters, memory, bandwidth, members,
rounds) are their lower median: one keeper in three lying cannot raise them, and the honest
counts of keepers that saw a run at slightly different moments stay close.

Listed newest and most active first: by members (active members, as keepers count them), then
certified rounds, then creation time, newest first. Every phase has a deadline, every fan-out a
bound (`MAX_KEEPERS` records, `CONCURRENCY` lookups at once); what did not answer in time is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import trio

from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import format_run_id, short_run_id
from locomesh.training.run_settings import RoundSettings, RunSettingsError

from .cards import manifest_dataset

logger = logging.getLogger(__name__)

PROVIDERS_PER_KEY = 20  # a holder keeps 20 per key (py-libp2p's k)
MAX_KEEPERS = 64  # cards records fetched per browse
CONCURRENCY = 8
PHASE_TIMEOUT = 20.0  # seconds for each of: finding keepers, reading their cards, checking manifests
MAX_LIMIT = 100
STATIC_FIELDS = ("task", "name", "dataset", "created", "inner_steps", "round_deadline_s")
MEDIAN_FIELDS = ("params", "memory", "upload", "download", "members", "rounds")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Listing:
    """One public run as the directory lists it (JSON-ready through `as_json`)."""

    run_id: bytes
    task: str
    name: str
    dataset: str
    params: int
    memory: int
    upload: int
    download: int
    inner_steps: int
    round_deadline_s: float
    members: int
    rounds: int
    created: int
    updated: int  # the newest keeper record that lists it
    keepers: int  # the keepers whose cards agreed with the manifest

    def as_json(self) -> dict[str, Any]:
        fields = asdict(self)
        del fields["run_id"]
        return {"run_id": format_run_id(self.run_id), "short_id": short_run_id(self.run_id), **fields,
                "join": f"locomesh run join {format_run_id(self.run_id)}"}

    def rank(self) -> tuple:
        return (-self.members, -self.rounds, -self.created, self.run_id)


@dataclass
class BrowseResult:
    listings: list[Listing]
    keepers_found: int
    records_read: int
    runs_claimed: int
    runs_dropped: int  # no manifest found, or no card that agreed with it

    def as_json(self) -> dict[str, Any]:
        return {"runs": [listing.as_json() for listing in self.listings], "keepers_found": self.keepers_found,
                "records_read": self.records_read, "runs_claimed": self.runs_claimed, "runs_dropped": self.runs_dropped}


# --- the pure part -----------------------------------------------------------------------------------


def group_cards(cards_records: Iterable[tuple[int, Sequence[dict[str, Any]]]], task: str | None = None
                ) -> dict[bytes, list[tuple[int, dict[str, Any]]]]:
    """run -> [(updated, card)], one entry per keeper record; only runs of `task` if given."""
    claims: dict[bytes, list[tuple[int, dict[str, Any]]]] = {}
    for updated, cards in cards_records:
        for card in cards:
            if task is None or card["task"] == task:
                claims.setdefault(card["run"], []).append((updated, card))
    return claims


def manifest_facts(body: dict[str, Any]) -> dict[str, Any] | None:
    """The static fields a card must repeat, from the run's manifest body; None for settings no
    node would train (a joiner refuses them too)."""
    try:
        settings = RoundSettings.from_hparams(body["hparams"])
    except RunSettingsError:
        return None
    return {"task": body["task"], "name": body["name"], "dataset": manifest_dataset(body), "created": body["created"],
            "inner_steps": settings.inner_steps, "round_deadline_s": float(settings.round_deadline_s)}


def merge(run_id: bytes, facts: dict[str, Any], claims: Sequence[tuple[int, dict[str, Any]]]) -> Listing | None:
    """The listing of `run_id` from the keepers' `claims` that agree with its manifest's `facts`
    (each number their lower median), or None if none agrees."""
    agreeing = [(updated, card) for updated, card in claims
                if all(card[name] == facts[name] for name in STATIC_FIELDS)]
    if not agreeing:
        return None
    numbers = {name: lower_median([card[name] for _updated, card in agreeing]) for name in MEDIAN_FIELDS}
    return Listing(run_id=run_id, **facts, **numbers, updated=max(updated for updated, _card in agreeing),
                   keepers=len(agreeing))


def lower_median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def claimed_rank(claims: Sequence[tuple[int, dict[str, Any]]]) -> tuple:
    """How a run ranks before its manifest is checked (the order manifests are fetched in)."""
    members = lower_median([card["members"] for _u, card in claims])
    rounds = lower_median([card["rounds"] for _u, card in claims])
    return (-members, -rounds, -max(card["created"] for _u, card in claims))


# --- the network part --------------------------------------------------------------------------------


async def browse(discovery: Discovery, *, task: str | None = None, limit: int = 50) -> BrowseResult:
    """The public runs the directory lists now (of `task` if given), at most `limit`, best first."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    keepers = await find_keepers(discovery)
    cards_records = await read_cards(discovery, keepers)
    claims = group_cards(((body["updated"], body["cards"]) for body in cards_records), task)
    candidates = sorted(claims, key=lambda run: (claimed_rank(claims[run]), run))[: limit + CONCURRENCY]
    manifests = await _bounded_map(candidates, lambda run: _manifest_facts(discovery, run))
    listings = [listing for run, facts in zip(candidates, manifests)
                if facts is not None and (listing := merge(run, facts, claims[run])) is not None]
    listings.sort(key=Listing.rank)
    return BrowseResult(listings[:limit], len(keepers), len(cards_records), len(claims),
                        len(candidates) - len(listings))


async def find_keepers(discovery: Discovery) -> list[str]:
    """The peers that provide a directory key now (us included if we do), at most `MAX_KEEPERS`."""

    async def providers(key: str) -> list[str]:
        try:
            return [str(info.peer_id) for info in await discovery.find_providers(key, limit=PROVIDERS_PER_KEY)]
        except DiscoveryError as error:
            logger.debug("directory lookup %s failed: %s", key, error)
            return []

    found = await _bounded_map(records.directory_keys(discovery.clock()), providers)
    return list(dict.fromkeys(peer for peers in found if peers for peer in peers))[:MAX_KEEPERS]


async def read_cards(discovery: Discovery, keepers: Sequence[str]) -> list[dict[str, Any]]:
    """The bodies of the keepers' newest valid cards records (those found in time)."""

    async def one(peer: str) -> dict[str, Any] | None:
        try:
            envelope = await discovery.find_cards(peer)
        except (DiscoveryError, ProtocolError) as error:
            logger.debug("cards of %s: %s", peer, error)
            return None
        return None if envelope is None else envelope.body

    return [body for body in await _bounded_map(keepers, one) if body is not None]


async def _manifest_facts(discovery: Discovery, run: bytes) -> dict[str, Any] | None:
    try:
        found = await discovery.find_run(run)
    except (DiscoveryError, ProtocolError) as error:
        logger.debug("manifest of %s: %s", short_run_id(run), error)
        return None
    return None if found is None else manifest_facts(found[1].body)


async def _bounded_map(items: Sequence[T], call: Callable[[T], Awaitable[R | None]]) -> list[R | None]:
    """`call(item)` for each item, `CONCURRENCY` at a time, within `PHASE_TIMEOUT` (None where it did not end)."""
    results: list[R | None] = [None] * len(items)
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def one(index: int) -> None:
        async with limiter:
            results[index] = await call(items[index])

    with trio.move_on_after(PHASE_TIMEOUT):
        async with trio.open_nursery() as nursery:
            for index in range(len(items)):
                nursery.start_soon(one, index)
    return results
