"""One peer's work in the rounds of one run, as a sans-IO state machine: train, commit, fetch, adopt.

Theory of operation
-------------------
Which payloads a round aggregates, and which state it certifies, the run's agreement decides
(node/agreement/: Tendermint over the run's CRDT; crdt/chain.py certifies). This machine does the
rest of a round for one peer holding the state of the newest certified round c:

1. It trains round c + 1 when it may contribute to it (crdt/value.py: a member with a say, a
   fresh key its slate draws, an admitted key joining now), is not sitting out, and the run has
   its `min_peers`: H inner steps, then a payload.
2. It commits to the payload (a `commit` op naming its content ID) and offers it.
3. It fetches the payload of every other commit of the round as soon as it sees the commit (during
   its own training too), when it votes in the round or trains in it: a member checks that it
   holds what a proposal names before it prevotes (the agreement asks), and a proposer proposes
   what it holds by its *cutoff*: the round's first commit seen plus a window (`cutoff`) that
   follows how spread out the commits of recent rounds were.
4. When the round is certified with value v and state hash h: if the state this peer computed
   for v (the agreement asked for it before precommitting) hashes to h, it adopts it; if it holds
   every payload v names, it computes v now (a *replay*: seconds of CPU instead of a state over
   the network) and adopts it if it hashes to h; otherwise, or if it does not, it *syncs*: it
   downloads the certified state. A peer the run has moved past by more than a round syncs to
   the newest certified state at once.
5. A peer on no roster (it left, or was gone so long the roster let it go) joins again.

Voting never waits for training: the agreement runs beside this machine, and a round decided
without our payload stops our inner steps (`StopTraining`): the next round starts from the state
the run certified.

Nothing here touches the network, the disk or the clock: the participation (participation.py)
feeds in `Observation`s (the run state and the time) and the completions of the work asked for,
and carries out the actions returned (events.py). The simulator and the tests drive exactly this
code.

Rules of this file
------------------
- Event-triggered transitions live in `TRANSITIONS`, keyed by (phase, event type), each with the
  phases it may lead to; the machine checks that it lands in one of them. An Observation first
  follows the certificates (step 4, from any phase). A completion for a round we left, or one in
  `STALE` (work we stopped waiting for), changes nothing; any other event with no entry raises
  `ImpossibleEvent`.
- Every handler returns the actions for the caller, in the order to carry them out.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from locomesh.node.rounds.events import (  # noqa: F401 - re-exported: callers import the vocabulary from here too
    Action, Adopt, Author, Computed, Decided, Discard, Event, Fetch, Fetched, Observation, PayloadId, Phase,
    PublishCommit, PublishJoin, Replay, RoundDone, StartSync, StartTraining, StopTraining, Synced, Trained,
)
from locomesh.node.rounds.orders import first_round_to_join

MIN_COLLECT_SECONDS = 2.0
RETRY_SECONDS = 1.0
SPREAD_HISTORY = 3
DURATION_HISTORY = 8  # rounds whose length (start to certificate, here) the run's pace is read from


class ImpossibleEvent(RuntimeError):
    """An event the machine cannot take in the phase it is in (see `TRANSITIONS`)."""


@dataclass
class Timing:
    """Deadline settings; `round_deadline` comes from the run's hyperparameters."""

    round_deadline: float = 600.0
    min_collect: float = MIN_COLLECT_SECONDS
    min_peers: int = 1  # a round starts only once this many keys may contribute to it


@dataclass
class RoundState:
    """What the machine keeps about the round under way (`RoundMachine.current`)."""

    number: int
    started: float
    training: bool = False  # we train (trained) in it
    committed_at: float | None = None  # when our own commit went out
    arrivals: dict[Author, float] = field(default_factory=dict)  # others' commits: when first seen
    fetched: set[Author] = field(default_factory=set)
    failed: set[Author] = field(default_factory=set)
    computed: dict[bytes, bytes | None] = field(default_factory=dict)  # value ID -> the state hash we computed
    replaying: bytes | None = None  # the certified value we compute now (REPLAY)

    @property
    def first_seen(self) -> float | None:
        times = [*self.arrivals.values(), *([] if self.committed_at is None else [self.committed_at])]
        return min(times, default=None)


class RoundMachine:
    def __init__(self, me: Author, *, state_round: int = 0, state_hash: bytes | None = None,
                 timing: Timing | None = None) -> None:
        self.me = me
        self.timing = timing or Timing()
        self.phase = Phase.IDLE
        self.state_round = state_round  # the round whose state we hold
        self.state_hash = state_hash  # its hash (None for the genesis state)
        self.current: RoundState | None = None
        self.spreads: deque[float] = deque(maxlen=SPREAD_HISTORY)
        self.durations: deque[float] = deque(maxlen=DURATION_HISTORY)  # recent rounds certified with us, seconds
        self.retry_at = 0.0
        self.awaiting_retry = False  # a sync failed; StartSync again at retry_at
        self.last: Observation | None = None
        self.rejoined_at: int | None = None  # the certified round when we joined again
        self.fetching = True  # fetch the round's payloads: we vote in it (the participation sets it)

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; the actions to carry out, in order. `ImpossibleEvent` for a completion
        that cannot happen in the current phase (a bug in whoever feeds the machine)."""
        if isinstance(event, Observation):
            self.last = event
            followed = self._follow_certificates(event)
            if followed is not None:
                self._check(CERTIFICATE_PHASES, "a certificate")
                return followed
        elif self.current is None or event.round != self.current.number or (self.phase, type(event)) in STALE:
            if isinstance(event, Computed) and self.current is not None and event.round == self.current.number:
                self.current.computed[event.value_id] = event.state_hash
            return []  # work for a round we left, or that we stopped waiting for
        transition = TRANSITIONS.get((self.phase, type(event)))
        if transition is None:
            raise ImpossibleEvent(f"{type(event).__name__} for round {event.round} in phase {self.phase.value}")
        actions = transition.handler(self, event)
        self._check(transition.next, type(event).__name__)
        return actions

    def _check(self, allowed: frozenset[Phase], cause: str) -> None:
        if self.phase not in allowed:
            raise ImpossibleEvent(f"{cause} led to phase {self.phase.value}, which the table does not allow")

    # --- certificates (step 4) ------------------------------------------------------------------------

    def _follow_certificates(self, seen: Observation) -> list[Action] | None:
        """Adopt, replay or sync the next certified round; None if the run certified none past ours."""
        if seen.certified <= self.state_round:
            return None
        if self.phase is Phase.SYNC:
            return None if self.current.number == seen.certified else self._sync(seen)
        decided = seen.decided.get(self.state_round + 1)
        work = self.current
        if decided is None or seen.certified > self.state_round + 1 or work is None or work.number != decided.round:
            return self._sync(seen)
        if self.phase is Phase.REPLAY:
            return None  # `_computed` compares
        computed = work.computed.get(decided.value_id, b"")
        if computed == decided.state_hash:
            return self._adopt(decided, seen, replayed=False)
        if decided.value_id in work.computed or not self._holds(decided):
            return self._sync(seen)
        actions: list[Action] = [StopTraining(work.number)] if self.phase is Phase.TRAIN else []
        work.replaying, self.phase = decided.value_id, Phase.REPLAY
        return actions + [Replay(work.number, decided.value_id, decided.authors)]

    def _holds(self, decided: Decided) -> bool:
        work = self.current
        ours = {self.me} if work.committed_at is not None else set()
        return set(decided.authors) <= work.fetched | ours

    def _adopt(self, decided: Decided, seen: Observation, *, replayed: bool) -> list[Action]:
        """Take the state we computed for the certified value. A replay is reported as a split
        (`RoundDone.synced`: the round went on without us), and tells nothing of the run's pace."""
        work = self.current
        actions: list[Action] = []
        if self.phase is Phase.TRAIN:
            actions.append(StopTraining(work.number))
        actions.append(Adopt(decided.round, decided.value_id))
        if not replayed:
            self._note_spread(work, decided)
            self.durations.append(seen.now - work.started)
        actions.append(RoundDone(decided.round, decided.state_hash, len(decided.authors), synced=replayed))
        self._now_at(decided.round, decided.state_hash)
        return actions + self._idle_observe(seen)

    def _sync(self, seen: Observation) -> list[Action]:
        assert seen.certified_hash is not None, "a certified round past 0 has a hash"
        actions: list[Action] = [] if self.current is None else [Discard(self.current.number)]
        self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
        self.awaiting_retry = False
        return actions + [StartSync(seen.certified, seen.certified_hash)]

    def _now_at(self, round_number: int, state_hash: bytes) -> None:
        self.state_round, self.state_hash = round_number, state_hash
        self.phase, self.current, self.awaiting_retry = Phase.IDLE, None, False

    # --- observations, per phase --------------------------------------------------------------------

    def _idle_observe(self, seen: Observation) -> list[Action]:
        """Between rounds: join again if the roster let us go; train the next round if we may;
        fetch its payloads if we vote in it."""
        if seen.certified != self.state_round:
            return []
        actions = self._rejoin(seen)
        next_round = seen.certified + 1
        if self.current is None or self.current.number != next_round:
            self.current = RoundState(next_round, seen.now)
        if seen.may_contribute and not seen.sit_out and seen.eligible >= self.timing.min_peers:
            self.current.training, self.phase = True, Phase.TRAIN
            actions.append(StartTraining(next_round))
        return actions + self._watch_commits(seen)

    def _rejoin(self, seen: Observation) -> list[Action]:
        if not seen.rejoin or seen.sit_out or self.rejoined_at == seen.certified:
            return []
        self.rejoined_at = seen.certified
        return [PublishJoin(first_round_to_join(seen.certified, under_way=bool(seen.commits)))]

    def _watch_commits(self, seen: Observation) -> list[Action]:
        """Note the time of every new commit of the round; fetch its payload if we vote or train."""
        work = self.current
        if work is None or work.number != seen.certified + 1:
            return []
        actions: list[Action] = []
        for author, (payload_id, size) in sorted(seen.commits.items()):
            if author != self.me and author not in work.arrivals:
                work.arrivals[author] = seen.now
                if self.fetching or work.training:
                    actions.append(Fetch(work.number, author, payload_id, size))
        return actions

    def _sync_observe(self, seen: Observation) -> list[Action]:
        """Try a failed sync again once RETRY_SECONDS have passed."""
        if not self.awaiting_retry or seen.now < self.retry_at:
            return []
        self.awaiting_retry = False
        return [StartSync(seen.certified, seen.certified_hash)]

    # --- completions --------------------------------------------------------------------------------

    def _trained(self, done: Trained) -> list[Action]:
        self.phase = Phase.COMMITTED
        self.current.committed_at = done.now
        return [PublishCommit(done.round, done.payload_id, done.size)]

    def _fetched(self, done: Fetched) -> list[Action]:
        (self.current.fetched if done.ok else self.current.failed).add(done.author)
        return []

    def _computed(self, done: Computed) -> list[Action]:
        """A value's state, computed for the agreement or for a replay."""
        work, seen = self.current, self.last
        work.computed[done.value_id] = done.state_hash
        if self.phase is not Phase.REPLAY or done.value_id != work.replaying:
            return []
        decided = seen.decided.get(work.number)
        work.replaying, self.phase = None, Phase.COMMITTED
        if decided is not None and done.state_hash == decided.state_hash:
            return self._adopt(decided, seen, replayed=True)
        return self._sync(seen)

    def _synced(self, done: Synced) -> list[Action]:
        if done.state_hash is None:
            self.awaiting_retry, self.retry_at = True, done.now + RETRY_SECONDS
            return []
        self._now_at(done.round, done.state_hash)
        actions: list[Action] = [RoundDone(done.round, done.state_hash, 0, synced=True)]
        return actions + (self._idle_observe(self.last) if self.last is not None else [])

    # --- timing -------------------------------------------------------------------------------------

    def window(self) -> float:
        """The cutoff window: the larger of a floor and twice the (upper) median spread of the commits
        recent rounds decided (`_note_spread`): the median, as one round whose commits a partition
        held back would otherwise stretch the next rounds' cutoffs to its length."""
        return max(self.timing.min_collect, 2.0 * statistics.median_high(self.spreads) if self.spreads else 0.0)

    def cutoff(self) -> float:
        """When a proposer of the round under way proposes what it holds: the round's first commit
        seen plus the window, capped by half of what is left of the round's deadline."""
        work = self.current
        first = None if work is None else work.first_seen
        if first is None:
            return math.inf
        remaining = work.started + self.timing.round_deadline - first
        return first + max(0.0, min(self.window(), remaining * 0.5))

    def _note_spread(self, work: RoundState, decided: Decided) -> None:
        """From the round's first commit to the one that made more than two thirds of the decided
        set's commits seen: one slow member does not stretch the next rounds' windows to its pace."""
        times = sorted(work.arrivals[a] for a in decided.authors if a in work.arrivals)
        if self.me in decided.authors and work.committed_at is not None:
            times = sorted([*times, work.committed_at])
        if times and work.first_seen is not None:
            self.spreads.append(times[math.ceil(2 * len(times) / 3) - 1] - work.first_seen)

    def pace(self) -> float | None:
        """The longest of the recent rounds certified with us (None before any)."""
        return max(self.durations, default=None)


Handler = Callable[[RoundMachine, Event], list[Action]]


@dataclass(frozen=True)
class Transition:
    """What handles an event in a phase, and the phases that may follow (the handler picks one)."""

    handler: Handler
    next: frozenset[Phase]


def _to(handler: Handler, *phases: Phase) -> Transition:
    return Transition(handler, frozenset(phases))


def _nothing(_machine: RoundMachine, _event: Event) -> list[Action]:
    return []


_P = Phase
# Event-triggered transitions: (phase, event type) -> its handler and the phases it may lead to.
# An Observation is taken in every phase; first the certificates it may bring are followed
# (`RoundMachine._follow_certificates`, from any phase, to one of CERTIFICATE_PHASES).
TRANSITIONS: dict[tuple[Phase, type], Transition] = {
    (_P.IDLE, Observation): _to(RoundMachine._idle_observe, _P.IDLE, _P.TRAIN),
    (_P.TRAIN, Observation): _to(RoundMachine._watch_commits, _P.TRAIN),
    (_P.COMMITTED, Observation): _to(RoundMachine._watch_commits, _P.COMMITTED),
    (_P.REPLAY, Observation): _to(_nothing, _P.REPLAY),
    (_P.SYNC, Observation): _to(RoundMachine._sync_observe, _P.SYNC),
    (_P.TRAIN, Trained): _to(RoundMachine._trained, _P.COMMITTED),
    **{(phase, Fetched): _to(RoundMachine._fetched, phase) for phase in (_P.IDLE, _P.TRAIN, _P.COMMITTED, _P.REPLAY)},
    **{(phase, Computed): _to(RoundMachine._computed, phase) for phase in (_P.IDLE, _P.TRAIN, _P.COMMITTED)},
    (_P.REPLAY, Computed): _to(RoundMachine._computed, _P.IDLE, _P.TRAIN, _P.SYNC, _P.COMMITTED),
    (_P.SYNC, Synced): _to(RoundMachine._synced, _P.SYNC, _P.IDLE, _P.TRAIN),
}
# Completions of work the machine stopped waiting for (training of a round decided without us or
# being synced; a fetch that ended after the round went to a sync): they come, and change nothing.
STALE: frozenset[tuple[Phase, type]] = frozenset({
    (_P.REPLAY, Trained), (_P.SYNC, Trained), (_P.COMMITTED, Trained), (_P.IDLE, Trained),
    (_P.SYNC, Fetched), (_P.SYNC, Computed),
})
# Following a certificate leads to these phases, from any phase.
CERTIFICATE_PHASES = frozenset({_P.IDLE, _P.TRAIN, _P.REPLAY, _P.SYNC})
