"""Browsing the directory of public runs: find the card keepers, read their cards, verify, merge, rank.

`browse(discovery)` knows no run ID beforehand. It asks the DHT for the providers of every
directory key of this epoch (dht/records.py: `directory_keys`) and reads each shard's providers
in full, taking them in turn across shards (`find_keepers`): a shard whose provider slots
strangers filled first hides only the keepers that came after them in that shard, never another
shard's. It fetches those keepers' cards records (each re-validated: signed by the keeper, not
expired) and groups the cards by run, one card per keeper per run. Which runs are looked at
further is chosen in turn across keepers (`candidates`): a keeper that claims many runs, or huge
numbers, gets no more turns than one that claims one.

A card is a claim, and a stranger can sign one for any run. So for each candidate run the browser
fetches, from the DHT, what the card's signer cannot forge:

* the run's manifest (``/locomesh/run/<id>``, bound to its key by hash): cards whose static
  fields (task, name, dataset, created, inner steps, round deadline) contradict it are dropped,
  and a run without a findable manifest is not listed;
* the run's participants: the providers of its run key (every member provides it when it takes
  the run up, node/rounds/meeting.py; the key is the manifest's hash, so no one could fill its
  provider slots before the run existed, and its first members hold them), plus the keys its
  manifest names (creator, allowlist).

A card counts only if its signer is one of those participants (a **verified keeper**), every
verified keeper once. The numbers keepers may differ on (parameters, memory, bandwidth, members,
rounds) are the creator's card while it keeps one (the manifest's signer is the run's root of
trust: a creator that lies lists its own run wrongly, no one else's), else the lower median of
the verified keepers' cards: to lower a number takes half of them, to raise one more than half.
So a stranger's card alone cannot set a run's numbers or hide it. Members are further capped at
the participants the browser saw: a run's own Sybils can list it, but with no more members than
identities that really provide its key.

Limits. Providing a run key proves no membership: anyone can provide any key while its holders
have room, so a stranger that provides a run's key is a participant to the browser, one keeper
among the run's; once the creator keeps no card, strangers as many as its honest keepers set the
lower median. Holders keep 20 providers
per key, so a run with more members shows at most that many (a lower bound), and a keeper of a
large run that is not among its key's first providers is verified only if it is named in the
manifest; a run left with no verified keeper is not listed. Rounds are the verified keepers'
claim: nothing here checks a round certificate (that needs the run's op log).

Listed most active first: by members, then rounds, then creation time, newest first. Every phase
has a deadline, every fan-out a bound (`MAX_KEEPERS` records, `CONCURRENCY` lookups at once);
what did not answer in time is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import trio

from locomesh.crdt import Genesis
from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol import ProtocolError, peer_id_from_public_key
from locomesh.protocol.runs import format_run_id, short_run_id
from locomesh.training.run_settings import RoundSettings, RunSettingsError

from .cards import manifest_dataset

logger = logging.getLogger(__name__)

PROVIDERS_PER_KEY = 20  # a holder keeps 20 per key (py-libp2p's k)
MAX_KEEPERS = PROVIDERS_PER_KEY * records.DIRECTORY_SHARDS  # every shard's providers, in full
CONCURRENCY = 8
PHASE_TIMEOUT = 20.0  # seconds for each of: finding keepers, reading their cards, checking manifests
MAX_LIMIT = 100
EXTRA_CANDIDATES = 2  # runs looked at per run listed: room for claimed runs that fail their checks
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
    keepers: int  # the verified keepers whose cards agreed with the manifest

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
    runs_dropped: int  # no manifest found, or no verified keeper's card that agreed with it

    def as_json(self) -> dict[str, Any]:
        return {"runs": [listing.as_json() for listing in self.listings], "keepers_found": self.keepers_found,
                "records_read": self.records_read, "runs_claimed": self.runs_claimed, "runs_dropped": self.runs_dropped}


# --- the pure part -----------------------------------------------------------------------------------


def group_cards(cards_records: Iterable[tuple[str, int, Sequence[dict[str, Any]]]], task: str | None = None
                ) -> dict[bytes, dict[str, tuple[int, dict[str, Any]]]]:
    """run -> {keeper: (updated, card)} from (keeper, updated, cards) records, one card per keeper
    per run; only runs of `task` if given."""
    claims: dict[bytes, dict[str, tuple[int, dict[str, Any]]]] = {}
    for keeper, updated, cards in cards_records:
        for card in cards:
            if task is None or card["task"] == task:
                claims.setdefault(card["run"], {}).setdefault(keeper, (updated, card))
    return claims


def candidates(claims: dict[bytes, dict[str, tuple[int, dict[str, Any]]]], count: int) -> list[bytes]:
    """At most `count` runs to check, taken in turn across keepers (each keeper's own claims best
    first), so no keeper, and no number it claims, crowds out the runs the others keep."""
    per_keeper: dict[str, list[tuple[tuple, bytes]]] = {}
    for run, by_keeper in claims.items():
        for keeper, (_updated, card) in by_keeper.items():
            per_keeper.setdefault(keeper, []).append(((-card["members"], -card["rounds"], -card["created"]), run))
    queues = [sorted(entries) for _keeper, entries in sorted(per_keeper.items())]
    chosen: dict[bytes, None] = {}
    for turn in range(max((len(queue) for queue in queues), default=0)):
        for queue in queues:
            if len(chosen) >= count:
                return list(chosen)
            if turn < len(queue):
                chosen.setdefault(queue[turn][1], None)
    return list(chosen)


def manifest_facts(body: dict[str, Any]) -> dict[str, Any] | None:
    """The static fields a card must repeat, from the run's manifest body; None for settings no
    node would train (a joiner refuses them too)."""
    try:
        settings = RoundSettings.from_hparams(body["hparams"])
    except RunSettingsError:
        return None
    return {"task": body["task"], "name": body["name"], "dataset": manifest_dataset(body), "created": body["created"],
            "inner_steps": settings.inner_steps, "round_deadline_s": float(settings.round_deadline_s)}


def counted_keepers(claimed_by: Iterable[str], participants: Iterable[str], creator: str,
                    named: Iterable[str] = ()) -> list[str]:
    """The keepers whose cards count for a run: of those that claim it (`claimed_by`), every one
    the browser verified as a participant (`participants`: its run key's providers; `named`: keys
    its manifest names, `creator` among them). All of them, not a few chosen by key: a key can be
    ground to rank first, so a choice by key would hand the count to whoever grinds. Sorted."""
    return sorted(set(claimed_by) & (set(participants) | set(named) | {creator}))


def merge(run_id: bytes, facts: dict[str, Any], claims: dict[str, tuple[int, dict[str, Any]]],
          counted: Sequence[str], creator: str, seen: int) -> Listing | None:
    """The listing of `run_id` from the cards of the `counted` keepers (`counted_keepers`) that
    agree with its manifest's `facts`, or None if none agrees. Numbers: the creator's card if it
    agrees, else the lower median of the agreeing cards; members at most `seen` (the participants
    the browser found)."""
    agreeing = {keeper: claims[keeper] for keeper in counted if keeper in claims
                and all(claims[keeper][1][name] == facts[name] for name in STATIC_FIELDS)}
    if not agreeing:
        return None
    if creator in agreeing:
        numbers = {name: agreeing[creator][1][name] for name in MEDIAN_FIELDS}
    else:
        numbers = {name: lower_median([card[name] for _updated, card in agreeing.values()]) for name in MEDIAN_FIELDS}
    numbers["members"] = min(numbers["members"], max(seen, len(agreeing)))
    return Listing(run_id=run_id, **facts, **numbers, updated=max(updated for updated, _card in agreeing.values()),
                   keepers=len(agreeing))


def lower_median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


# --- the network part --------------------------------------------------------------------------------


async def browse(discovery: Discovery, *, task: str | None = None, limit: int = 50) -> BrowseResult:
    """The public runs the directory lists now (of `task` if given), at most `limit`, best first;
    each with the numbers of its verified keepers only (module docstring)."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    keepers = await find_keepers(discovery)
    cards_records = await read_cards(discovery, keepers)
    claims = group_cards(((peer, body["updated"], body["cards"]) for peer, body in cards_records), task)
    chosen = candidates(claims, EXTRA_CANDIDATES * limit + CONCURRENCY)
    checked = await _bounded_map(chosen, lambda run: _check_run(discovery, run))
    listings = []
    for run, found in zip(chosen, checked):
        if found is None:
            continue
        facts, creator, named, participants = found
        counted = counted_keepers(claims[run], participants, creator, named)
        listing = merge(run, facts, claims[run], counted, creator, len(set(participants) | set(counted)))
        if listing is not None:
            listings.append(listing)
    listings.sort(key=Listing.rank)
    return BrowseResult(listings[:limit], len(keepers), len(cards_records), len(claims), len(chosen) - len(listings))


async def find_keepers(discovery: Discovery) -> list[str]:
    """The peers that provide a directory key now (us included if we do): every shard's providers
    (as many as a holder keeps), taken in turn across shards, each once, at most `MAX_KEEPERS`."""

    async def providers(key: str) -> list[str]:
        try:
            return [str(info.peer_id) for info in await discovery.find_providers(key, limit=PROVIDERS_PER_KEY)]
        except DiscoveryError as error:
            logger.debug("directory lookup %s failed: %s", key, error)
            return []

    found = [peers or [] for peers in await _bounded_map(records.directory_keys(discovery.clock()), providers)]
    in_turn = (shard[index] for index in range(PROVIDERS_PER_KEY) for shard in found if index < len(shard))
    return list(dict.fromkeys(in_turn))[:MAX_KEEPERS]


async def read_cards(discovery: Discovery, keepers: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(keeper, body) of the keepers' newest valid cards records (those found in time)."""

    async def one(peer: str) -> tuple[str, dict[str, Any]] | None:
        try:
            envelope = await discovery.find_cards(peer)
        except (DiscoveryError, ProtocolError) as error:
            logger.debug("cards of %s: %s", peer, error)
            return None
        return None if envelope is None else (peer, envelope.body)

    return [found for found in await _bounded_map(keepers, one) if found is not None]


async def _check_run(discovery: Discovery, run: bytes) -> tuple[dict[str, Any], str, list[str], list[str]] | None:
    """(facts, creator, named, participants) of `run`, from its manifest and its run key's
    providers; None without a usable manifest."""
    try:
        found = await discovery.find_run(run)
    except (DiscoveryError, ProtocolError) as error:
        logger.debug("manifest of %s: %s", short_run_id(run), error)
        return None
    if found is None or (facts := manifest_facts(found[1].body)) is None:
        return None
    try:
        genesis = Genesis.from_manifest(found[0])
        participants = [str(info.peer_id) for info in
                        await discovery.find_providers(records.run_key(run), limit=PROVIDERS_PER_KEY)]
    except (DiscoveryError, ProtocolError, ValueError) as error:
        logger.debug("participants of %s: %s", short_run_id(run), error)
        return None
    named = [peer_id_from_public_key(key) for key in sorted(genesis.trusted)]
    return facts, peer_id_from_public_key(genesis.creator), named, participants


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
