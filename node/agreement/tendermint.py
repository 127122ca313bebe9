"""One member's part in the agreement of one round: Tendermint, as a sans-IO state machine.

Theory of operation
-------------------
Each training round r (Tendermint's *height*) decides one value: the commits its aggregate takes
and the membership changes it makes (crdt/value.py). Decisions are made by Tendermint's
algorithm (Buchman, Kwon, Milosevic, "The latest gossip on BFT consensus", 2018, Algorithm 1),
whose *rounds* are our *attempts*. Its messages are signed CRDT ops, gossiped and anti-entropied
as every op is; the "upon" rules are evaluated over the replica's op set for the round (`Log`,
log.py), and line 49's decision is the chain's (crdt/chain.py: more than two thirds of the
electorate precommitting one (value, state) in one attempt with that attempt's proposal). So
this machine holds the rest: the attempt, the step, the lock, the valid value and the timers.

Algorithm 1, line by line, as this machine carries it out (n = |E(r)|; "2f + 1" is more than two
thirds of n, "f + 1" more than a third; `_rule_NN` implements line NN):

     1  Initialization:                                    Machine(...), or `resume` after a restart:
     2    h_p := 0                                           one machine per round and epoch
     3    round_p := 0                                       self.attempt
     4    step_p ∈ {propose, prevote, precommit}             self.step
     5    decision_p[] := nil                                the chain's certificates
     6    lockedValue_p := nil                               self.locked
     7    lockedRound_p := −1                                self.locked_round
     8    validValue_p := nil                                self.valid
     9    validRound_p := −1                                 self.valid_round
    10  upon start do StartRound(0)                          `start`: at the round's first commit seen
    11  Function StartRound(round):                          `_start_round`
    12    round_p ← round
    13    step_p ← propose
    14    if proposer(h_p, round_p) = p then
    15      if validValue_p ≠ nil then
    16        proposal ← validValue_p
    17      else
    18        proposal ← getValue()                          NeedValue; the node's cut answers ValueReady
    19      broadcast ⟨PROPOSAL, h_p, round_p, proposal, validRound_p⟩
    20    else
    21      schedule OnTimeoutPropose(h_p, round_p) after timeoutPropose(round_p)
    22  upon ⟨PROPOSAL, h_p, round_p, v, −1⟩ from proposer(h_p, round_p) while step_p = propose do
    23    if valid(v) ∧ (lockedRound_p = −1 ∨ lockedValue_p = v) then        valid(v): Check → Checked
    24      broadcast ⟨PREVOTE, h_p, round_p, id(v)⟩
    25    else
    26      broadcast ⟨PREVOTE, h_p, round_p, nil⟩
    27    step_p ← prevote
    28  upon ⟨PROPOSAL, h_p, round_p, v, vr⟩ from proposer(h_p, round_p) AND 2f + 1 ⟨PREVOTE, h_p, vr, id(v)⟩
          while step_p = propose ∧ (vr ≥ 0 ∧ vr < round_p) do
    29    if valid(v) ∧ (lockedRound_p ≤ vr ∨ lockedValue_p = v) then
    30      broadcast ⟨PREVOTE, h_p, round_p, id(v)⟩
    31    else
    32      broadcast ⟨PREVOTE, h_p, round_p, nil⟩
    33    step_p ← prevote
    34  upon 2f + 1 ⟨PREVOTE, h_p, round_p, ∗⟩ while step_p = prevote for the first time do
    35    schedule OnTimeoutPrevote(h_p, round_p) after timeoutPrevote(round_p)
    36  upon ⟨PROPOSAL, h_p, round_p, v, ∗⟩ from proposer(h_p, round_p) AND 2f + 1 ⟨PREVOTE, h_p, round_p, id(v)⟩
          while valid(v) ∧ step_p ≥ prevote for the first time do
    37    if step_p = prevote then
    38      lockedValue_p ← v
    39      lockedRound_p ← round_p
    40      broadcast ⟨PRECOMMIT, h_p, round_p, id(v)⟩      with the hash of v's state: Hash → Hashed
    41      step_p ← precommit
    42    validValue_p ← v
    43    validRound_p ← round_p
    44  upon 2f + 1 ⟨PREVOTE, h_p, round_p, nil⟩ while step_p = prevote do
    45    broadcast ⟨PRECOMMIT, h_p, round_p, nil⟩
    46    step_p ← precommit
    47  upon 2f + 1 ⟨PRECOMMIT, h_p, round_p, ∗⟩ for the first time do
    48    schedule OnTimeoutPrecommit(h_p, round_p) after timeoutPrecommit(round_p)
    49  upon ⟨PROPOSAL, h_p, r, v, ∗⟩ from proposer(h_p, r) AND 2f + 1 ⟨PRECOMMIT, h_p, r, id(v)⟩
          while decision_p[h_p] = nil do                 the chain certifies the round: the node
    50    if valid(v) then                                 starts the next round's machine
    51      decision_p[h_p] = v
    52      h_p ← h_p + 1
    53      reset lockedRound_p, lockedValue_p, validRound_p and validValue_p to initial values
    54      StartRound(0)
    55  upon f + 1 ⟨∗, h_p, round, ∗, ∗⟩ with round > round_p do
    56    StartRound(round)
    57  Function OnTimeoutPropose(height, round):
    58    if height = h_p ∧ round = round_p ∧ step_p = propose then
    59      broadcast ⟨PREVOTE, h_p, round_p, nil⟩
    60      step_p ← prevote
    61  Function OnTimeoutPrevote(height, round):
    62    if height = h_p ∧ round = round_p ∧ step_p = prevote then
    63      broadcast ⟨PRECOMMIT, h_p, round_p, nil⟩
    64      step_p ← precommit
    65  Function OnTimeoutPrecommit(height, round):
    66    if height = h_p ∧ round = round_p then
    67      StartRound(round_p + 1)

Where this machine departs from the letter, and why:

- valid(v) needs I/O: a member finds v valid when the chain's rules hold (crdt/value.py, alike
  everywhere) and it holds what v names (every payload, or each shard at another member). The
  machine asks (`Check`) and counts v as neither valid nor invalid until `Checked` answers; the
  rules that need valid(v) wait for it, and line 57's timeout ends the wait as the paper's
  timeouts end any wait. A member still training checks and votes all the same: voting never
  waits for its own training.
- A precommit names the state hash too (line 40): the hash of the state v's aggregate gives. The
  lock is taken at once (lines 38-39, 41); the precommit goes out when `Hashed` brings the hash
  (asked for as soon as we prevote v, so it is usually there). A hash that cannot be computed
  sends a nil precommit, which is always safe. A precommit computed after the attempt moved on is
  still sent: it repeats our lock, and may complete the attempt's certificate.
- getValue() is the node's cut (line 18): the proposer asks (`NeedValue`) and proposes what
  `ValueReady` brings; it sets no propose timeout for itself (line 21), as the paper's proposer.
  A node may have no valid value to propose (it holds too few payloads when its wait ends:
  crdt/value.py); `ValueReady(None)` then prevotes nil, as line 59 does when a wait ends.
- `start` is called at the round's first commit seen, not when the round before is certified:
  a round trains for minutes before there is anything to propose.
- After a restart `resume` rebuilds the state from our own messages in the op log (the attempt
  of the newest, the lock from our newest precommit of a value), so a restarted member never
  contradicts what it said: it would be an equivocation, a ban.
- A member that signed a `recover` for this epoch at an earlier round (recovery.py) abstains:
  it sends nothing, so its epoch cannot certify past the round its recovery names.

Rules of this file
------------------
The "upon" rules are checked in the order of `RULES` after every event, each at most once per
event, until none fires. Each entry gives the steps it fires from and the step it leaves the
machine in (None: the step it found); the machine checks that it lands there. An event the
machine did not ask for (a check or a hash of a value it never asked about) raises
`ImpossibleEvent`. Every event returns the actions to carry out, in order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from locomesh.crdt import Value

from .log import NIL, Log, Proposal
from .messages import (Action, Check, Checked, Event, Hash, Hashed, NeedValue, Observe, Precommit, Prevote,
                       Propose, ValueReady)

__all__ = ["Action", "Check", "Checked", "Event", "Hash", "Hashed", "Machine", "NeedValue", "Observe", "Precommit",
           "Prevote", "Propose", "Step", "Timeouts", "ValueReady"]


class Step(enum.Enum):
    PROPOSE = "propose"
    PREVOTE = "prevote"
    PRECOMMIT = "precommit"


class ImpossibleEvent(RuntimeError):
    """An event the machine did not ask for."""


@dataclass(frozen=True)
class Timeouts:
    """Tendermint's timeouts, growing with the attempt (seconds): base + attempt x growth. The
    propose timeout of attempt 0 is its own (`first_propose`): attempt 0 starts at the round's
    first commit, so its proposer cuts its set first; a later one proposes what it holds at once."""

    propose: float = 30.0
    prevote: float = 5.0
    precommit: float = 5.0
    growth: float = 5.0
    first_propose: float | None = None  # None: as `propose`

    def of(self, kind: str, attempt: int) -> float:
        if kind == "propose" and attempt == 0 and self.first_propose is not None:
            return self.first_propose
        return getattr(self, kind) + attempt * self.growth


# --- the machine -----------------------------------------------------------------------------------


@dataclass
class Machine:
    """Our part in one round's agreement in one epoch (module docstring)."""

    round: int
    epoch: int
    me: bytes
    proposer: Callable[[int], bytes]  # attempt -> its proposer (crdt/chain.py: `Chain.proposer`)
    timeouts: Timeouts = field(default_factory=Timeouts)
    abstain: bool = False  # we signed a recover at an earlier round of this epoch: send nothing
    attempt: int = 0
    step: Step = Step.PROPOSE
    started: bool = False
    locked: Value | None = None
    locked_round: int = -1
    valid: Value | None = None
    valid_round: int = -1
    checks: dict[bytes, bool | None] = field(default_factory=dict)  # value ID -> valid? (None: asked)
    hashes: dict[bytes, bytes | None] = field(default_factory=dict)  # value ID -> state hash (asked: absent)
    hashing: set[bytes] = field(default_factory=set)  # value IDs whose hash was asked for
    waiting_value: int | None = None  # the attempt whose getValue() we wait for
    pending_precommit: tuple[int, Value] | None = None  # locked, waiting for the value's hash
    timers: dict[str, tuple[int, float]] = field(default_factory=dict)  # kind -> (attempt, fires at)
    fired: set[tuple[int, int]] = field(default_factory=set)  # (line, attempt) of "for the first time" rules
    sent: set[tuple[str, int]] = field(default_factory=set)  # (kind, attempt) of what we broadcast
    log: Log | None = None
    now: float = 0.0
    requests: list[Action] = field(default_factory=list)  # checks a condition asked for while evaluating

    # --- events --------------------------------------------------------------------------------------

    def start(self, log: Log, now: float) -> list[Action]:
        """Line 10: upon start do StartRound(0) (or, after a restart, where our messages say we were)."""
        self.log, self.now, self.started = log, now, True
        newest = log.newest_own_attempt()
        lock = log.locked_by_us()
        if lock is not None:
            self.locked = self._value(lock[1]) or self.locked
            self.locked_round = lock[0] if self.locked is not None else -1
        actions = self._start_round(newest)
        if newest in log.own_precommits:
            self.step = Step.PRECOMMIT
        elif newest in log.own_prevotes:
            self.step = Step.PREVOTE
        return actions + self._evaluate()

    def handle(self, event: Event) -> list[Action]:
        """Feed one event; the actions to carry out, in order."""
        if not self.started:
            if isinstance(event, Observe):
                return []  # nothing to do before `start`
            raise ImpossibleEvent(f"{type(event).__name__} before the machine started")
        match event:
            case Observe(log=log, now=now):
                self.log, self.now = log, now
                return self._evaluate()
            case ValueReady(attempt=attempt, value=value):
                return self._value_ready(attempt, value) + self._evaluate()
            case Checked(value_id=value_id, ok=ok):
                if value_id not in self.checks:
                    raise ImpossibleEvent("a check we did not ask for")
                self.checks[value_id] = ok
                return self._evaluate()
            case Hashed(value_id=value_id, state=state):
                if value_id not in self.hashing:
                    raise ImpossibleEvent("a hash we did not ask for")
                self.hashes[value_id] = state
                return self._precommit_if_hashed() + self._evaluate()
        raise ImpossibleEvent(f"{type(event).__name__} is not an event of this machine")

    # --- StartRound and getValue -------------------------------------------------------------------

    def _start_round(self, attempt: int) -> list[Action]:
        """Lines 11-21."""
        self.attempt, self.step = attempt, Step.PROPOSE
        self.timers.pop("prevote", None)
        self.waiting_value = None
        if self.proposer(attempt) != self.me:
            self._schedule("propose", attempt)
            return []
        if self.abstain or ("proposal", attempt) in self.sent or attempt in self.log.own_proposals:
            return []
        if self.valid is not None:
            return self._propose(attempt, self.valid, self.valid_round)
        self.waiting_value = attempt
        return [NeedValue(attempt)]

    def _value_ready(self, attempt: int, value: Value | None) -> list[Action]:
        if attempt != self.waiting_value:
            return []  # an answer for an attempt we left
        self.waiting_value = None
        if attempt != self.attempt or self.step is not Step.PROPOSE:
            return []
        if value is None:  # nothing we could propose: as line 59 once our wait is over
            return self._prevote(NIL)
        return self._propose(attempt, value, -1)

    def _propose(self, attempt: int, value: Value, valid_round: int) -> list[Action]:
        self.sent.add(("proposal", attempt))
        self.checks.setdefault(value.id, True)  # ours: checked when it was made
        return [Propose(attempt, value, valid_round)]

    # --- the "upon" rules --------------------------------------------------------------------------

    def _evaluate(self) -> list[Action]:
        actions: list[Action] = self._fire_timers()
        progressed = True
        while progressed:
            progressed = False
            for rule in RULES:
                if self.step not in rule.steps:
                    continue
                found = rule.condition(self)
                actions += self.requests
                self.requests.clear()
                if found is None:
                    continue
                before = self.step
                actions += rule.action(self, found)
                expected = before if rule.next is None else rule.next
                if self.step is not expected:
                    raise ImpossibleEvent(f"line {rule.line} left step {self.step.value}, not {expected.value}")
                progressed = True
                break
        return actions

    def _proposal_lines_22_28(self) -> tuple[Proposal, bool] | None:
        """A proposal of this attempt that line 22 or 28 takes: (proposal, whether to prevote it),
        once its validity is known (asking for it meanwhile)."""
        for proposal in self.log.proposals_in(self.attempt):
            vr = proposal.valid_round
            if vr >= 0 and not (vr < self.attempt and self.log.prevoted(vr, proposal.value.id)):
                continue  # line 28's guard: a valid round needs its 2f + 1 prevotes
            unlocked = self.locked_round == -1 if vr < 0 else self.locked_round <= vr
            if not unlocked and not self._is_locked_on(proposal.value):
                return proposal, False  # locked on another value: nil, whatever v is
            valid = self._validity(proposal.value)
            if valid is None:
                continue
            return proposal, valid
        return None

    def _prevote_proposal(self, found: tuple[Proposal, bool]) -> list[Action]:
        proposal, accept = found
        if not accept:
            return self._prevote(NIL)
        return self._prevote(proposal.value.id) + self._ask_hash(proposal.value)

    def _prevotes_any(self) -> int | None:
        """Line 34."""
        if (34, self.attempt) in self.fired or not self.log.prevoted_any(self.attempt):
            return None
        return self.attempt

    def _schedule_prevote_timeout(self, _attempt: int) -> list[Action]:
        self.fired.add((34, self.attempt))
        self._schedule("prevote", self.attempt)
        return []

    def _polka(self) -> Proposal | None:
        """Line 36: a proposal of this attempt, valid, with 2f + 1 prevotes for it."""
        if (36, self.attempt) in self.fired:
            return None
        for proposal in self.log.proposals_in(self.attempt):
            if self.log.prevoted(self.attempt, proposal.value.id) and self._validity(proposal.value):
                return proposal
        return None

    def _lock(self, proposal: Proposal) -> list[Action]:
        """Lines 37-43."""
        self.fired.add((36, self.attempt))
        actions: list[Action] = []
        if self.step is Step.PREVOTE:
            self.locked, self.locked_round = proposal.value, self.attempt
            self.step = Step.PRECOMMIT
            self.pending_precommit = (self.attempt, proposal.value)
            actions = self._ask_hash(proposal.value) + self._precommit_if_hashed()
        self.valid, self.valid_round = proposal.value, self.attempt
        return actions

    def _nil_polka(self) -> int | None:
        """Line 44."""
        return self.attempt if self.log.prevoted(self.attempt, NIL) else None

    def _precommit_nil(self, _attempt: int) -> list[Action]:
        self.step = Step.PRECOMMIT
        return self._precommit(self.attempt, NIL, NIL)

    def _precommits_any(self) -> int | None:
        """Line 47."""
        if (47, self.attempt) in self.fired or not self.log.precommitted_any(self.attempt):
            return None
        return self.attempt

    def _schedule_precommit_timeout(self, _attempt: int) -> list[Action]:
        self.fired.add((47, self.attempt))
        self._schedule("precommit", self.attempt)
        return []

    def _skip_ahead(self) -> int | None:
        """Line 55."""
        return self.log.later_attempt(self.attempt)

    # --- timeouts (lines 57-67) ------------------------------------------------------------------------

    def _schedule(self, kind: str, attempt: int) -> None:
        self.timers[kind] = (attempt, self.now + self.timeouts.of(kind, attempt))

    def _fire_timers(self) -> list[Action]:
        actions: list[Action] = []
        for kind in ("propose", "prevote", "precommit"):
            timer = self.timers.get(kind)
            if timer is None or self.now < timer[1]:
                continue
            del self.timers[kind]
            attempt = timer[0]
            if attempt != self.attempt:
                continue
            if kind == "propose" and self.step is Step.PROPOSE:  # lines 57-60
                actions += self._prevote(NIL)
            elif kind == "prevote" and self.step is Step.PREVOTE:  # lines 61-64
                self.step = Step.PRECOMMIT
                actions += self._precommit(attempt, NIL, NIL)
            elif kind == "precommit":  # lines 65-67
                actions += self._start_round(attempt + 1)
        return actions

    def next_timer(self) -> float | None:
        """When a timer fires next (for the driver to wake up then)."""
        return min((at for _attempt, at in self.timers.values()), default=None)

    # --- sending -------------------------------------------------------------------------------------

    def _prevote(self, value_id: bytes) -> list[Action]:
        self.step = Step.PREVOTE
        if self.abstain or ("prevote", self.attempt) in self.sent or self.attempt in self.log.own_prevotes:
            return []
        self.sent.add(("prevote", self.attempt))
        return [Prevote(self.attempt, value_id)]

    def _precommit(self, attempt: int, value_id: bytes, state: bytes) -> list[Action]:
        if self.abstain or ("precommit", attempt) in self.sent or attempt in self.log.own_precommits:
            return []
        self.sent.add(("precommit", attempt))
        return [Precommit(attempt, value_id, state)]

    def _precommit_if_hashed(self) -> list[Action]:
        """Line 40's broadcast, once the locked value's hash is known."""
        if self.pending_precommit is None:
            return []
        attempt, value = self.pending_precommit
        if value.id not in self.hashes:
            return []
        self.pending_precommit = None
        state = self.hashes[value.id]
        return self._precommit(attempt, NIL, NIL) if state is None else self._precommit(attempt, value.id, state)

    # --- asking the node -------------------------------------------------------------------------------

    def _validity(self, value: Value) -> bool | None:
        """valid(v): True or False once the node answered; None while it has not (asking it once)."""
        if value.id not in self.checks:
            self.checks[value.id] = None
            self.requests.append(Check(value))
        return self.checks[value.id]

    def _ask_hash(self, value: Value) -> list[Action]:
        if value.id in self.hashing:
            return []
        self.hashing.add(value.id)
        return [Hash(value)]

    def _is_locked_on(self, value: Value) -> bool:
        return self.locked is not None and self.locked.id == value.id

    def _value(self, value_id: bytes) -> Value | None:
        """A value of this round's log by its ID (our lock after a restart)."""
        for proposals in self.log.proposals.values():
            for proposal in proposals:
                if proposal.value.id == value_id:
                    return proposal.value
        return None


@dataclass(frozen=True)
class Rule:
    """One "upon" rule: the paper's line, the steps it fires from, its condition (what it found,
    or None), its action, and the step it leaves the machine in (None: unchanged)."""

    line: int
    steps: frozenset[Step]
    condition: Callable[[Machine], object | None]
    action: Callable[[Machine, object], list[Action]]
    next: Step | None


_ANY = frozenset(Step)
_P, _V, _C = Step.PROPOSE, Step.PREVOTE, Step.PRECOMMIT
RULES: tuple[Rule, ...] = (
    Rule(22, frozenset({_P}), Machine._proposal_lines_22_28, Machine._prevote_proposal, _V),  # and line 28
    Rule(34, frozenset({_V}), Machine._prevotes_any, Machine._schedule_prevote_timeout, None),
    Rule(36, frozenset({_V, _C}), Machine._polka, Machine._lock, _C),
    Rule(44, frozenset({_V}), Machine._nil_polka, Machine._precommit_nil, _C),
    Rule(47, _ANY, Machine._precommits_any, Machine._schedule_precommit_timeout, None),
    Rule(55, _ANY, Machine._skip_ahead, Machine._start_round, _P),
)
