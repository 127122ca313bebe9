"""One peer's part in aggregating one round in sharded exchange, as a sans-IO state machine.

Theory of operation
-------------------
The round machine (`node/rounds/machine.py`) picks the round's contributions: the authors of the
followed proposal. In sharded exchange the vector is cut into S shards (`training/shards.py`),
each with a committee drawn once the proposal is out (`committees.shard_committees`), and every peer
needs every shard's aggregate to take the outer step. For each shard this peer is in one of three
roles:

- a *seat*: it is on the shard's committee. It fetches every author's payload of that shard
  (each checked against its author's Merkle root as it arrives: the service's job), aggregates it
  (bit-exact, so every honest member gets the same bits) and publishes the hash of the result (a
  signed op);
- a *check*: one of the shards it recomputes though it is not on the committee, drawn from its own
  private randomness once the proposal is out (`committees.plan` says how many: together
  with the committee size they bound the chance that a wrong result stands);
- any other shard: it waits for the committee's signed hashes. When every member signed the same
  hash it fetches the values from them and checks them against it. When two members signed
  different hashes (one of them lies), when the committee is still incomplete at the result
  deadline (a member crashed, stalls or withholds), when no member delivers the values, or when a
  member of the electorate disputes a signed result (`Disputed`: it recomputed the shard and found
  it wrong), it recomputes the shard itself, as for a check: no round waits on one peer.

Every shard computed here is compared with every committee member's signed hash as the hashes
arrive, before and after: a member whose hash differs from the exact recomputation is accused
(`Accuse`: the committed payloads and the signed wrong hash are the evidence anyone can check by
recomputing), and so is a member that signed two different hashes for one shard. When every
shard is settled (its values here, computed or fetched and matching the unanimous hash) the
machine asks for the aggregate to be assembled and applied (`Assemble`), once.

An input (one author's payload of a shard) that cannot be fetched is asked for again after a pause
that doubles with each failure; after ABANDON_AFTER failures the proposal cannot be aggregated
by anyone (its author withholds it) and the machine gives it up (`GiveUp`), as the round machine
gives up a proposal whose payload cannot be fetched.

Nothing here touches the network, the disk or the clock: the service feeds in the events
(`InputFetched`, `ShardComputed`, `ResultSigned`, `ResultFetched`, `Tick`) and carries out the
returned actions, in order.

Rules of this file
------------------
- Each shard is in one `ShardPhase`. Transitions live in `TRANSITIONS`, keyed by (phase, event
  type), each with the phases it may lead to; the machine checks that it lands in one of them.
  `STALE` lists completions of work the shard stopped waiting for (they change nothing); any
  other event with no entry raises `ImpossibleEvent`.
- `Tick` and the end of the round are not per shard: `handle` runs them for every shard.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Union

Author = bytes
Hash = bytes

RETRY_SECONDS = 1.0
MAX_RETRY_PAUSE = 8.0
ABANDON_AFTER = 3  # failed fetches of one input before the proposal is given up


class ImpossibleEvent(RuntimeError):
    """An event a shard cannot take in the phase it is in (see `TRANSITIONS`): a bug in whoever feeds the machine."""


class ShardPhase(enum.Enum):
    AWAIT = "await"  # another committee's shard: waiting for its signed hashes
    INPUTS = "inputs"  # fetching every author's payload of the shard (a seat, a check or a recomputation)
    COMPUTE = "compute"  # aggregating it here
    RESULT = "result"  # its committee agreed: fetching the values they signed
    SETTLED = "settled"  # its values are here: computed here, or fetched and matching the unanimous hash


class Role(enum.Enum):
    SEAT = "seat"
    CHECK = "check"
    OTHER = "other"


# --- events --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputFetched:
    shard: int
    author: Author
    ok: bool  # True: fetched and checked against the author's root; False: no one delivered it
    now: float


@dataclass(frozen=True)
class ShardComputed:
    shard: int
    result_hash: Hash
    now: float


@dataclass(frozen=True)
class ResultSigned:
    """A committee member's signed hash for a shard, as the run's op log shows it."""

    shard: int
    member: Author
    result_hash: Hash
    now: float


@dataclass(frozen=True)
class ResultFetched:
    shard: int
    ok: bool  # True: the values arrived and hash to the unanimous hash
    now: float


@dataclass(frozen=True)
class Disputed:
    """A member of the electorate recomputed `shard` and says a signed result of it is wrong: our
    own copy must not rest on the committee's word (a committee that is all Byzantine signs one
    wrong hash, and only a recomputation shows it)."""

    shard: int
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


Event = Union[InputFetched, ShardComputed, ResultSigned, ResultFetched, Disputed, Tick]


# --- actions -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FetchInput:
    shard: int
    author: Author


@dataclass(frozen=True)
class ComputeShard:
    shard: int


@dataclass(frozen=True)
class PublishResult:
    shard: int
    result_hash: Hash


@dataclass(frozen=True)
class FetchResult:
    shard: int
    result_hash: Hash
    sources: tuple[Author, ...]  # the members that signed it


@dataclass(frozen=True)
class Accuse:
    """`member` signed `signed_hash` for `shard`, and `against` contradicts it: the exact
    recomputation's hash (`kind` "wrong-result": anyone can recompute it from the committed
    payloads) or the member's own earlier signed hash ("equivocation": two signed statements)."""

    shard: int
    member: Author
    signed_hash: Hash
    against: Hash
    kind: str


@dataclass(frozen=True)
class Assemble:
    """Every shard is settled: lay the aggregates end to end and take the outer step."""


@dataclass(frozen=True)
class GiveUp:
    """`author`'s payload of `shard` could not be fetched: the proposal cannot be aggregated."""

    shard: int
    author: Author


Action = Union[FetchInput, ComputeShard, PublishResult, FetchResult, Accuse, Assemble, GiveUp]


# --- the machine ---------------------------------------------------------------------------------------

@dataclass
class Shard:
    index: int
    role: Role
    committee: tuple[Author, ...]
    phase: ShardPhase
    missing: set[Author] = field(default_factory=set)  # inputs not yet here
    failures: dict[Author, int] = field(default_factory=dict)
    retry_at: dict[Author, float] = field(default_factory=dict)  # failed inputs, asked for again then
    computed: Hash | None = None
    signed: dict[Author, Hash] = field(default_factory=dict)  # member -> its first signed hash
    accused: set[Author] = field(default_factory=set)
    result_requested: bool = False  # a FetchResult went out (its completion may come after a recomputation)


class ShardedAggregation:
    """One round's sharded aggregation as seen by `me`. See the module docstring."""

    def __init__(self, me: Author, authors: Iterable[Author], committees: Sequence[Sequence[Author]],
                 checks: Iterable[int], *, now: float, result_wait: float) -> None:
        """`authors`: the followed proposal's; `committees[s]`: shard s's members
        (`committees.shard_committees`); `checks`: the shards this peer recomputes by its own draw;
        `result_wait`: seconds from now until an incomplete committee's shard is recomputed."""
        self.me = me
        self.authors = frozenset(authors)
        self.deadline = now + result_wait
        self.done = False  # Assemble or GiveUp was returned
        checks = set(checks)
        self.shards = [
            Shard(index, Role.SEAT if me in committee else Role.CHECK if index in checks else Role.OTHER,
                  tuple(committee), ShardPhase.AWAIT)
            for index, committee in enumerate(committees)
        ]
        self._pending_start = [shard for shard in self.shards if shard.role is not Role.OTHER]

    def start(self) -> list[Action]:
        """The first actions: fetch the inputs of the seats and checks."""
        actions: list[Action] = []
        for shard in self._pending_start:
            actions += self._recompute(shard, ShardPhase.INPUTS)
        self._pending_start = []
        return actions + self._maybe_done()

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; the actions to carry out, in order. Nothing after the machine is done."""
        if self.done:
            return []
        if isinstance(event, Tick):
            actions = [action for shard in self.shards for action in self._step(shard, event)]
        else:
            if not 0 <= event.shard < len(self.shards):
                raise ImpossibleEvent(f"no shard {event.shard} in this round")
            actions = self._step(self.shards[event.shard], event)
        return actions + self._maybe_done()

    def _step(self, shard: Shard, event: Event) -> list[Action]:
        key = (shard.phase, type(event))
        if key in STALE:
            return []
        transition = TRANSITIONS.get(key)
        if transition is None:
            raise ImpossibleEvent(f"shard {shard.index} in {shard.phase.value} cannot take {type(event).__name__}")
        handler, allowed = transition
        before = shard.phase
        actions = handler(self, shard, event)
        if shard.phase not in allowed:
            raise AssertionError(f"{handler.__name__} moved shard {shard.index} from {before} to {shard.phase}")
        return actions

    # -- handlers --------------------------------------------------------------------------------------

    def _input_fetched(self, shard: Shard, event: InputFetched) -> list[Action]:
        if event.author not in shard.missing:
            return []  # a duplicate completion
        if event.ok:
            shard.missing.discard(event.author)
            shard.retry_at.pop(event.author, None)
            if shard.missing:
                return []
            shard.phase = ShardPhase.COMPUTE
            return [ComputeShard(shard.index)]
        failures = shard.failures[event.author] = shard.failures.get(event.author, 0) + 1
        if failures >= ABANDON_AFTER:
            self.done = True
            return [GiveUp(shard.index, event.author)]
        shard.retry_at[event.author] = event.now + min(MAX_RETRY_PAUSE, RETRY_SECONDS * 2 ** (failures - 1))
        return []

    def _retry_inputs(self, shard: Shard, event: Tick) -> list[Action]:
        due = sorted(author for author, at in shard.retry_at.items() if at <= event.now)
        for author in due:
            del shard.retry_at[author]
        return [FetchInput(shard.index, author) for author in due]

    def _computed(self, shard: Shard, event: ShardComputed) -> list[Action]:
        shard.computed = event.result_hash
        shard.phase = ShardPhase.SETTLED
        actions: list[Action] = [PublishResult(shard.index, event.result_hash)] if shard.role is Role.SEAT else []
        for member, signed in sorted(shard.signed.items()):
            if signed != shard.computed:
                actions += self._accuse_once(shard, member, signed, shard.computed, "wrong-result")
        return actions

    def _signed(self, shard: Shard, event: ResultSigned) -> list[Action]:
        """Record a member's signed hash; accuse it if it contradicts our computation or its own
        earlier signature; then see whether the shard can be settled from the committee's word."""
        if event.member not in shard.committee or event.member == self.me:
            return []  # only the committee has a say; our own op comes back to us
        earlier = shard.signed.setdefault(event.member, event.result_hash)
        if earlier != event.result_hash:
            return self._accuse_once(shard, event.member, event.result_hash, earlier, "equivocation")
        if shard.computed is not None and event.result_hash != shard.computed:
            return self._accuse_once(shard, event.member, event.result_hash, shard.computed, "wrong-result")
        return self._settle_from_committee(shard, event.now) if shard.phase is ShardPhase.AWAIT else []

    def _await_tick(self, shard: Shard, event: Tick) -> list[Action]:
        return self._settle_from_committee(shard, event.now)

    def _result_fetched(self, shard: Shard, event: ResultFetched) -> list[Action]:
        if event.ok:
            shard.phase = ShardPhase.SETTLED
            return []
        return self._recompute(shard, ShardPhase.INPUTS)  # no member delivered what it signed

    def _overtaken_result(self, shard: Shard, event: ResultFetched) -> list[Action]:
        """A result fetch that ended after the shard went on to a recomputation: stale. Without a
        fetch ever asked for, it cannot happen."""
        if not shard.result_requested:
            raise ImpossibleEvent(f"shard {shard.index}: a result fetch completed that was never asked for")
        return []

    def _disputed(self, shard: Shard, event: Disputed) -> list[Action]:
        """Recompute a shard whose values would come (or came) from the committee's word."""
        if shard.computed is not None or shard.phase in (ShardPhase.INPUTS, ShardPhase.COMPUTE):
            return []  # computed here, or being computed: the dispute changes nothing for us
        return self._recompute(shard, ShardPhase.INPUTS)

    def _nothing(self, shard: Shard, event: Event) -> list[Action]:
        return []

    # -- helpers ---------------------------------------------------------------------------------------

    def _settle_from_committee(self, shard: Shard, now: float) -> list[Action]:
        hashes = set(shard.signed.values())
        if len(hashes) > 1:  # two members disagree: one of them lies, and only a recomputation says who
            return self._recompute(shard, ShardPhase.INPUTS)
        if len(shard.signed) == len(shard.committee):
            shard.phase = ShardPhase.RESULT
            shard.result_requested = True
            (agreed,) = hashes
            return [FetchResult(shard.index, agreed, tuple(sorted(shard.signed)))]
        if now >= self.deadline:  # a member is silent: do not wait on it
            return self._recompute(shard, ShardPhase.INPUTS)
        return []

    def _recompute(self, shard: Shard, phase: ShardPhase) -> list[Action]:
        shard.phase = phase
        shard.missing = set(self.authors - {self.me})
        if not shard.missing:
            shard.phase = ShardPhase.COMPUTE
            return [ComputeShard(shard.index)]
        return [FetchInput(shard.index, author) for author in sorted(shard.missing)]

    def _accuse_once(self, shard: Shard, member: Author, signed: Hash, against: Hash, kind: str) -> list[Action]:
        if member in shard.accused:
            return []
        shard.accused.add(member)
        actions: list[Action] = [Accuse(shard.index, member, signed, against, kind)]
        if shard.phase in (ShardPhase.AWAIT, ShardPhase.RESULT):  # the committee's word is worth nothing now
            actions += self._recompute(shard, ShardPhase.INPUTS)
        return actions

    def _maybe_done(self) -> list[Action]:
        if self.done or self._pending_start or any(shard.phase is not ShardPhase.SETTLED for shard in self.shards):
            return []
        self.done = True
        return [Assemble()]


_S = ShardPhase
Handler = Callable[[ShardedAggregation, Shard, Event], list[Action]]
Transition = tuple[Handler, frozenset[ShardPhase]]


def _to(handler: Handler, *phases: ShardPhase) -> Transition:
    return handler, frozenset(phases)


TRANSITIONS: dict[tuple[ShardPhase, type], Transition] = {
    (_S.AWAIT, ResultSigned): _to(ShardedAggregation._signed, _S.AWAIT, _S.RESULT, _S.INPUTS, _S.COMPUTE),
    (_S.AWAIT, Tick): _to(ShardedAggregation._await_tick, _S.AWAIT, _S.INPUTS, _S.COMPUTE),
    (_S.INPUTS, InputFetched): _to(ShardedAggregation._input_fetched, _S.INPUTS, _S.COMPUTE),
    (_S.INPUTS, ResultSigned): _to(ShardedAggregation._signed, _S.INPUTS),
    (_S.INPUTS, Tick): _to(ShardedAggregation._retry_inputs, _S.INPUTS),
    (_S.COMPUTE, ShardComputed): _to(ShardedAggregation._computed, _S.SETTLED),
    (_S.COMPUTE, ResultSigned): _to(ShardedAggregation._signed, _S.COMPUTE),
    (_S.COMPUTE, Tick): _to(ShardedAggregation._nothing, _S.COMPUTE),
    (_S.RESULT, ResultFetched): _to(ShardedAggregation._result_fetched, _S.SETTLED, _S.INPUTS, _S.COMPUTE),
    (_S.RESULT, ResultSigned): _to(ShardedAggregation._signed, _S.RESULT, _S.INPUTS, _S.COMPUTE),
    (_S.RESULT, Tick): _to(ShardedAggregation._nothing, _S.RESULT),
    (_S.SETTLED, ResultSigned): _to(ShardedAggregation._signed, _S.SETTLED),
    (_S.SETTLED, Tick): _to(ShardedAggregation._nothing, _S.SETTLED),
    **{(phase, Disputed): _to(ShardedAggregation._disputed, phase, _S.INPUTS, _S.COMPUTE) for phase in _S},
    **{(phase, ResultFetched): _to(ShardedAggregation._overtaken_result, phase)
       for phase in (_S.INPUTS, _S.COMPUTE, _S.SETTLED)},
}
# Completions of work a shard stopped waiting for: an input fetch that completes again after the
# shard has all its inputs (a retry and the original both ended). A result fetch overtaken by a
# recomputation is `_overtaken_result`'s, which can tell it from one never asked for.
STALE: frozenset[tuple[ShardPhase, type]] = frozenset({(_S.COMPUTE, InputFetched), (_S.SETTLED, InputFetched)})
