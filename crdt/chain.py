"""The certified history of a run, built as ops arrive: certificates, the membership each makes, epochs.

Theory of operation
-------------------
The agreement (node/agreement/tendermint.py) writes its messages as ops: `proposal`, `prevote`,
`precommit`, `recover` (crdt/ops/). This module reads them back and says which rounds are
certified, the same on every replica that holds the same ops, whatever order they came in.

The chain stands at its *tip*: round h, the first one not certified, in epoch e, with round h's
membership (crdt/membership.py: the electorate E) and seed (the state hash certified for h - 1;
the run ID for round 1). At the tip, in this order:

1. **A recovery epoch.** If members of E signed `recover` ops for epoch e naming round h - 1 and
   its certified state, more than half of E (or exactly half with the run's creator among them,
   so the two halves of a split cannot both), epoch e + 1 starts at round h. Its electorate is
   E still (so every replica counts the same members, whichever recovers it saw first), but its
   first round is decided by a *majority* of E: the members that are there when more than a
   third are gone. That round's value names the recovers it counts (crdt/value.py), and the
   members it does not name leave the electorate from the next round on (crdt/membership.py).
   It must decide the *carried* value, if any: the highest-attempt lock among the signers' that
   a proof backs (prevotes of more than two thirds of E for it in that attempt, and its proposal).
2. **A certificate.** Round h is certified when precommits of more than two thirds of E (a
   majority, in a recovery epoch's first round) name one (value, state) in one attempt of the
   tip's epoch and the proposal of that attempt by its proposer proposes that value
   (Tendermint's decide rule, Algorithm 1 line 49). In the first round of an epoch, a certificate
   of an earlier epoch for that round counts too, by that epoch's rule: the carried lock makes it
   the same value. The value is read (crdt/value.py) and the next round's membership computed from
   it; the tip moves to h + 1 and the checks start again.

Certificates are final. Nothing removes one: bans and absences change the electorates of later
rounds only. With fewer than a third of E Byzantine, Tendermint never certifies two values for
one round in one epoch. A recovery epoch's first round holds against crashes and partitions (a
majority intersects any other majority and every two-thirds quorum), not against Byzantine
members: it is the price of going on when more than a third is gone. An honest member signs one
recover per epoch, carries its lock, and after signing recover(e, c) votes in no round past c + 1
of epoch e (node/agreement/recovery.py). So without Byzantine members a recover quorum for (e, c)
and a certificate of round c + 2 in epoch e never both exist, and a certificate of c + 1 in epoch e
has the carried value: a recover quorum that completes after the tip moved past c + 1 rebuilds
the chain from c + 1 to the same certificates. A late quorum that would lose a certificate
(possible only with Byzantine members in a recovery) is not taken: it is counted in `conflicts`.

Cost: an op at the tip costs a pass over the tip round's rows of its type; an op for another
round costs a dictionary lookup. A certified round costs one membership step (its roster).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .facts import Facts
from .genesis import Genesis
from .membership import Changes, Membership, first_membership, next_membership
from .ops import REGISTRY
from .quorum import drawn_order, is_quorum
from .value import InvalidValue, Payload, Previous, Reading, Value, read

AGREEMENT_TYPES = frozenset({"proposal", "prevote", "precommit", "recover"})
KEPT_TIPS = 16  # tips kept for rebuilding after a late recover quorum


@dataclass(frozen=True)
class Certificate:
    """How round `round` was certified. Its value and state (and so the membership it makes) are
    the same on every replica; `attempt`, `proposer` and `voters` say which quorum this replica saw
    first (members that missed one attempt's quorum precommit their locked value again in a later
    one, and replicas may see either first): `Chain.voters` counts every precommit of the value."""

    round: int
    epoch: int
    attempt: int
    value: Value
    state: bytes  # the state hash the precommits name
    proposer: bytes
    electorate: frozenset[bytes]  # E(round)
    voters: frozenset[bytes]  # the precommitters counted when it was found (a quorum at least)
    reading: Reading

    @property
    def hash(self) -> bytes:
        return self.state

    @property
    def value_id(self) -> bytes:
        return self.value.id

    @property
    def accepted(self) -> frozenset[bytes]:
        """The authors whose payloads the certified set holds."""
        return frozenset(self.reading.payloads)


@dataclass(frozen=True)
class Epoch:
    number: int
    start: int  # its first round
    recovery: bool = False  # started by a recover quorum: a majority decides its first round


@dataclass(frozen=True)
class Tip:
    """Where the chain stands: the round to certify next."""

    round: int
    epoch: Epoch
    membership: Membership
    seed: bytes  # the state hash certified for round - 1 (the run ID before round 1)
    previous: Previous | None  # round - 1's electorate and certificate (None for round 1)
    earlier: tuple[Epoch, ...] = field(default=())  # epochs before `epoch` that also hold this round

    @property
    def electorate(self) -> frozenset[bytes]:
        return self.membership.electorate

    @property
    def recovering(self) -> int | None:
        """The epoch whose recovers this round's value names (its epoch is a recovery epoch that
        starts here); None otherwise."""
        return self.epoch.number - 1 if self.epoch.recovery and self.epoch.start == self.round else None


class Chain:
    def __init__(self, genesis: Genesis, facts: Facts) -> None:
        self.genesis, self.facts = genesis, facts
        self.certificates: dict[int, Certificate] = {}
        self.epochs: list[Epoch] = [Epoch(0, 1)]
        self.conflicts = 0  # late recover quorums not taken (module docstring)
        self._kept: dict[int, Tip] = {}
        self._proposers: dict[tuple, list[bytes]] = {}  # (round, seed, epoch, electorate) -> the order
        self.tip = Tip(1, self.epochs[0], first_membership(genesis), genesis.run_id, None)
        self._advance()

    # --- reading ----------------------------------------------------------------------------------

    @property
    def round(self) -> int:
        """The newest certified round; 0 before any."""
        return self.tip.round - 1

    def state_of(self, round_: int) -> bytes | None:
        """The certified state hash of `round_` (None for round 0 or one not certified)."""
        certificate = self.certificates.get(round_)
        return None if certificate is None else certificate.state

    def proposer(self, attempt: int, tip: Tip | None = None, epoch: int | None = None) -> bytes:
        """Who proposes in `attempt` of the tip's round (in `epoch`, the tip's by default): each
        member once in turn, in an order drawn from the seed, so a member that is gone costs one
        attempt, and no key can pick its turn."""
        tip = tip or self.tip
        number = tip.epoch.number if epoch is None else epoch
        key = (tip.round, tip.seed, number, tip.electorate)
        order = self._proposers.get(key)
        if order is None:  # asked for every proposal the replica holds, each time it looks: drawn once
            if len(self._proposers) > 64:
                self._proposers.clear()
            order = drawn_order(b"locomesh proposer", tip.round, tip.seed + number.to_bytes(4, "big"), 0,
                                tip.electorate)
            self._proposers[key] = order
        return order[attempt % len(order)]

    def carried(self, tip: Tip | None = None) -> bytes | None:
        """The value the tip's round must decide in the tip's epoch: the highest proven lock the
        signers of its recovery carry, at its first round; None where nothing is carried."""
        tip = tip or self.tip
        if tip.recovering is None:
            return None
        best: tuple[int, bytes] | None = None
        for author, rows in self.facts.in_round("recover", tip.round - 1).items():
            if author not in tip.electorate:
                continue
            for _id, _author, _round, number, _state, lock, value in rows:
                if number == tip.recovering and lock and self._proven(tip, number, lock - 1, value):
                    best = max(best or (lock - 1, value), (lock - 1, value))
        return None if best is None else best[1]

    def read(self, value: Value, tip: Tip | None = None) -> Reading:
        """What `value` means for the tip's round, or `InvalidValue` (crdt/value.py), the carried
        value's rule included."""
        tip = tip or self.tip
        carried = self.carried(tip)
        if carried is not None and value.id != carried:
            raise InvalidValue("this round's recovery epoch must decide the value its signers' locks carry")
        return read(value, self.facts, tip.membership, self.genesis, tip.seed, tip.previous, tip.recovering)

    def voters(self, round_: int) -> frozenset[bytes]:
        """Every member of round `round_`'s electorate whose precommit names its certified (value,
        state), in any attempt: who computed the certified state (late precommits included)."""
        certificate = self.certificates.get(round_)
        if certificate is None:
            return frozenset()
        named = (certificate.value_id, certificate.state)
        return frozenset(author for author, rows in self.facts.in_round("precommit", round_).items()
                         if author in certificate.electorate and any((row[5], row[6]) == named for row in rows))

    def recovery_quorum(self, signers: set[bytes], electorate: frozenset[bytes]) -> bool:
        """More than half of `electorate`, or exactly half with the run's creator among them."""
        counted = signers & electorate
        return 2 * len(counted) > len(electorate) or (2 * len(counted) == len(electorate) and self.genesis.creator in counted)

    # --- building --------------------------------------------------------------------------------

    def on_row(self, op_type: str, row: tuple) -> None:
        """A row just added to the facts (crdt/replica.py calls this for every applied op)."""
        if op_type not in AGREEMENT_TYPES:
            return
        entry = REGISTRY[op_type]
        round_ = entry.column(row, "round")
        if op_type == "recover":
            epoch = entry.column(row, "epoch")
            if round_ + 1 < self.tip.round or (round_ + 1 == self.tip.round and epoch < self.tip.epoch.number):
                self._late_recover(round_ + 1, epoch)
                return
            round_ += 1
        if round_ == self.tip.round:
            self._advance()

    def _advance(self) -> None:
        while True:
            switched = self._recovered(self.tip)
            if switched is not None:
                self.tip = switched
                continue
            certified = self._certified(self.tip)
            if certified is None:
                return
            self._certify(certified)

    def _certify(self, certificate: Certificate) -> None:
        tip = self.tip
        self.certificates[tip.round] = certificate
        membership = next_membership(tip.membership, certificate.reading.changes, self.genesis, certificate.state)
        previous = Previous(certificate.electorate, certificate.value_id, certificate.state)
        self._kept[tip.round] = tip
        self._kept.pop(tip.round - KEPT_TIPS, None)
        self.tip = Tip(tip.round + 1, tip.epoch, membership, certificate.state, previous)

    def _certified(self, tip: Tip) -> Certificate | None:
        """Round `tip.round`'s certificate, if the facts hold one (module docstring, step 2)."""
        epochs = {epoch.number: epoch for epoch in (*tip.earlier, tip.epoch)}
        tallies: dict[tuple, set[bytes]] = {}
        for author, rows in self.facts.in_round("precommit", tip.round).items():
            if author not in tip.electorate:
                continue
            for _id, _author, _round, number, attempt, value, state in rows:
                if value and number in epochs:
                    tallies.setdefault((number, attempt, value, state), set()).add(author)
        for (number, attempt, value_id, state), authors in sorted(tallies.items()):
            majority = epochs[number].recovery and epochs[number].start == tip.round
            enough = self.recovery_quorum(authors, tip.electorate) if majority else is_quorum(len(authors), len(tip.electorate))
            if not enough:
                continue
            for value in self._proposed(tip, attempt, number):
                if value.id == value_id:
                    return self._make(tip, epochs[number], attempt, value, state, frozenset(authors))
        return None

    def _make(self, tip: Tip, epoch: Epoch, attempt: int, value: Value, state: bytes,
              voters: frozenset[bytes]) -> Certificate:
        recovering = epoch.number - 1 if epoch.recovery and epoch.start == tip.round else None
        try:
            reading = read(value, self.facts, tip.membership, self.genesis, tip.seed, tip.previous, recovering)
        except InvalidValue:
            # Enough members precommitted it that an honest one found it valid; a rule that reads
            # the facts the same everywhere cannot say otherwise here. Read what it aggregates at
            # least, so the chain goes on.
            reading = _lenient(value, self.facts)
        return Certificate(tip.round, epoch.number, attempt, value, state, self.proposer(attempt, tip, epoch.number),
                           tip.electorate, voters, reading)

    def _proposed(self, tip: Tip, attempt: int, epoch: int) -> list[Value]:
        """The values the proposer of `attempt` in `epoch` proposed for the tip's round."""
        proposer = self.proposer(attempt, tip, epoch)
        return [Value.of_proposal(row) for row in self.facts.in_round("proposal", tip.round).get(proposer, ())
                if row[3] == epoch and row[4] == attempt]

    def _recovered(self, tip: Tip) -> Tip | None:
        """The tip in a recovery epoch, if a recover quorum for the tip's epoch and round - 1
        stands (module docstring, step 1)."""
        if not self.recovery_quorum(self.signers(tip), tip.electorate):
            return None
        epoch = Epoch(tip.epoch.number + 1, tip.round, recovery=True)
        self.epochs.append(epoch)
        return Tip(tip.round, epoch, tip.membership, tip.seed, tip.previous, tip.earlier + (tip.epoch,))

    def signers(self, tip: Tip | None = None) -> set[bytes]:
        """The members of the tip's electorate that signed a recover for its epoch and round - 1."""
        tip = tip or self.tip
        state = b"" if tip.round == 1 else tip.seed
        return {author for author, rows in self.facts.in_round("recover", tip.round - 1).items()
                if author in tip.electorate and any(row[3] == tip.epoch.number and row[4] == state for row in rows)}

    def _proven(self, tip: Tip, epoch: int, attempt: int, value: bytes) -> bool:
        """Do prevotes of more than two thirds of the electorate in `attempt` of `epoch`, and that
        attempt's proposal, back a lock on `value`?"""
        prevoters = {author for author, rows in self.facts.in_round("prevote", tip.round).items()
                     if author in tip.electorate
                     and any(row[2] == epoch and row[3] == attempt and row[4] == value for row in rows)}
        if not is_quorum(len(prevoters), len(tip.electorate)):
            return False
        return any(proposed.id == value for proposed in self._proposed(tip, attempt, epoch))

    def _late_recover(self, start: int, epoch: int) -> None:
        """A recover for a round the tip has passed (module docstring): rebuild from `start` if a
        quorum stands now and the rebuild keeps every certificate."""
        kept = self._kept.get(start)
        if kept is None or kept.epoch.number != epoch or not self.recovery_quorum(self.signers(kept), kept.electorate):
            return
        saved = (dict(self.certificates), list(self.epochs), dict(self._kept), self.tip)
        for round_ in [r for r in self.certificates if r >= start]:
            del self.certificates[round_]
        self.epochs = [e for e in self.epochs if e.number <= epoch]
        self.tip = kept
        self._advance()
        before = saved[0]
        if any(r not in self.certificates or (self.certificates[r].value_id, self.certificates[r].state)
               != (c.value_id, c.state) for r, c in before.items()):
            self.certificates, self.epochs, self._kept, self.tip = saved
            self.conflicts += 1


def _lenient(value: Value, facts: Facts) -> Reading:
    """The payloads of a certified value whose reading failed (see `Chain._make`)."""
    payloads = {}
    for op in value.set:
        found = facts.refs.get(op)
        if found is not None and found[0] == "commit":
            _id, author, _round, hash_, size = found[1]
            payloads.setdefault(author, Payload(author, hash_, size, op))
    return Reading(payloads, Changes(counted=frozenset(payloads)), frozenset())
