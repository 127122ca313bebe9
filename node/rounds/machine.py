"""The round protocol of one peer in one run, as a sans-IO state machine.

Theory of operation
-------------------
The run's CRDT (`locomesh.crdt`) certifies rounds: round r is done when more than two thirds of
its electorate signed the same hash of the new shared state. Its *contributors* may commit
payloads; its *electorate* (contributors that earned their say: `crdt/electorate.py`) votes,
proposes and stores the state. A peer holding the state of the newest certified round c takes
part in round c + 1:

1. it trains H inner steps and encodes its pseudo-gradient (the *payload*);
2. it commits to the payload (a signed `commit` op naming the payload's content ID) and offers it
   to the others;
3. it fetches every payload the other contributors commit to, from the moment it sees the
   commit (during its own training too). The round's contributions are the commits seen before
   the *cutoff*: the time the round's first commit was seen, plus a window. Every peer sees the
   first commit within a gossip delay of the others, so honest peers cut at nearly the same
   moment and pick the same set; a commit that lands after the cutoff, our own included, is left
   out by everyone. A vanished or slow peer costs one window, never the round;
4. cut-off times still differ a little, so one peer's set decides: the round's *proposer*, the
   first of the electorate in an order drawn from the round, its attempt and the hash certified
   before it (`orders`: no key is ground to come first), publishes the set it cut (a `propose`
   op); everyone aggregates exactly that set (fetching what it lacks), so honest peers compute
   the same state. A proposer that stays silent hands over to the next one: after
   one window if it did not commit this round (it is probably gone), after PATIENCE windows if it
   did (it is alive, and will propose once it has the payloads: handing over early would split
   the honest peers between two proposals), unless this peer holds no connection to it (it
   crashed after its commit, likely with delayed updates, which commit as a round starts): one
   window then. Connections are not seen alike everywhere, but a crash cuts all of them at once.
   Until it starts aggregating, a peer switches to the proposal of an earlier proposer when one
   appears (so one that moved on too early goes back). A set naming no more than half of the round's
   electorate is refused, our own too while another proposer's turn is to come (a vote for a set
   nobody follows is lost); until we follow a proposal, payloads we counted whose fetch failed (under
   load, bytes can stop for a while) are asked for again, so our set can grow acceptable. A payload
   of the followed set whose fetch failed is asked for again after a
   pause that doubles with each failure (RETRY_SECONDS, up to MAX_REFETCH_PAUSE): the proposer had
   it, but whoever could serve it may be gone or busy. After ABANDON_AFTER failures the proposal is
   given up for the attempt and the next proposer's turn comes (a proposer that withholds a payload
   of its own set cannot hold the round);
5. it aggregates (decode, validate, robust aggregation, outer step: bit-exact on every CPU),
   and votes for the new state's hash;
6. when the round is certified it moves on if its hash is the certified one, and otherwise
   *syncs*: it downloads the certified checkpoint. A peer that finds the run ahead of it (a late
   joiner, a peer that was cut off, one whose round was certified without it) syncs the same way.
   A peer whose round was certified while it still trained or collected, and which holds (or is
   fetching) every payload of a proposal of that round, *replays* it instead: it stops training,
   waits for those fetches and aggregates that set itself (seconds of CPU instead of a whole
   state over the network). The result must hash to the certified hash; if it does not, or a
   fetch fails, it syncs. A peer still aggregating when its round is certified finishes and compares the same way.
   A peer that only synced for a few rounds falls out of the contributors (the CRDT's activity
   rule, `crdt/electorate.py`); it joins again from the next round (`PublishJoin`);
7. votes are per attempt (crdt/electorate.py). When the votes of an attempt leave no hash able
   to reach a quorum (a *split*: members that aggregated different sets, after a join, a restart,
   a proposer that handed over early), the attempt is over as soon as the votes are seen, with no
   clock; a member whose vote died votes again in the next attempt, for the set most of the split
   attempt's votes named (ties: the larger set, then the smaller key), fetching what it lacks;
   members still choosing follow that set too. Once every proposer's turn passed with no set to
   follow, a member proposes its own: its vote then ends the attempt one way or the other;
8. the attempt's deadline is enforced: when the attempt has lasted `deadline()` on our clock (a
   multiple of the longest recent round, within the run's round deadline) without a certificate,
   we say so (a `timeout` op). Once more than a third of the attempt's electorate said so, the
   next attempt's electorate keeps only those that voted or said so (a crashed member leaves it),
   proposers take their turns again in a new order, and the round can be certified without the
   missing. A vote stands through such an attempt (we are locked to it: two hashes can never be
   certified for one round);
9. if the run's history no longer holds the state we hold for REWRITE_GRACE (two sides of a
   partition each went on, and the merged op set keeps one history), we sync to its newest
   certified state and go on from there.

Liveness. After a membership change (a join, a leave, a crash, a restart with the same identity,
a member gone silent), every honest member converges on one set within one attempt of the
change's round, whatever the interleaving: (a) an attempt ends either with a certificate, or
with a split, seen from the votes alone, or with a timeout, and then the next attempt's
electorate holds only members that answered; (b) after a split every honest member reads the
same votes, so all choose the same set (the rule of step 7) and their votes agree, since the
outer step is bit-exact; (c) a member that cannot fetch that set abandons it for the next
(ABANDON_AFTER) and a silent member costs a turn, never the attempt; (d) a crash costs at most
one attempt deadline, and only when the crashed member's vote was needed for a quorum (an
electorate of three or fewer, or a third gone at once). A partition whose sides both hold more
than a third of the electorate lets each side time the other out; when they meet, the op set
decides one history and the other side's members sync to it (step 9), without a ban.

Nothing here touches the network, the disk or the clock. The service (`service.py`) feeds
in `Observation`s (what the CRDT says now, and the time) and the completions of the work the
machine asked for; each call returns the `Action`s to carry out (the vocabulary: `events`).
The simulator and the tests drive exactly this code.

Rules of this file
------------------
- Event-triggered transitions live in `TRANSITIONS`, keyed by (phase, event type), each with the
  phases it may lead to; the machine checks that it lands in one of them. An Observation first
  runs the state-triggered transitions (a certificate at or past our round, from any phase; the
  round's attempt and deadline). A completion for a round we left, or one listed in `STALE`
  (work we stopped waiting for), changes nothing; any other event with no entry raises
  `ImpossibleEvent`.
- Every handler returns the actions for the caller, in the order to carry them out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from locomesh.node.rounds.attempts import (  # noqa: F401 - re-exported
    DEADLINE_FACTOR, DURATION_HISTORY, MIN_DEADLINE, REWRITE_GRACE, WORKING, Attempts,
)
from locomesh.node.rounds.proposing import PATIENCE, Proposing  # noqa: F401 - re-exported
from locomesh.node.rounds.replay import Replaying
from locomesh.node.rounds.state import MIN_COLLECT_SECONDS, RoundState, Timing  # noqa: F401 - re-exported
from locomesh.node.rounds.orders import first_round_to_join, proposer_order, state_stewards  # noqa: F401 - re-exported
from locomesh.node.rounds.events import (  # noqa: F401 - re-exported: callers import the vocabulary from here too
    Action, Aggregated, Author, Discard, Event, Fetch, Fetched, Observation, PayloadId, Phase, PublishCommit,
    PublishJoin, PublishLeave, PublishProposal, PublishTimeout, PublishVote, RoundDone, StartAggregate, StartSync, StartTraining,
    StopTraining, Synced, Trained, Withheld,
)

# --- the machine -----------------------------------------------------------------------------------

RETRY_SECONDS = 1.0
MAX_REFETCH_PAUSE = 8.0
ABANDON_AFTER = 3  # failed fetches of one payload of the followed proposal before we give that proposal up
SPREAD_HISTORY = 3


class ImpossibleEvent(RuntimeError):
    """An event the round protocol cannot take in the phase the machine is in (see `TRANSITIONS`)."""


class RoundMachine(Replaying, Attempts, Proposing):
    """One peer's round protocol in one run. See the module docstring; replaying a round certified
    without us is `replay.Replaying`'s, an attempt's end (split, deadline, a rewritten history) and
    the vote cast again after a split `attempts.Attempts`'; whose set to follow or propose
    `proposing.Proposing`'s."""

    def __init__(self, me: Author, *, state_round: int = 0, state_hash: bytes | None = None, timing: Timing | None = None):
        self.me = me
        self.timing = timing or Timing()
        self.phase = Phase.IDLE
        self.state_round = state_round  # the round whose state we hold
        self.state_hash = state_hash  # its hash (None for the genesis state)
        self.current: RoundState | None = None
        self.voted_hash: bytes | None = None
        self.spreads: deque[float] = deque(maxlen=SPREAD_HISTORY)
        self.durations: deque[float] = deque(maxlen=DURATION_HISTORY)  # recent rounds certified with us, seconds
        self.retry_at = 0.0
        self.awaiting_retry = False  # a sync failed; StartSync again at retry_at
        self.last: Observation | None = None
        self.rejoined_at: int | None = None  # the certified round when our membership lapsed and we joined again
        self.left_at: int | None = None  # the certified round after which we left to sit rounds out
        self.rewritten_since: float | None = None  # when the run's history first stopped holding our state
        # (round, whether our commit was in by our cut) of the newest round we cut with a commit of
        # ours: it outlives the round's state, so a round synced later can still say why it left us out.
        self.last_cut: tuple[int, bool] | None = None

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; the actions to carry out, in order. `ImpossibleEvent` for a completion
        that cannot happen in the current phase (a bug in whoever feeds the machine)."""
        deadline: list[Action] = []
        if isinstance(event, Observation):
            self.last = event
            moved = self._follow_certificates(event)
            if moved is not None:
                self._check(CERTIFICATE_PHASES, "a certificate")
                return moved
            deadline = self._watch_deadline(event)
        elif self.current is None or event.round != self.current.number or (self.phase, type(event)) in STALE:
            return []  # work for a round we left, or that we stopped waiting for
        transition = TRANSITIONS.get((self.phase, type(event)))
        if transition is None:
            raise ImpossibleEvent(f"{type(event).__name__} for round {event.round} in phase {self.phase.value}")
        actions = deadline + transition.handler(self, event)
        self._check(transition.next, type(event).__name__)
        return actions

    def _check(self, allowed: frozenset[Phase], cause: str) -> None:
        if self.phase not in allowed:
            raise ImpossibleEvent(f"{cause} led to phase {self.phase.value}, which the table does not allow")

    # --- observations, per phase ------------------------------------------------------------------

    def _follow_certificates(self, seen: Observation) -> list[Action] | None:
        """If the run certified a round at or past ours, adopt it (our hash) or sync to it; if its
        history no longer holds the state we hold, go back to the one it holds (`_rewritten`)."""
        if seen.certified <= self.state_round:
            return self._rewritten(seen)
        working = self.current.number if self.current else None
        if (
            self.phase is Phase.VOTED
            and seen.certified == working
            and self.voted_hash is not None
            and seen.certified_hash == self.voted_hash
        ):
            done = RoundDone(working, self.voted_hash, len(self.current.fetched) + 1, synced=False)
            self.durations.append(seen.now - self.current.started)
            self._adopt(working, self.voted_hash)
            return [done, *self._idle_observe(seen)]
        if self.phase is Phase.SYNC and self.current is not None and self.current.number == seen.certified:
            return None  # already syncing to it
        if seen.certified == working and self.phase in (Phase.AGGREGATE, Phase.REPLAY):
            return None  # `_aggregated` compares our result with the certified hash
        if seen.certified == working and self.phase in (Phase.TRAIN, Phase.COLLECT, Phase.PROPOSE):
            replay = self._replay_set(seen)
            if replay is not None:
                return self._start_replay(replay)
        actions: list[Action] = [] if working is None else [Discard(working)]
        assert seen.certified_hash is not None, "a certified round past 0 has a hash"
        self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
        self.awaiting_retry = False
        return [*actions, StartSync(seen.certified, seen.certified_hash)]

    def _idle_observe(self, seen: Observation) -> list[Action]:
        next_round = self.state_round + 1
        if seen.certified != self.state_round:
            return []
        if seen.sit_out:
            return self._sit_out(seen)
        if self.me not in seen.able:
            return self._rejoin(seen)  # else not eligible yet: a late joiner waits for the round its join names
        if len(seen.able) < self.timing.min_peers:
            return []  # the run waits for enough peers before its first (or next) round
        self.phase = Phase.TRAIN
        self.current = RoundState(next_round, seen.now, seed=seen.seed, attempt=seen.attempt, attempt_started=seen.now)
        return [StartTraining(next_round)]

    def _rejoin(self, seen: Observation) -> list[Action]:
        """Join again if our membership lapsed (we only synced for a while: the run's rules left us
        out of the electorate) or we left to sit rounds out, once per certified round: our replica
        has the join at once."""
        if (seen.member and not seen.lapsed) or self.rejoined_at == seen.certified:
            return []
        self.rejoined_at, self.left_at = seen.certified, None
        return [PublishJoin(first_round_to_join(seen.certified, under_way=bool(seen.commits)))]

    def _sit_out(self, seen: Observation) -> list[Action]:
        """Between rounds, while we sit out: leave the contributors once (rounds under way do not
        wait a window for our payload, nor a deadline for our vote), and train nothing. The state
        stays current all the same: a certified round past ours is synced (`_follow_certificates`)."""
        if not seen.member or self.left_at == seen.certified:
            return []
        self.left_at = seen.certified
        return [PublishLeave(seen.certified)]

    def _watch_commits(self, seen: Observation) -> list[Action]:
        """Note the time of every new commit of the round and start fetching its payload."""
        work = self.current
        actions: list[Action] = []
        for author, (payload_id, size) in sorted(seen.commits.items()):
            if author != self.me and author not in work.arrivals:
                work.arrivals[author] = seen.now
                actions.append(Fetch(work.number, author, payload_id, size))
        return actions

    def _collect_observe(self, seen: Observation) -> list[Action]:
        return self._watch_commits(seen) + self._maybe_close(seen.now)

    def _sync_observe(self, seen: Observation) -> list[Action]:
        """Try a failed sync again once RETRY_SECONDS have passed."""
        if not self.awaiting_retry or seen.now < self.retry_at:
            return []
        self.awaiting_retry = False
        return [StartSync(seen.certified, seen.certified_hash)]

    # --- completions ------------------------------------------------------------------------------

    def _trained(self, done: Trained) -> list[Action]:
        self.phase = Phase.COLLECT
        self.current.committed_at = done.now
        actions: list[Action] = [PublishCommit(done.round, done.payload_id, done.size)]
        return actions + self._maybe_close(done.now)

    def _fetched(self, done: Fetched) -> list[Action]:
        work = self.current
        (work.fetched if done.ok else work.failed).add(done.author)
        if not done.ok:  # failures before the proposal count too: the payload's author withheld it then
            work.failures[done.author] = work.failures.get(done.author, 0) + 1
        if self.phase is Phase.COLLECT:
            return self._maybe_close(done.now)
        if self.phase is Phase.PROPOSE and work.chosen is None:  # our own set may have grown
            if not done.ok:
                self._pause_refetch(done.author, done.now)
            return self._propose_or_follow(done.now)
        if self.phase is Phase.PROPOSE:
            if done.ok:
                return self._aggregate_if_ready()
            if work.failures[done.author] >= ABANDON_AFTER and done.author in work.chosen:
                return self._abandon(done.now)
            self._pause_refetch(done.author, done.now)
        return []

    def _abandon(self, now: float) -> list[Action]:
        """A payload of the proposal we follow failed ABANDON_AFTER fetches: whoever could serve it
        does not (a proposer that withholds its own payload would hold the round for ever). Give
        that proposal up for this attempt and follow (or make) the next one in proposer order."""
        work = self.current
        work.abandoned.add(work.following)
        work.chosen = work.following = None
        return self._propose_or_follow(now)

    def _withheld(self, done: Withheld) -> list[Action]:
        """Sharded exchange: the set we aggregate names a payload nobody serves whole. Give that
        proposal up (`_abandon`), and leave the payload out of our own set; when replaying a
        round certified without us, sync instead."""
        work, seen = self.current, self.last
        if work.replay:
            self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
            return [Discard(work.number), StartSync(seen.certified, seen.certified_hash)]
        work.fetched.discard(done.author)
        work.failed.add(done.author)
        work.failures[done.author] = max(ABANDON_AFTER, work.failures.get(done.author, 0))
        self.phase = Phase.PROPOSE
        return self._abandon(done.now)

    def _aggregated(self, done: Aggregated) -> list[Action]:
        seen = self.last
        if seen is not None and seen.certified == done.round:
            return self._compare_with_certificate(done, seen)
        self.phase = Phase.VOTED
        self.voted_hash = done.state_hash
        if done.state_hash is None:
            return []
        work = self.current
        work.voted_attempt = work.attempt
        return [PublishVote(done.round, done.state_hash, work.following, work.attempt)]

    def _compare_with_certificate(self, done: Aggregated, seen: Observation) -> list[Action]:
        """The round was certified while we aggregated (or replayed it): adopt our result if it is
        the certified state, else sync to that state. No vote: the certificate needs none."""
        work = self.current
        if done.state_hash is not None and done.state_hash == seen.certified_hash:
            contributors = len(work.chosen or ())
            self.durations.append(seen.now - work.started)
            self._adopt(done.round, done.state_hash)
            return [RoundDone(done.round, done.state_hash, contributors, synced=work.replay), *self._idle_observe(seen)]
        assert seen.certified_hash is not None, "a certified round past 0 has a hash"
        self.phase, self.current = Phase.SYNC, RoundState(seen.certified, seen.now)
        return [StartSync(seen.certified, seen.certified_hash)]

    def _synced(self, done: Synced) -> list[Action]:
        if done.state_hash is None:
            self.awaiting_retry, self.retry_at = True, done.now + RETRY_SECONDS
            return []
        self._adopt(done.round, done.state_hash)
        actions: list[Action] = [RoundDone(done.round, done.state_hash, 0, synced=True)]
        return actions + (self._idle_observe(self.last) if self.last is not None else [])

    # --- helpers ----------------------------------------------------------------------------------

    def _maybe_close(self, now: float) -> list[Action]:
        """Cut once the cutoff passed (or every eligible payload is in) and the payloads of every
        commit seen before the cutoff are fetched or failed; then propose or follow a proposal."""
        work, seen = self.current, self.last
        cutoff = self.cutoff()
        expected = (seen.able if seen is not None else frozenset()) - {self.me}
        counted = {author for author, at in work.arrivals.items() if at <= cutoff}
        if now < cutoff and not expected <= counted:
            return []
        if not counted <= work.fetched | work.failed:
            return []  # the service bounds every fetch; a failure counts as done
        last = max((work.arrivals[a] for a in counted), default=work.first_seen)
        work.counted, work.counted_ours = frozenset(counted), work.committed_at <= cutoff
        self.last_cut = (work.number, work.counted_ours)
        self.spreads.append(self._spread(work))
        work.last_commit = max(last, work.committed_at) if work.counted_ours else last
        work.closed_at, self.phase = now, Phase.PROPOSE
        return self._propose_or_follow(now)

    def _spread(self, work: RoundState) -> float:
        """From the round's first commit to the one that made more than two thirds of the commits
        counted: one slow member (a laptop on battery, a member in a bad spell) does not stretch the
        next rounds' windows to its pace; it misses the cutoff, and the round, instead."""
        times = sorted([work.arrivals[a] for a in work.counted] + ([work.committed_at] if work.counted_ours else []))
        if not times:
            return 0.0
        return times[math.ceil(2 * len(times) / 3) - 1] - work.first_seen

    def _propose_observe(self, seen: Observation) -> list[Action]:
        actions = self._propose_or_follow(seen.now)
        if self.phase is Phase.PROPOSE:  # what failed and has waited its pause: the followed set's, or our own's
            work = self.current
            actions += self._refetch(seen.now, work.chosen if work.chosen is not None else work.counted)
        return actions

    def _follow(self, proposer: Author, proposal: tuple[Author, ...]) -> list[Action]:
        work = self.current
        work.chosen, work.following = proposal, proposer
        return self._refetch(self.last.now, proposal) + self._aggregate_if_ready()

    def _refetch(self, now: float, authors: Iterable[Author]) -> list[Action]:
        """Fetch what `authors` committed and we lack: never seen, or failed before and paused long
        enough since (`_pause_refetch`). For a followed proposal: its proposer had the payload,
        so it can be fetched again; for our own set: a payload we counted that failed under load.
        A payload seen and not failed is in flight."""
        work, seen = self.current, self.last
        actions: list[Action] = []
        for author in sorted(authors):
            in_flight = author in work.arrivals and author not in work.failed
            if author == self.me or author in work.fetched or in_flight:
                continue
            if work.refetch_at.get(author, now) > now:
                continue
            if author in seen.commits:
                work.failed.discard(author)  # in flight again
                work.arrivals.setdefault(author, seen.now)
                payload_id, size = seen.commits[author]
                actions.append(Fetch(work.number, author, payload_id, size))
        return actions

    def _pause_refetch(self, author: Author, now: float) -> None:
        """A fetch of the followed set failed: ask again after RETRY_SECONDS, doubled per failure."""
        failures = self.current.refetches[author] = self.current.refetches.get(author, 0) + 1
        self.current.refetch_at[author] = now + min(RETRY_SECONDS * 2 ** (failures - 1), MAX_REFETCH_PAUSE)

    def _aggregate_if_ready(self) -> list[Action]:
        work = self.current
        if work.chosen is None or not set(work.chosen) - {self.me} <= work.fetched:
            return []
        self.phase = Phase.AGGREGATE
        return [StartAggregate(work.number, work.chosen, work.last_commit)]

    def in_our_cut(self, round_number: int) -> bool | None:
        """Whether our commit of `round_number` was in by our own cut of that round; None if we cut
        no set of it with a commit of ours (it was certified first, or we did not commit)."""
        cut = self.last_cut
        return cut[1] if cut is not None and cut[0] == round_number else None

    def window(self) -> float:
        """The cutoff window, from what every peer sees alike: the larger of a floor and twice the
        spread of commit arrivals (`_spread`) of recent rounds."""
        return max(self.timing.min_collect, 2.0 * max(self.spreads, default=0.0))

    def cutoff(self) -> float:
        """The round's cutoff: first commit seen plus the window, capped by half of what is left of
        the round's deadline (the round closes early once every contributor's payload is in)."""
        work = self.current
        remaining = work.started + self.timing.round_deadline - work.first_seen
        return work.first_seen + max(0.0, min(self.window(), remaining * 0.5))

    def _adopt(self, round_number: int, state_hash: bytes) -> None:
        self.state_round, self.state_hash = round_number, state_hash
        self.phase, self.current, self.voted_hash = Phase.IDLE, None, None
        self.awaiting_retry = False


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
# An Observation is taken in every phase; first, the state-triggered transitions it may set off
# (`RoundMachine._follow_certificates`: the run certified our round or one past it, whatever the
# phase; `_watch_deadline`: the round's attempt changed or passed its deadline).
TRANSITIONS: dict[tuple[Phase, type], Transition] = {
    (_P.IDLE, Observation): _to(RoundMachine._idle_observe, _P.IDLE, _P.TRAIN),
    (_P.TRAIN, Observation): _to(RoundMachine._watch_commits, _P.TRAIN),
    (_P.COLLECT, Observation): _to(RoundMachine._collect_observe, _P.COLLECT, _P.PROPOSE, _P.AGGREGATE),
    (_P.PROPOSE, Observation): _to(RoundMachine._propose_observe, _P.PROPOSE, _P.AGGREGATE),
    **{(phase, Observation): _to(_nothing, phase) for phase in (_P.REPLAY, _P.AGGREGATE)},
    (_P.VOTED, Observation): _to(RoundMachine._voted_observe, _P.VOTED, _P.PROPOSE, _P.AGGREGATE),
    (_P.SYNC, Observation): _to(RoundMachine._sync_observe, _P.SYNC),
    (_P.TRAIN, Trained): _to(RoundMachine._trained, _P.COLLECT, _P.PROPOSE, _P.AGGREGATE),
    (_P.TRAIN, Fetched): _to(RoundMachine._fetched, _P.TRAIN),
    (_P.COLLECT, Fetched): _to(RoundMachine._fetched, _P.COLLECT, _P.PROPOSE, _P.AGGREGATE),
    (_P.PROPOSE, Fetched): _to(RoundMachine._fetched, _P.PROPOSE, _P.AGGREGATE),
    (_P.VOTED, Fetched): _to(RoundMachine._fetched, _P.VOTED),
    (_P.REPLAY, Fetched): _to(RoundMachine._replay_fetched, _P.REPLAY, _P.AGGREGATE, _P.SYNC),
    (_P.AGGREGATE, Aggregated): _to(RoundMachine._aggregated, _P.VOTED, _P.IDLE, _P.TRAIN, _P.SYNC),
    (_P.AGGREGATE, Withheld): _to(RoundMachine._withheld, _P.PROPOSE, _P.AGGREGATE, _P.SYNC),
    (_P.SYNC, Synced): _to(RoundMachine._synced, _P.SYNC, _P.IDLE, _P.TRAIN),
}
# Completions of work the machine stopped waiting for (the training of a round being replayed or
# synced; a fetch that ended after its round was cut): they come, and change nothing.
STALE: frozenset[tuple[Phase, type]] = frozenset({
    (_P.REPLAY, Trained), (_P.AGGREGATE, Trained), (_P.SYNC, Trained),
    (_P.AGGREGATE, Fetched), (_P.SYNC, Fetched),
})
# The state-triggered transitions lead to these phases, from any phase.
CERTIFICATE_PHASES = frozenset({_P.IDLE, _P.TRAIN, _P.REPLAY, _P.AGGREGATE, _P.SYNC})
