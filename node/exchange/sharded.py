"""Sharded exchange in the daemon: the I/O that one round's `ShardedAggregation` asks for.

Theory of operation
-------------------
A contributor's payload is the codec's bytes cut at shard boundaries, framed as one byte string
(`training.shards.frame_shards`); its commit names the Merkle root over the shards' hashes. Ours
is held in memory for the others (`ShardHoldings`, served by `shard_transfer.ShardService`) and
kept as one file, so that after a restart we contribute the same bytes (`committed_before`).

Before the round's proposal a member checks that each payload it counts is there: it fetches
one shard of it, drawn from its own randomness, and checks it against the root (`fetch`); then it
waits until each shard is held by a member of its committee other than its author (`confirm`,
`availability.py`). A proposer names only payloads whose author serves them and that would
outlive it (`unconfirmed`); following a proposal needs neither. Once the followed proposal
is known, `gather` runs the round's sans-IO `ShardedAggregation`:

- committees: `committees.shard_committees` over the attempt's electorate, drawn from the hash
  certified before the round (no member can move itself once the round's commits are made) and
  sized by the run's `byzantine_fraction` (`committees.plan`); checks: shards drawn here, privately;
- a seat or a check fetches the shard of every author (from its author, else from a committee
  member that fetched it), aggregates it bit-exactly and, on a seat, signs the result's hash (a
  `shard_result` op naming the set it aggregated); everything else is fetched from the members
  that signed one hash and checked against it;
- a signed hash that our exact recomputation contradicts is disputed (a `dispute` op): disputes
  from more than a third of the electorate ban its signer; two hashes for one shard of one set
  are an equivocation (a ban, by the run's evidence rules);
- an author whose shard nobody serves makes the proposal impossible to aggregate
  (`ProposalWithheld`): the round machine gives that proposal up as it does in allgather.

`apply` lays the shard results end to end and takes the outer step (`Participant.apply_shards`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import numpy as np
import trio

from locomesh.crdt import Replica
from locomesh.node.files import atomic_write
from locomesh.node.replication.service import CrdtService
from locomesh.node.runtime import Node
from locomesh.protocol import peer_id_from_public_key

from . import sharded_machine as sm
from .availability import Availability
from .committees import shard_committees
from .mode import ExchangeChoice
from .shard_transfer import ShardFetchError, ShardHoldings, fetch_input, fetch_result

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.5
FETCH_TIMEOUT = 60.0
RETRY_SECONDS = 0.5
STALL_SECONDS = 5.0  # past the cutoff, an author none of whose shards came this long is given up
MIN_RESULT_WAIT = 10.0
# One shard or result answered within this, plus a second per SLOW_RATE bytes: a peer that is gone
# (a crash leaves no connection to time out) costs seconds, not a whole fetch timeout.
SHARD_TIMEOUT = 5.0
SLOW_RATE = 256 * 1024  # a committee silent this long past the start of aggregation is done without
PAYLOAD_FOLDER = "sharded-payloads"
FANOUT = 4  # sources asked at once for a shard its author does not serve

Compute = Callable[..., Awaitable[Any]]


def _timeout(size: int) -> float:
    return SHARD_TIMEOUT + size / SLOW_RATE


class ProposalWithheld(Exception):
    """No one serves `author`'s shard `shard`: the followed proposal cannot be aggregated."""

    def __init__(self, author: bytes, shard: int) -> None:
        super().__init__(f"shard {shard} of {peer_id_from_public_key(author)} is served by no one")
        self.author, self.shard = author, shard


def set_id(authors: tuple[bytes, ...] | list[bytes]) -> bytes:
    """The 32 bytes that name a contributor set in `shard_result` and `dispute` ops."""
    return hashlib.sha256(b"locomesh set" + b"".join(sorted(authors))).digest()


class Gathered:
    """What `gather` hands `apply`: every shard's result, and the authors some shard refused."""

    def __init__(self, results: list[np.ndarray], accepted: list[bytes], rejected: dict[bytes, Any]) -> None:
        self.results, self.accepted, self.rejected = results, accepted, rejected


class ShardedExchange:
    """Our sharded payloads held and served, the others' shards fetched, the committees' work done."""

    def __init__(self, node: Node, crdt: CrdtService, replica: Replica, participant: Any, directory: Path,
                 holdings: ShardHoldings, scores: Any, *, compute: Compute, compute_lock: trio.Lock,
                 offload: Compute, machine: Any, seed: Callable[[int], bytes]) -> None:
        """`seed(round)`: what the round's committees are drawn from (the hash certified before it)."""
        self.node, self.crdt, self.replica, self.run_id = node, crdt, replica, replica.run_id
        self.participant, self.holdings, self.scores = participant, holdings, scores
        self.compute, self.compute_lock, self.offload = compute, compute_lock, offload
        self.machine, self.timing = machine, machine.timing
        self.seed = seed
        self.directory = directory
        self.me = node.identity.public_key
        self.choice: ExchangeChoice | None = None  # the current round's (set by the participation)
        self.bytes_fetched: dict[int, int] = {}  # round -> shard and result bytes downloaded for it
        self._availability: dict[int, Availability] = {}  # round -> which payloads would outlive their author

    # --- our payload ----------------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        return self.directory / PAYLOAD_FOLDER

    def _path(self, round_number: int) -> Path:
        return self.folder / f"{self.run_id.hex()}-{round_number}.payload"

    def _private_draw(self, *what: bytes) -> random.Random:
        """A generator no other peer can predict (seeded by our signature over `what`: Ed25519
        signs deterministically, so a simulation repeats, and only our key can make it)."""
        signature = self.node.identity.sign(b"locomesh private draw" + b"".join(what))
        return random.Random(hashlib.sha256(signature).digest())

    async def store(self, round_number: int, payload: bytes) -> tuple[bytes, int]:
        """Hold our framed payload for the others and keep it as one file; (its root, its size)."""
        sharded = self.participant.sharded_payload(payload)
        self.holdings.hold_payload(self.run_id, round_number, self.me, sharded)
        self.folder.mkdir(parents=True, exist_ok=True)
        await self.offload(atomic_write, self._path(round_number), payload)
        return sharded.root, len(payload)

    async def committed_before(self, round_number: int) -> Any:
        """The payload we committed to for this round before a restart, from its file (None if we
        made no commitment, or its file is gone or is not what we committed to)."""
        said = self.replica.facts.commits_in(round_number).get(self.me)
        if not said:
            return None
        ((root, size),) = said
        try:
            payload = await self.offload(self._path(round_number).read_bytes)
            sharded = self.participant.sharded_payload(payload)
        except (OSError, ValueError) as error:
            logger.warning("round %d: our payload committed before a restart is not usable: %s", round_number, error)
            return None
        if sharded.root != root or len(payload) != size:
            logger.warning("round %d: our stored payload is not the one we committed to", round_number)
            return None
        logger.info("round %d: contributing the payload we committed to before a restart", round_number)
        self.holdings.hold_payload(self.run_id, round_number, self.me, sharded)
        return SimpleNamespace(payload=payload, train_loss=None, seconds=0.0)

    def release_before(self, round_number: int | None = None) -> None:
        """Drop what we hold of rounds before `round_number` (all if None), and our older files."""
        self.holdings.release_before(self.run_id, round_number)
        for old in [r for r in self.bytes_fetched if round_number is None or r < round_number]:
            del self.bytes_fetched[old]
        for old in [r for r in self._availability if round_number is None or r < round_number]:
            del self._availability[old]
        if not self.folder.is_dir():
            return
        prefix = f"{self.run_id.hex()}-"
        for path in self.folder.glob(prefix + "*.payload"):
            number = path.name[len(prefix):-len(".payload")]
            if number.isdigit() and (round_number is None or int(number) < round_number - 1):
                path.unlink(missing_ok=True)

    # --- before the proposal: is the payload there? ---------------------------------------------

    def committees(self, round_number: int, electorate: frozenset[bytes]) -> list[list[bytes]]:
        """Who aggregates each shard of round `round_number` (`committees.shard_committees`)."""
        assert self.choice is not None and self.choice.plan is not None, "a sharded round has a plan"
        count = self.participant.shard_layout().count
        return shard_committees(round_number, self.seed(round_number), electorate, count, self.choice.plan.committee)

    async def fetch(self, round_number: int, author: bytes, root: bytes, size: int) -> bool:
        """Is `author`'s payload served? Fetches, each checked against `root`, the shards of it our
        committee seats will aggregate (so they are in hand, and held here to be served on, should
        its author go before the others fetched them) and one more shard drawn here, which no one
        else can predict (an author that served its committees only would be caught). Asks its
        author first, then the other members. Tries while FETCH_TIMEOUT (or a quarter of the
        round's deadline) lasts, or until its author is unreachable and nobody else had a shard."""
        if not 1 <= size <= self.participant.max_sharded_payload_size():
            logger.warning("round %d: the commit of %s names %d bytes: no payload of this run", round_number,
                           peer_id_from_public_key(author), size)
            return False
        committees = self.committees(round_number, self.replica.electorate(round_number))
        draw = self._private_draw(b"sample", round_number.to_bytes(8, "big"), author, root)
        wanted = {draw.randrange(len(committees))} | {j for j, members in enumerate(committees) if self.me in members}
        others = sorted(set(self.replica.state.members) - {self.me, author})
        draw.shuffle(others)
        with trio.move_on_after(min(FETCH_TIMEOUT, self.timing.round_deadline / 4)):
            while True:
                async with trio.open_nursery() as nursery:
                    for index in sorted(wanted):
                        sources = [author, *(m for m in committees[index] if m != author), *others]
                        nursery.start_soon(self._input, round_number, author, root, index, sources)
                wanted = {j for j in wanted if self.holdings.input(self.run_id, round_number, author, j) is None}
                if not wanted:
                    return True
                if peer_id_from_public_key(author) not in self.node.peers or self._stalled(round_number):
                    return False
                await trio.sleep(RETRY_SECONDS)
        return False

    async def confirm(self, round_number: int, author: bytes) -> bool:
        """Once `fetch` found `author`'s payload there: is each of its shards held by a member other
        than its author (`Availability.confirm`)? Waits for it until the round stalls."""
        committees = self.committees(round_number, self.replica.electorate(round_number))
        with trio.move_on_after(min(FETCH_TIMEOUT, self.timing.round_deadline / 4)):
            return await self._available(round_number, committees).confirm(author)
        return False

    def unconfirmed(self, round_number: int, authors: Any) -> frozenset[bytes]:
        """Which of `authors` (but us) no `confirm` of the round showed would outlive its author:
        what our own proposal leaves out."""
        known = self._availability.get(round_number)
        confirmed = set() if known is None else known.confirmed
        return frozenset(author for author in authors if author != self.me and author not in confirmed)

    def _available(self, round_number: int, committees: list[list[bytes]]) -> Availability:
        """The round's `Availability`, asking `committees` (those of a new attempt, if it drew others:
        what was seen held stays so)."""
        known = self._availability.get(round_number)
        if known is None:
            known = self._availability[round_number] = Availability(
                self, round_number, committees, lambda: self._stalled(round_number))
        known.committees = committees
        return known

    def _stalled(self, round_number: int) -> bool:
        """Past the round's cutoff by STALL_SECONDS (or a window, if longer), or the round left:
        an author that serves nothing by then withholds, and waiting longer costs every round."""
        machine, current = self.machine, self.machine.current
        if current is None or current.number != round_number:
            return True
        if current.first_seen is None:
            return False
        return trio.current_time() >= machine.cutoff() + max(STALL_SECONDS, machine.window())

    async def _input(self, round_number: int, author: bytes, root: bytes, index: int,
                     sources: list[bytes]) -> bytes | None:
        """Shard `index` of `author`'s payload, checked against `root`: from the first of `sources`
        (its author), else from whichever of the others answers with it first, asked FANOUT at a
        time in their order (most answer "missing" at once; at most FANOUT shards are in flight);
        held to be served on. None if none has it."""
        held = self.holdings.input(self.run_id, round_number, author, index)
        if held is not None:
            return held[0]
        sources = [source for source in sources if source != self.me]
        sources.sort(key=lambda source: peer_id_from_public_key(source) not in self.node.peers)  # stable: connected first
        first, *rest = sources or [None]
        got: list[tuple[bytes, list[bytes]]] = []
        if first is not None:
            await self._ask(round_number, author, root, index, first, got)
        for start in range(0, len(rest), FANOUT):  # a few at a time: each may send a shard's bound of bytes
            if got:
                break
            async with trio.open_nursery() as nursery:
                for source in rest[start:start + FANOUT]:
                    nursery.start_soon(self._ask, round_number, author, root, index, source, got, nursery.cancel_scope)
        if not got:
            return None
        shard, proof = got[0]
        self.holdings.hold_shard(self.run_id, round_number, author, index, shard, proof)
        return shard

    async def _ask(self, round_number: int, author: bytes, root: bytes, index: int, source: bytes,
                   got: list[tuple[bytes, list[bytes]]], done: trio.CancelScope | None = None) -> None:
        """Ask `source` for shard `index` of `author`'s payload; on success add it to `got` and
        cancel `done` (the other askers)."""
        layout = self.participant.shard_layout()
        try:
            limit = self.participant.shard_limit(index)
            answer = await fetch_input(self.node, peer_id_from_public_key(source), self.run_id, round_number, author,
                                       index, root=root, count=layout.count, limit=limit, timeout=_timeout(limit))
        except ShardFetchError as error:
            logger.debug("round %d: shard %d of %s from %s: %s", round_number, index, peer_id_from_public_key(author),
                         peer_id_from_public_key(source), error)
            return
        self.bytes_fetched[round_number] = self.bytes_fetched.get(round_number, 0) + len(answer[0])
        if not got:
            got.append(answer)
        if done is not None:
            done.cancel()

    # --- after it: the committees' work -----------------------------------------------------------

    async def gather(self, round_number: int, authors: tuple[bytes, ...], *, electorate: frozenset[bytes]) -> Gathered:
        """Every shard's result for the set `authors`, computed here or fetched and checked
        (see the module docstring). Raises `ProposalWithheld`."""
        committees = self.committees(round_number, electorate)
        count, plan = len(committees), self.choice.plan
        draw = self._private_draw(b"checks", round_number.to_bytes(8, "big"), set_id(authors))
        checks = draw.sample(range(count), min(plan.verified, count))
        round_ = _ShardedRound(self, round_number, tuple(sorted(authors)), committees, electorate)
        wait = max(MIN_RESULT_WAIT, self.timing.min_collect * 4)
        machine = sm.ShardedAggregation(self.me, authors, committees, checks, now=trio.current_time(), result_wait=wait)
        return await round_.run(machine)

    async def apply(self, gathered: Gathered) -> Any:
        """The outer step from the gathered shard results (call it holding the compute lock)."""
        return await self.compute(self.participant.apply_shards, gathered.results, gathered.accepted, gathered.rejected)


class _ShardedRound:
    """One run of `ShardedAggregation`: carries out its actions and feeds it their completions,
    the committee's signed hashes (from the replica) and a tick."""

    def __init__(self, exchange: ShardedExchange, round_number: int, authors: tuple[bytes, ...],
                 committees: list[list[bytes]], electorate: frozenset[bytes]) -> None:
        self.x, self.round, self.authors, self.committees = exchange, round_number, authors, committees
        self.electorate = electorate
        self.set_id = set_id(authors)
        self.commits = exchange.replica.commits(round_number)
        self.inputs: dict[int, dict[bytes, bytes]] = {}
        self.results: dict[int, np.ndarray] = {}
        self.rejected: dict[bytes, Any] = {}
        self.signed_seen: set[tuple[int, bytes, bytes]] = set()
        self.disputed: set[int] = set()  # shards a member of the electorate disputed
        self._events_in, self._events = trio.open_memory_channel[sm.Event](math.inf)
        self._wake: trio.CancelScope | None = None
        self.withheld: ProposalWithheld | None = None
        self.error: ValueError | None = None  # a shard with nothing valid to aggregate (`_compute`)
        self.computed: set[int] = set()  # shards aggregated here: a late result fetch must not replace them

    async def run(self, machine: sm.ShardedAggregation) -> Gathered:
        replica = self.x.replica
        replica.listeners.append(self._news)
        try:
            async with trio.open_nursery() as nursery:
                actions = machine.start()
                while not self._carry_out(nursery, actions) and self.error is None:
                    actions = []
                    for event in [*self._signed_results(), *self._disputes(), await self._next_event()]:
                        actions += machine.handle(event)
                nursery.cancel_scope.cancel()
        finally:
            replica.listeners.remove(self._news)
        if self.withheld is not None or self.error is not None:  # raised here, not in the nursery: bare
            raise self.withheld or self.error
        results = [self.results[index] for index in range(len(self.committees))]
        # Who the shards computed here refused (the others' we do not know): for the record only,
        # the step's arithmetic is in the results.
        accepted = [author for author in self.authors if author not in self.rejected] or list(self.authors)
        return Gathered(results, accepted, self.rejected)

    def _news(self) -> None:
        if self._wake is not None:
            self._wake.deadline = -math.inf

    async def _next_event(self) -> sm.Event:
        with trio.move_on_after(TICK_SECONDS) as waiting:
            self._wake = waiting
            return await self._events.receive()
        return sm.Tick(trio.current_time())

    def _signed_results(self) -> list[sm.Event]:
        """The committee members' signed hashes for this set that the machine has not seen yet."""
        now, events = trio.current_time(), []
        for shard, signers in self.x.replica.shard_results(self.round, self.set_id).items():
            if not 0 <= shard < len(self.committees):
                continue
            for member, hashes in signers.items():
                for result_hash in sorted(hashes):
                    if (shard, member, result_hash) not in self.signed_seen:
                        self.signed_seen.add((shard, member, result_hash))
                        events.append(sm.ResultSigned(shard, member, result_hash, now))
        return events

    def _disputes(self) -> list[sm.Event]:
        """A `Disputed` for each shard that a member of the electorate (other than us) newly disputes:
        a dispute of a hash the shard's committee member signed for this set (any other proves
        nothing, and would only make us recompute)."""
        now, events = trio.current_time(), []
        for (member, shard, result_hash), disputers in self.x.replica.disputes(self.round, self.set_id).items():
            if shard in self.disputed or not 0 <= shard < len(self.committees):
                continue
            if member not in self.committees[shard] or (shard, member, result_hash) not in self.signed_seen:
                continue
            if any(author != self.x.me and author in self.electorate for author in disputers):
                self.disputed.add(shard)
                events.append(sm.Disputed(shard, now))
        return events

    def _carry_out(self, nursery: trio.Nursery, actions: list[sm.Action]) -> bool:
        """Start the work `actions` ask for; True once every shard is settled, or the set cannot
        be aggregated (`withheld`)."""
        for action in actions:
            logger.debug("round %d: %s", self.round, action)
            match action:
                case sm.FetchInput(shard=shard, author=author):
                    nursery.start_soon(self._fetch_input, shard, author)
                case sm.ComputeShard(shard=shard):
                    nursery.start_soon(self._compute, shard)
                case sm.PublishResult(shard=shard, result_hash=result_hash):
                    self.x.crdt.write(self.x.run_id, "shard_result", round=self.round, set=self.set_id, shard=shard,
                                      hash=result_hash)
                case sm.FetchResult(shard=shard, result_hash=result_hash, sources=sources):
                    nursery.start_soon(self._fetch_result, shard, result_hash, sources)
                case sm.Accuse(shard=shard, member=member, signed_hash=signed, kind=kind):
                    self._accuse(shard, member, signed, kind)
                case sm.GiveUp(shard=shard, author=author):
                    self.withheld = ProposalWithheld(author, shard)
                    return True
                case sm.Assemble():
                    return True
        return False

    def _accuse(self, shard: int, member: bytes, signed: bytes, kind: str) -> None:
        logger.warning("round %d: %s signed a result for shard %d that %s", self.round, peer_id_from_public_key(member),
                       shard, "our exact recomputation contradicts" if kind == "wrong-result" else "contradicts its own")
        if kind == "wrong-result":  # an equivocation is the run's evidence already: both ops are signed
            self.x.crdt.write(self.x.run_id, "dispute", round=self.round, set=self.set_id, shard=shard, member=member,
                              hash=signed)

    async def _fetch_input(self, shard: int, author: bytes) -> None:
        commit = self.commits.get(author)  # None: its author was banned since
        if commit is None:
            self._events_in.send_nowait(sm.InputFetched(shard, author, False, trio.current_time()))
            return
        root, _size = commit
        committee = [m for m in self.committees[shard] if m != author]  # they fetched it for their seats
        anyone = [m for m in sorted(self.electorate) if m != author and m not in committee]  # or to recompute it
        sources = [author, *committee, *anyone]
        data = await self.x._input(self.round, author, root, shard, sources)
        if data is not None:
            self.inputs.setdefault(shard, {})[author] = data
        self._events_in.send_nowait(sm.InputFetched(shard, author, data is not None, trio.current_time()))

    async def _compute(self, shard: int) -> None:
        x = self.x
        shards = dict(self.inputs.get(shard, {}))
        if self.x.me in self.authors:
            held = x.holdings.input(x.run_id, self.round, x.me, shard)
            if held is not None:
                shards[x.me] = held[0]
        try:
            async with x.compute_lock:  # θ and the previous aggregate must not move under it (a sync)
                values, _accepted, rejected = await x.compute(x.participant.aggregate_shard, shard, shards)
                result_hash = x.participant.result_hash(shard, values)
        except ValueError as error:  # EmptyRoundError, AggregatorError: the set has no aggregate
            self.error = error
            self._events_in.send_nowait(sm.Tick(trio.current_time()))  # wake the loop, which ends on it
            return
        self.computed.add(shard)
        for author, error in rejected.items():
            self.rejected.setdefault(author, error)
        self.results[shard] = values
        x.holdings.hold_result(x.run_id, self.round, shard, x.participant.result_to_bytes(values))
        self._events_in.send_nowait(sm.ShardComputed(shard, result_hash, trio.current_time()))

    async def _fetch_result(self, shard: int, result_hash: bytes, sources: tuple[bytes, ...]) -> None:
        x, ok = self.x, False
        size = x.participant.result_size(shard)
        order = random.Random(self.set_id + self.x.me + shard.to_bytes(4, "big"))  # spread the load over the committee
        for source in order.sample(sources, len(sources)):
            if source == x.me:
                continue
            try:
                data = await fetch_result(x.node, peer_id_from_public_key(source), x.run_id, self.round, shard, size=size,
                                          timeout=_timeout(size))
                values = x.participant.result_from_bytes(shard, data)
            except (ShardFetchError, ValueError) as error:
                logger.debug("round %d: result of shard %d from %s: %s", self.round, shard,
                             peer_id_from_public_key(source), error)
                continue
            x.bytes_fetched[self.round] = x.bytes_fetched.get(self.round, 0) + len(data)
            if x.participant.result_hash(shard, values) == result_hash:
                ok = True
                if shard in self.computed:  # overtaken by our own recomputation (a dispute): keep ours
                    break
                self.results[shard] = values
                x.holdings.hold_result(x.run_id, self.round, shard, data)
                break
        self._events_in.send_nowait(sm.ResultFetched(shard, ok, trio.current_time()))
