"""The directory of public runs: cards records, card keepers, publishing, merging, and browsing from a
daemon that knows no run ID (two real daemons; the 200-node case is tests/test_netsim_directory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from locomesh.crdt import Genesis, Replica
from locomesh.dht import records
from locomesh.dht.validator import select, validate
from locomesh.protocol import Identity, ProtocolError, decode
from locomesh.protocol.kinds import MAX_CARDS
from locomesh.protocol.runs import run_id, sign_manifest
from locomesh.node.runs import directory
from locomesh.node.runs.cards import CardPublisher, card_keepers, make_card, standing
from locomesh.training.footprint import run_footprint
from locomesh.training.run_settings import default_hparams

from .test_crdt_support import certify

NOW = 1_800_000_000
TASK_CONFIG = {"alphabet": 32}


def identity(index: int) -> Identity:
    return Identity.from_seed(bytes([index + 1]) * 32)


def card(run: bytes, **changes) -> dict:
    base = {"run": run, "task": "synthetic-lm", "name": "toy", "dataset": "", "params": 1000, "memory": 2**20,
            "upload": 4096, "download": 8192, "inner_steps": 50, "round_deadline_s": 600.0, "members": 3,
            "rounds": 7, "created": NOW - 100}
    return {**base, **changes}


def cards_record(who: Identity, cards: list, *, seq: int = 1, expires: int = NOW + 600, updated: int = NOW) -> bytes:
    return records.sign_cards_record(who, cards=cards, seq=seq, updated=updated, expires=expires)


# --- the record ------------------------------------------------------------------------------------


def test_a_cards_record_is_bound_to_its_peer_and_lives_an_hour_at_most():
    alice, bob = identity(0), identity(1)
    key = records.cards_key(alice.peer_id)
    value = cards_record(alice, [card(b"r" * 32)])
    assert validate(key, value, now=NOW).body["cards"][0]["members"] == 3
    refusals = {
        "wrong-author": (records.cards_key(bob.peer_id), value),
        "expired": (key, cards_record(alice, [], expires=NOW)),
        "expires-too-late": (key, cards_record(alice, [], expires=NOW + records.MAX_CARDS_TTL + 1)),
        "duplicate-card": (key, cards_record(alice, [card(b"r" * 32), card(b"r" * 32, members=9)])),
        "from-the-future": (key, cards_record(alice, [], updated=NOW + 2 * records.MAX_CARDS_TTL)),
    }
    for code, (where, what) in refusals.items():
        with pytest.raises(ProtocolError) as refused:
            validate(where, what, now=NOW)
        assert refused.value.code == code
    with pytest.raises(ProtocolError):  # one card too many: the schema refuses it when it is signed
        cards_record(alice, [card(bytes([i]) * 32) for i in range(MAX_CARDS + 1)])
    with pytest.raises(ProtocolError):
        validate(key, value + b"\0" * 40_000, now=NOW)  # over the kind's cap, refused before it is parsed


def test_the_highest_seq_wins_and_an_expired_record_never_does():
    alice = identity(0)
    key = records.cards_key(alice.peer_id)
    old, new = cards_record(alice, [card(b"r" * 32)], seq=1), cards_record(alice, [], seq=2)
    expired = cards_record(alice, [], seq=9, expires=NOW + 10)
    assert select(key, [old, new], now=NOW) == 1 and select(key, [new, old], now=NOW) == 0
    assert select(key, [expired, old], now=NOW + 20) == 1


def test_directory_keys_cover_every_shard_and_keepers_provide_the_next_epoch_early():
    keys = records.directory_keys(NOW)
    epoch = NOW // records.DIRECTORY_EPOCH
    assert len(keys) == records.DIRECTORY_SHARDS and len(set(keys)) == len(keys)
    assert records.directory_key(epoch, records.directory_shard(b"\x09" * 32)) in keys
    assert all(len(key) <= 80 for key in keys)
    start = epoch * records.DIRECTORY_EPOCH
    ahead = records.DIRECTORY_LEAD // records.DIRECTORY_EPOCH
    assert records.keeper_epochs(start) == list(range(epoch, epoch + ahead + 1))
    assert records.keeper_epochs(start + 1)[-1] == epoch + ahead
    with pytest.raises(ValueError):
        records.directory_key(epoch, records.DIRECTORY_SHARDS)


# --- keepers and cards -----------------------------------------------------------------------------


def test_card_keepers_are_a_few_members_every_member_computes_alike():
    members = [identity(i).public_key for i in range(12)]
    creator = identity(11).public_key
    run = b"k" * 32
    keepers = card_keepers(run, members, creator)
    assert card_keepers(run, list(reversed(members)), creator) == keepers
    assert creator in keepers and len(keepers) in (3, 4) and keepers <= set(members)
    assert creator not in card_keepers(run, members[:5], creator)  # the creator keeps it only while a member
    assert card_keepers(run, [], creator) == frozenset()


def make_run(creator: Identity, *, public: bool = True, name: str = "toy",
             admitted: tuple[Identity, ...] = ()) -> tuple[bytes, Replica]:
    manifest = sign_manifest(creator, task="synthetic-lm", name=name, task_config=TASK_CONFIG, hparams=default_hparams(),
                             public=public, created=NOW - 100, admitted=[who.public_key for who in admitted])
    return manifest, Replica(Genesis.from_manifest(manifest))


def test_a_card_says_what_the_manifest_and_the_replica_say():
    creator, other = identity(0), identity(1)
    manifest, replica = make_run(creator)
    for who in (creator, other):
        replica.create(who, "join", round=1)
    body = decode(manifest).body
    assert standing(replica, body).members == (creator.public_key,), "a join counts once a certified round admits it"
    certify(replica, [creator, other])
    run = standing(replica, body)
    assert run.members == tuple(sorted((creator.public_key, other.public_key))) and run.rounds == 1
    made = make_card(run, run_footprint(body, contributors=2))
    assert made["run"] == run_id(manifest) and made["members"] == 2 and made["params"] > 0
    assert made["download"] == made["upload"] and made["memory"] > 4 * made["params"]
    facts = directory.manifest_facts(body)
    assert all(made[name] == facts[name] for name in directory.STATIC_FIELDS)


class FakeDiscovery:
    """What `CardPublisher` uses of `Discovery`, recording what it was asked to do."""

    def __init__(self, me: Identity) -> None:
        self.identity, self.now = me, float(NOW)
        self.published: list[list[dict]] = []
        self.providing: set[str] = set()

    def clock(self) -> float:
        return self.now

    async def wait_seeded(self) -> None:
        return None

    async def publish_cards(self, cards, *, ttl):
        records.sign_cards_record(self.identity, cards=cards, seq=1, updated=int(self.now), expires=int(self.now + ttl))
        self.published.append(list(cards))

    async def provide(self, key: str) -> None:
        self.providing.add(key)

    def stop_providing(self, key: str) -> None:
        self.providing.discard(key)


async def inline(function, *args):
    return function(*args)


async def test_a_keeper_publishes_refreshes_and_retracts_its_cards():
    me, other = identity(0), identity(1)
    public_manifest, public = make_run(me, admitted=(other,))
    _private_manifest, private = make_run(me, public=False, name="secret")
    for replica in (public, private):
        replica.create(me, "join", round=1)
    discovery = FakeDiscovery(me)
    publisher = CardPublisher(discovery, lambda: [public, private], offload=inline, refresh_interval=600)
    await publisher.update()
    assert [[c["name"] for c in cards] for cards in discovery.published] == [["toy"]]  # the private run gets none
    def shard_keys(now: float) -> set:
        shard = records.directory_shard(run_id(public_manifest))
        return {records.directory_key(epoch, shard) for epoch in records.keeper_epochs(now)}

    assert discovery.providing == shard_keys(NOW) and len(shard_keys(NOW)) > 1  # later epochs' keys early

    await publisher.update()  # nothing changed, no refresh due: no new record
    discovery.now += 601
    await publisher.update()
    assert len(discovery.published) == 2  # refreshed

    discovery.now += records.DIRECTORY_EPOCH  # a new epoch: the new key, not the old one
    await publisher.update()
    assert discovery.providing == shard_keys(discovery.now)

    public.create(other, "join", round=1)
    certify(public, [me, other])
    public.create(me, "leave", round=2)
    await publisher.update()
    assert discovery.published[-1] != [], "a leave takes effect once a certified round names it"
    certify(public, [me, other], contributors=[other])  # it votes until then, and sends no payload
    assert public.chain.tip.electorate == {other.public_key}
    await publisher.update()
    assert discovery.published[-1] == [] and discovery.providing == set()  # retracted, no longer provided
    count = len(discovery.published)
    discovery.now += 10_000
    await publisher.update()
    assert len(discovery.published) == count  # an empty record is published once


async def test_a_member_that_is_not_a_keeper_publishes_nothing():
    creator = identity(0)
    manifest, replica = make_run(creator)
    members = [identity(i) for i in range(1, 8)]
    for who in [creator, *members]:
        replica.create(who, "join", round=1)
    certify(replica, [creator, *members])  # round 1 admits the joins
    assert len(replica.state.members) == 8
    keepers = card_keepers(run_id(manifest), replica.state.members, creator.public_key)
    outsider = next(who for who in members if who.public_key not in keepers)
    discovery = FakeDiscovery(outsider)
    await CardPublisher(discovery, lambda: [replica], offload=inline).update()
    assert discovery.published == [] and discovery.providing == set()


# --- merging what keepers claim --------------------------------------------------------------------


def test_cards_that_contradict_the_manifest_are_dropped_and_numbers_are_lower_medians():
    run = b"m" * 32
    facts = {"task": "synthetic-lm", "name": "toy", "dataset": "", "created": NOW - 100, "inner_steps": 50,
             "round_deadline_s": 600.0}
    peers = [identity(i).peer_id for i in range(5)]
    claims = {peers[0]: (NOW - 5, card(run, members=3)), peers[1]: (NOW - 1, card(run, members=4)),
              peers[2]: (NOW, card(run, members=1000)), peers[3]: (NOW, card(run, name="free money", members=10**6))}
    listing = directory.merge(run, facts, claims, peers[:4], peers[4], seen=9)
    assert listing is not None and listing.keepers == 3 and listing.members == 4 and listing.updated == NOW
    assert directory.merge(run, {**facts, "created": 1}, claims, peers[:4], peers[4], seen=9) is None
    creator_says = directory.merge(run, facts, claims, peers[:4], peers[0], seen=9)
    assert creator_says.members == 3  # the creator's card, while it keeps one
    assert directory.merge(run, facts, claims, peers[:4], peers[2], seen=6).members == 6  # no more than seen
    grouped = directory.group_cards([(peers[0], NOW, [card(run), card(b"n" * 32, task="llama")])], task="llama")
    assert list(grouped) == [b"n" * 32]


def test_only_verified_participants_count_each_once():
    peers = [identity(i).peer_id for i in range(8)]
    creator = peers[0]
    counted = directory.counted_keepers(peers + peers, participants=peers[1:6], creator=creator, named=[creator])
    assert counted == sorted(peers[:6])
    assert directory.counted_keepers(peers[6:], participants=peers[1:6], creator=creator) == []


def test_candidates_take_turns_across_keepers():
    sybil, honest = identity(0).peer_id, identity(1).peer_id
    claims = {bytes([i]) * 32: {sybil: (NOW, card(bytes([i]) * 32, members=10**9))} for i in range(20)}
    claims[b"h" * 32] = {honest: (NOW, card(b"h" * 32, members=1))}
    assert b"h" * 32 in directory.candidates(claims, 2)


def test_listings_rank_most_members_first_then_rounds_then_newest():
    def listing(run: bytes, members: int, rounds: int, created: int) -> directory.Listing:
        return directory.Listing(run, "t", "", "", 1, 1, 1, 1, 1, 1.0, members, rounds, created, NOW, 1)

    ranked = sorted([listing(b"a" * 32, 2, 9, 5), listing(b"b" * 32, 5, 0, 1), listing(b"c" * 32, 2, 9, 7)],
                    key=directory.Listing.rank)
    assert [entry.run_id[:1] for entry in ranked] == [b"b", b"c", b"a"]
    shown = ranked[0].as_json()
    assert shown["join"] == f"locomesh run join {shown['run_id']}" and len(shown["short_id"]) == 16


def test_the_browse_table_says_how_to_join_and_why_it_is_empty():
    from locomesh.cli.run_browse import format_listings

    entry = directory.Listing(b"a" * 32, "synthetic-lm", "toy", "", 1_234_567, 2**30, 2**20, 2**21, 50, 600.0,
                              3, 7, NOW, NOW, 2).as_json()
    table = format_listings({"runs": [entry], "keepers_found": 2, "records_read": 2, "runs_claimed": 1, "runs_dropped": 0})
    assert "1.2 M" in table and "1.0 GiB" in table and "50 steps / 600 s" in table and entry["join"] in table
    empty = format_listings({"runs": [], "keepers_found": 0, "records_read": 0, "runs_claimed": 0, "runs_dropped": 0})
    assert "no public run" in empty and "--public" in empty


class DirectoryDiscovery:
    """What `browse` uses of `Discovery`: providers per key, cards records per peer, manifests per run."""

    def __init__(self, providers: dict, cards: dict, manifests: dict) -> None:
        self.providers, self.cards, self.manifests = providers, cards, manifests
        self.asked: list[str] = []

    def clock(self) -> float:
        return float(NOW)

    async def find_providers(self, key: str, *, limit: int):
        self.asked.append(key)
        return [type("Info", (), {"peer_id": peer})() for peer in self.providers.get(key, [])][:limit]

    async def find_cards(self, peer: str):
        value = self.cards.get(peer)
        return None if value is None else validate(records.cards_key(peer), value, now=NOW)

    async def find_run(self, run: bytes, **_options):
        manifest = self.manifests.get(run)
        return None if manifest is None else (manifest, decode(manifest))


async def test_browse_checks_cards_against_manifests_and_ranks_the_runs():
    keepers = [identity(i) for i in range(3)]
    runs = [make_run(identity(10 + i), name=f"run{i}")[0] for i in range(3)]
    ids = [run_id(manifest) for manifest in runs]

    def honest(manifest: bytes, members: int) -> dict:
        body = decode(manifest).body
        return card(run_id(manifest), name=body["name"], created=body["created"], members=members)

    cards = {
        keepers[0].peer_id: cards_record(keepers[0], [honest(runs[0], 2), honest(runs[1], 5), honest(runs[2], 9)]),
        keepers[1].peer_id: cards_record(keepers[1], [honest(runs[0], 2), {**honest(runs[1], 6), "task": "llama"}]),
        keepers[2].peer_id: cards_record(keepers[2], [honest(runs[0], 3)]),
    }
    key = records.directory_key(NOW // records.DIRECTORY_EPOCH, 0)
    manifests = {ids[0]: runs[0], ids[1]: runs[1]}  # run 2's manifest is nowhere: it cannot be joined
    others = [identity(20 + i).peer_id for i in range(4)]
    providers = {key: [keeper.peer_id for keeper in keepers], records.run_key(ids[0]): [k.peer_id for k in keepers],
                 records.run_key(ids[1]): [keepers[0].peer_id, keepers[1].peer_id, *others]}
    discovery = DirectoryDiscovery(providers, cards, manifests)
    result = await directory.browse(discovery)
    assert set(records.directory_keys(NOW)) <= set(discovery.asked)
    assert [listing.run_id for listing in result.listings] == [ids[1], ids[0]]  # most members first
    assert [(listing.members, listing.keepers) for listing in result.listings] == [(5, 1), (2, 3)]
    assert (result.keepers_found, result.records_read, result.runs_claimed, result.runs_dropped) == (3, 3, 3, 1)
    providers[records.run_key(ids[0])] = keepers[0].peer_id,  # the others are no participants: not counted
    assert [(listing.members, listing.keepers) for listing in (await directory.browse(discovery)).listings] == [
        (5, 1), (1, 1)]
    only = await directory.browse(discovery, task="llama")
    assert only.listings == [] and only.runs_claimed == 1  # the card that said llama contradicts the manifest


class ProviderStoreDiscovery(DirectoryDiscovery):
    """`DirectoryDiscovery` whose providers live in py-libp2p's own provider store (first 20 per key kept)."""

    def __init__(self, cards: dict, manifests: dict) -> None:
        from libp2p.kad_dht.provider_store import ProviderStore

        super().__init__({}, cards, manifests)
        host = type("Host", (), {"get_id": lambda _self: "holder"})()
        self.store = ProviderStore(host)

    def provide(self, key: str, who: Identity) -> None:
        from libp2p.peer.id import ID
        from libp2p.peer.peerinfo import PeerInfo

        self.store.add_provider(records.provider_key(key), PeerInfo(ID.from_base58(who.peer_id), []))

    async def find_providers(self, key: str, *, limit: int):
        self.asked.append(key)
        return self.store.get_providers(records.provider_key(key))[:limit]


@pytest.mark.parametrize("sybils", [17, 40])
async def test_strangers_neither_hide_nor_rerank_honest_runs(sybils):
    """Issue #34: Sybils provide every directory key before the keepers' lead, sign cards that give an
    attacker's run a billion members and every honest run none, and fill the provider slots they can."""
    creators = [identity(30 + i) for i in range(8)]
    manifests = [make_run(who, name=f"honest{i}")[0] for i, who in enumerate(creators)]
    ids = [run_id(manifest) for manifest in manifests]
    mob = [identity(100 + i) for i in range(sybils)]
    attacker_manifest = make_run(mob[0], name="free money")[0]
    attacker = run_id(attacker_manifest)
    cards: dict = {}
    discovery = ProviderStoreDiscovery(cards, {**dict(zip(ids, manifests)), attacker: attacker_manifest})
    epoch = NOW // records.DIRECTORY_EPOCH

    def honest_card(index: int, members: int) -> dict:
        body = decode(manifests[index]).body
        return card(ids[index], name=body["name"], created=body["created"], members=members, rounds=10 + index)

    # Keepers provide an epoch's key from the first moment `keeper_epochs` names it; the Sybils an
    # epoch ahead of it (before the old lead), and then the holder keeps whoever came first.
    keeper_time = next(t for t in range(NOW - 47 * 3600, NOW + 1, 60) if epoch in records.keeper_epochs(t))
    announcements: list = []
    # The honest runs: each has its creator and two members; all of them provide the run key,
    # the creator keeps the card and provides its shard's key from DIRECTORY_LEAD ahead.
    for index, who in enumerate(creators):
        members = [who, identity(60 + 2 * index), identity(61 + 2 * index)]
        for member in members:
            discovery.provide(records.run_key(ids[index]), member)
        announcements.append((keeper_time, records.directory_key(epoch, records.directory_shard(ids[index])), who))
        cards[who.peer_id] = cards_record(who, [honest_card(index, 3)])
        helper = members[1]  # a second keeper, not named in the manifest, verified as a participant
        cards[helper.peer_id] = cards_record(helper, [honest_card(index, 3)])
        announcements.append((keeper_time, records.directory_key(epoch, records.directory_shard(ids[index])), helper))
    # The Sybils: their own run (they all provide its key), every directory key, huge cards.
    lies = [card(attacker, name="free money", created=NOW - 100, members=10**9, rounds=10**9)]
    lies += [{**honest_card(index, 0), "rounds": 0} for index in range(8)]
    for who in mob:
        discovery.provide(records.run_key(attacker), who)
        for shard in range(records.DIRECTORY_SHARDS):
            announcements.append((NOW - records.DIRECTORY_EPOCH, records.directory_key(epoch, shard), who))
        cards[who.peer_id] = cards_record(who, lies)
    for _when, key, who in sorted(announcements, key=lambda item: item[0]):  # first come, first kept
        discovery.provide(key, who)

    result = await directory.browse(discovery)
    listed = {listing.run_id: listing for listing in result.listings}
    assert set(ids) <= set(listed)  # every honest run is listed
    for index, run in enumerate(ids):
        assert (listed[run].members, listed[run].rounds) == (3, 10 + index)  # with its own keepers' numbers
    assert listed[attacker].members <= len(mob)  # no more than its identities
    assert listed[attacker].members <= 20  # and no more than a holder keeps providers of its key


async def test_run_browse_refuses_bad_parameters(tmp_path):
    from locomesh.node.rpc.dispatch import RpcError
    from locomesh.node.runs.registry import RunRegistryService

    service = RunRegistryService(tmp_path)
    service.discovery = DirectoryDiscovery({}, {}, {})
    for params in ({"limit": 0}, {"limit": 1000}, {"limit": True}, {"task": ""}, {"task": 5}):
        with pytest.raises(RpcError):
            await service._rpc_browse(**params)
    assert (await service._rpc_browse(task="synthetic-lm"))["runs"] == []


def one_run_directory() -> tuple[DirectoryDiscovery, bytes]:
    """A directory that lists one public run, whose creator keeps its card; and its manifest."""
    creator = identity(40)
    manifest = make_run(creator, name="listed")[0]
    run = run_id(manifest)
    cards = {creator.peer_id: cards_record(creator, [card(run, name="listed", created=decode(manifest).body["created"])])}
    key = records.directory_key(NOW // records.DIRECTORY_EPOCH, records.directory_shard(run))
    return DirectoryDiscovery({key: [creator.peer_id], records.run_key(run): [creator.peer_id]}, cards,
                              {run: manifest}), manifest


async def test_the_short_id_browse_prints_is_taken_by_join_and_info_on_a_node_that_knew_no_run(tmp_path):
    """Issue #37: `run browse` prints 16-character IDs, and a node that knew no run refused them. A
    node takes them whether it browsed (it remembers what the directory listed) or not (it looks
    the prefix up in the directory, as browse does)."""
    from locomesh.cli.run_browse import format_listings
    from locomesh.node.rounds.service import RoundService
    from locomesh.node.rpc.dispatch import RpcError
    from locomesh.node.runs.registry import RUN_NOT_FOUND, RunRegistryService
    from locomesh.protocol.runs import format_run_id

    discovery, manifest = one_run_directory()
    full = format_run_id(run_id(manifest))
    browser, fresh, asker = (RunRegistryService(tmp_path / name) for name in ("browser", "fresh", "asker"))
    for registry in (browser, fresh, asker):
        registry.discovery = discovery
    listed = await browser._rpc_browse()
    short = listed["runs"][0]["short_id"]
    assert len(short) == 16 and short in format_listings(listed)

    joined: list[bytes] = []

    async def join(manifest: bytes) -> int:  # what the participation would do, here: nothing
        joined.append(manifest)
        return 1

    for registry in (browser, fresh):
        rounds = RoundService(registry, None, None)
        rounds.join = join
        assert await rounds._rpc_join(short) == {"run_id": full, "joins_at": 1, "sitting_out": None, "outside_schedule": None}
    assert joined == [manifest, manifest]
    # Known twice over now (stored by the join, listed by the browse): still one run, not "ambiguous".
    assert await browser.resolve(short) == run_id(manifest)
    assert (await asker._rpc_info(short))["run_id"] == full
    with pytest.raises(RpcError) as refused:
        await RoundService(asker, None, None)._rpc_join("abcdefghabcdefgh")
    assert refused.value.code == RUN_NOT_FOUND and refused.value.message.startswith(
        "no such run: no run this node knows or the directory of public runs lists starts with 'abcdefghabcdefgh'")
    with pytest.raises(RpcError) as refused:  # shorter than browse prints: cheap to grind a clash for
        await RoundService(fresh, None, None)._rpc_join("abcdefgh")
    assert refused.value.message.startswith("no such run: no run this node knows starts with 'abcdefgh'")


# --- two daemons ------------------------------------------------------------------------------------


def locomesh(daemon, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "locomesh.cli.main", *args, "--data-dir", str(daemon.data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # about a minute: two daemons start, one joins two runs
def test_a_daemon_that_knows_no_run_id_finds_a_public_run_by_browsing(tmp_path):
    from locomesh.cli.swarm_cmd import start_swarm, wait_connected

    with open(tmp_path / "daemons.log", "wb") as log:
        daemons = start_swarm(tmp_path, 2, log=log)
        try:
            wait_connected(daemons)
            keeper, browser = daemons
            created = locomesh(keeper, "run", "create", "--task", "synthetic-lm", "--name", "open-run", "--set",
                               "alphabet=32", "--set", "inner_steps=5", "--public")
            assert created.returncode == 0, created.stderr
            run = created.stdout.strip()
            private = locomesh(keeper, "run", "create", "--task", "synthetic-lm", "--name", "closed-run", "--set",
                               "alphabet=32", "--set", "inner_steps=5")
            assert private.returncode == 0, private.stderr
            for target in (run, private.stdout.strip()):
                joined = locomesh(keeper, "run", "join", target, "--no-follow", "--json")
                assert joined.returncode == 0, joined.stderr
            assert browser.rpc().call("run.list") == []  # it knows no run at all

            deadline, listed = time.monotonic() + 90, []
            while time.monotonic() < deadline and not listed:
                browsed = locomesh(browser, "run", "browse", "--json")
                assert browsed.returncode == 0, browsed.stderr
                listed = json.loads(browsed.stdout)["runs"]
                time.sleep(0 if listed else 2)
            assert [entry["run_id"] for entry in listed] == [run]  # the private run has no card
            entry = listed[0]
            assert entry["name"] == "open-run" and entry["task"] == "synthetic-lm" and entry["inner_steps"] == 5
            assert entry["members"] == 1 and entry["params"] > 0 and entry["memory"] > 0 and entry["upload"] > 0

            assert json.loads(locomesh(browser, "run", "browse", "--task", "llama", "--json").stdout)["runs"] == []
            table = locomesh(browser, "run", "browse")
            assert table.returncode == 0 and entry["short_id"] in table.stdout and f"run join {run}" in table.stdout
            joined = locomesh(browser, "run", "join", entry["short_id"], "--no-follow", "--json")  # issue #37
            assert joined.returncode == 0 and json.loads(joined.stdout)["run_id"] == run, joined.stderr
        finally:
            for daemon in daemons:
                daemon.stop()
