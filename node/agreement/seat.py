"""A member's seat in a run's agreement: the Tendermint machine of the chain's tip, started and
replaced as the chain moves, its messages written as ops, and the recovery when it is stuck.

The node (node/rounds/) shows the seat the replica (`observe`, after every op and at least every
poll) and answers what the machine asks: the value it would propose (`ValueReady`), whether it
holds what a value names (`Checked`), the hash of a value's state (`Hashed`). The seat answers
with `Write`s (ops to sign and publish: proposal, prevote, precommit, recover) and the machine's
questions, each tagged with the round and epoch it is for, so an answer that comes after the
chain moved on is dropped.

- **Which round.** The tip's, once it has a commit (the round is under way) and we are in its
  electorate; a new machine when the chain certifies the round or starts a new epoch. A member
  outside the electorate has no seat: it follows the chain.
- **The rules every member checks alike** (crdt/value.py, with the carried value of a new epoch)
  run here before the node is asked whether it holds the value: a value they refuse is invalid
  without any fetch.
- **Recovery** (recovery.py): when the round has gone `recover_after` seconds here with no
  certificate, we sign one `recover` for the epoch, carrying our lock; from then on we send
  nothing in this epoch for later rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

from locomesh.crdt import Chain, Facts, InvalidValue, Value

from . import tendermint as tm
from .log import Log
from .recovery import abstains, recover_fields


@dataclass(frozen=True)
class Write:
    """Sign and publish one op of the agreement."""

    op_type: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Asked:
    """A question of the machine for the node (`tm.NeedValue`, `tm.Check`, `tm.Hash`) about round
    `round` of epoch `epoch`."""

    round: int
    epoch: int
    question: tm.NeedValue | tm.Check | tm.Hash


@dataclass(frozen=True)
class Answer:
    """The node's answer (`tm.ValueReady`, `tm.Checked`, `tm.Hashed`) about round `round` of epoch `epoch`."""

    round: int
    epoch: int
    answer: tm.ValueReady | tm.Checked | tm.Hashed


Out = Union[Write, Asked]


class Seat:
    def __init__(self, me: bytes, *, timeouts: Callable[[], tm.Timeouts], recover_after: Callable[[], float]) -> None:
        """`timeouts()`: the machine's timeouts now (the node adapts them to the run's pace);
        `recover_after()`: seconds a round may go uncertified here before we sign a recover."""
        self.me = me
        self.timeouts, self.recover_after = timeouts, recover_after
        self.machine: tm.Machine | None = None
        self.started_at: float | None = None  # when the machine of the tip round started
        self.recover_due_seen = False  # the tip round's recover deadline passed while we looked
        self.chain: Chain | None = None
        self.recovered: set[int] = set()  # epochs we wrote a recover for (or tried to)

    @property
    def at(self) -> tuple[int, int] | None:
        """(round, epoch) of the machine, if one runs."""
        return None if self.machine is None else (self.machine.round, self.machine.epoch)

    def observe(self, chain: Chain, facts: Facts, now: float) -> list[Out]:
        """What to do now that the replica holds what it holds."""
        self.chain = chain
        tip = chain.tip
        if self.at != (tip.round, tip.epoch.number):
            self.machine, self.started_at, self.recover_due_seen = None, None, False
        if self.me not in tip.electorate:
            self.machine, self.started_at = None, None  # no timers of a round we have no say in
            return []
        log = Log.of(chain, facts, self.me)
        if self.machine is None:
            if not facts.in_round("commit", tip.round) and not log.proposals:
                return []  # nothing to decide yet: the round trains
            self.machine = tm.Machine(tip.round, tip.epoch.number, self.me, lambda attempt: chain.proposer(attempt),
                                      timeouts=self.timeouts(), abstain=abstains(facts, self.me, tip))
            self.started_at = now
            return self._out(self.machine.start(log, now)) + self._recover(facts, now)
        self.machine.timeouts = self.timeouts()
        return self._out(self.machine.handle(tm.Observe(log, now))) + self._recover(facts, now)

    def answer(self, answer: Answer) -> list[Out]:
        """Feed the node's answer to a question of the machine (dropped if the chain moved on)."""
        if self.machine is None or self.at != (answer.round, answer.epoch):
            return []
        return self._out(self.machine.handle(answer.answer))

    def next_wakeup(self) -> float | None:
        """When the machine's next timer fires, or the round is due a recover (None: no machine)."""
        if self.machine is None:
            return None
        times = [t for t in (self.machine.next_timer(),) if t is not None]
        if self.started_at is not None and not self.recover_due_seen:  # past it, a wake-up would spin
            times.append(self.started_at + self.recover_after())
        return min(times, default=None)

    # --- inside -------------------------------------------------------------------------------------

    def _out(self, actions: list[tm.Action]) -> list[Out]:
        machine = self.machine
        assert machine is not None
        out: list[Out] = []
        for action in actions:
            match action:
                case tm.Propose(attempt=attempt, value=value, valid_round=valid_round):
                    out.append(Write("proposal", {"round": machine.round, "epoch": machine.epoch, "attempt": attempt,
                                                  "valid": valid_round + 1, **value.fields()}))
                case tm.Prevote(attempt=attempt, value_id=value_id):
                    out.append(Write("prevote", {"round": machine.round, "epoch": machine.epoch, "attempt": attempt,
                                                 "value": value_id}))
                case tm.Precommit(attempt=attempt, value_id=value_id, state=state):
                    out.append(Write("precommit", {"round": machine.round, "epoch": machine.epoch,
                                                   "attempt": attempt, "value": value_id, "state": state}))
                case tm.Check(value=value):
                    out += self._check(value)
                case tm.NeedValue() | tm.Hash():
                    out.append(Asked(machine.round, machine.epoch, action))
        return out

    def _check(self, value: Value) -> list[Out]:
        """The rules every member checks alike first: a value they refuse needs no fetch."""
        assert self.chain is not None and self.machine is not None
        try:
            self.chain.read(value)
        except InvalidValue:
            return self._out(self.machine.handle(tm.Checked(value.id, False)))
        return [Asked(self.machine.round, self.machine.epoch, tm.Check(value))]

    def _recover(self, facts: Facts, now: float) -> list[Out]:
        machine, chain = self.machine, self.chain
        if machine is None or chain is None or self.started_at is None or now < self.started_at + self.recover_after():
            return []
        self.recover_due_seen = True
        fields = recover_fields(chain, facts, self.me, machine)
        if fields is None or fields["epoch"] in self.recovered:
            return []
        self.recovered.add(fields["epoch"])
        return [Write("recover", fields)]
