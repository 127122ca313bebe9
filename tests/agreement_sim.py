"""An in-process world for the agreement's tests: real replicas, the real seat and Tendermint machine
(node/agreement/), a seeded scheduler with message delays, partitions, crashes and restarts, and
Byzantine members. No network, no trio: a heap of timed events, so thousands of scenarios run in
seconds and each is repeatable from its seed. (A test helper: it holds no tests itself.)

What is modelled of a node: it trains for a while and commits a payload; it fetches the payload of
every commit it sees after a delay (unless the author withholds it); its cut is the round's first
commit seen plus a window; a value is valid for it when the chain's rules hold and it holds every
payload the value names; a value's state hash is a function of the value (the outer step is
bit-exact). Ops spread by gossip (each to each, with a delay) and by anti-entropy (a pull of
everything missing from a random reachable peer, every second).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from locomesh.crdt import Genesis, Replica, Value
from locomesh.node.agreement import tendermint as tm
from locomesh.node.agreement.proposing import own_value
from locomesh.node.agreement.seat import Answer, Asked, Seat, Write
from locomesh.protocol import Identity, ProtocolError
from locomesh.protocol.runs import sign_manifest

BEHAVIOURS = ("equivocate", "future", "withhold", "sybil_proposal", "unfetchable", "silent", "wrong_hash")
# A "sybil" (`World.sybils`) is a fresh key that joins and commits whenever the run lets it, and never votes.


def state_of(value_id: bytes) -> bytes:
    """The state hash every honest member computes for a value (a stand-in for the outer step)."""
    return hashlib.sha256(b"state" + value_id).digest()


@dataclass
class Member:
    identity: Identity
    replica: Replica
    seat: Seat
    behaviour: str | None = None  # one of BEHAVIOURS, or None: honest
    alive: bool = True
    training: float = 5.0  # seconds from a round's start here to our commit
    held: dict[int, set[bytes]] = field(default_factory=dict)  # round -> authors whose payload we hold
    first_seen: dict[int, float] = field(default_factory=dict)  # round -> when its first commit was seen
    committed: set[int] = field(default_factory=set)
    fetching: set[tuple[int, bytes]] = field(default_factory=set)  # (round, author) of payloads asked for
    started: set[int] = field(default_factory=set)  # rounds whose training started here
    waiting_checks: list[tuple[Asked, float]] = field(default_factory=list)  # (question, give up at)
    waiting_value: list[Asked] = field(default_factory=list)
    history: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # round -> (value, state) certified here
    rollbacks: int = 0

    @property
    def key(self) -> bytes:
        return self.identity.public_key


@dataclass
class World:
    """A run of `n` members (the first the creator, all admitted at genesis unless `open_run`)."""

    seed: int
    n: int = 4
    max_delay: float = 0.5
    fetch_delay: float = 1.0
    window: float = 2.0
    check_timeout: float = 20.0
    hash_time: float = 1.0
    recover_after: float = 120.0
    timeouts: tm.Timeouts = field(default_factory=lambda: tm.Timeouts(propose=15.0, prevote=3.0, precommit=3.0, growth=3.0))
    open_run: bool = False  # members past the creator are not admitted at genesis: they earn a say
    sybils: int = 0  # extra keys that join and commit whenever the run lets them, and never vote
    behaviours: dict[int, str] = field(default_factory=dict)  # member index -> behaviour
    now: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.identities = [Identity.from_seed(hashlib.sha256(b"member %d" % i).digest()) for i in range(self.n)]
        keys = [identity.public_key for identity in self.identities]
        manifest = sign_manifest(self.identities[0], task="synthetic", created=1, hparams={"inner_steps": 1},
                                 admitted=[] if self.open_run else keys[1:])
        self.identities += [Identity.from_seed(hashlib.sha256(b"sybil %d" % i).digest()) for i in range(self.sybils)]
        self.behaviours.update({self.n + i: "sybil" for i in range(self.sybils)})
        self.n += self.sybils
        self.genesis = Genesis.from_manifest(manifest)
        self.members = [self._member(i) for i in range(self.n)]
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.cut: set[frozenset[int]] = set()  # pairs of member indexes that cannot reach each other
        for index, member in enumerate(self.members):
            member.training = self.rng.uniform(3.0, 4.5)  # within a window of each other: every one can make the cut
            if member.alive:
                member.replica.create(member.identity, "join", round=1)
        for member in self.members:  # every join known to everyone before round 1 starts
            self._pull_all(member)
        for index, member in enumerate(self.members):
            self.at(self.rng.uniform(0, 0.2), lambda i=index: self._tick(i))
            self.at(1.0 + self.rng.uniform(0, 1), lambda i=index: self._anti_entropy(i))
            self._start_round(index, 1)

    def _member(self, index: int) -> Member:
        identity = self.identities[index]
        replica = Replica(self.genesis)
        seat = Seat(identity.public_key, timeouts=lambda: self.timeouts, recover_after=lambda: self.recover_after)
        return Member(identity, replica, seat, self.behaviours.get(index))

    # --- the scheduler ------------------------------------------------------------------------------

    def at(self, delay: float, event: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._order), event))

    def run(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        while self._events and self._events[0][0] <= until and not stop():
            self.now, _order, event = heapq.heappop(self._events)
            event()
        self.now = max(self.now, until) if not stop() else self.now

    def reachable(self, a: int, b: int) -> bool:
        return a != b and frozenset((a, b)) not in self.cut and self.members[a].alive and self.members[b].alive

    # --- faults -------------------------------------------------------------------------------------

    def partition(self, *sides: list[int]) -> None:
        self.cut = {frozenset((a, b)) for s in sides for t in sides if s is not t for a in s for b in t}

    def heal(self) -> None:
        self.cut = set()

    def crash(self, index: int) -> None:
        self.members[index].alive = False

    def restart(self, index: int) -> None:
        """A restart on the same data dir: the op log comes back, the machine's state does not."""
        old = self.members[index]
        replica = Replica(self.genesis)
        for data in _in_causal_order(old.replica):
            replica.add(data)
        member = self._member(index)
        member.replica, member.training, member.alive = replica, old.training, True
        member.history, member.committed, member.started = old.history, old.committed, set(old.committed)
        self.members[index] = member
        self._start_round(index, replica.chain.tip.round)

    # --- a member's life ----------------------------------------------------------------------------

    def _tick(self, index: int) -> None:
        member = self.members[index]
        if member.alive and member.behaviour == "sybil":
            self._start_round(index, member.replica.chain.tip.round)  # commits when drawn; votes never
        elif member.alive and member.behaviour != "silent":
            self._observe(index)
        self.at(0.5, lambda: self._tick(index))

    def _observe(self, index: int) -> None:
        member = self.members[index]
        chain = member.replica.chain
        self._note_certificates(member)
        for question, give_up in list(member.waiting_checks):
            self._try_check(index, question, give_up)
        for question in list(member.waiting_value):
            self._try_value(index, question)
        self._carry_out(index, member.seat.observe(chain, member.replica.facts, self.now))
        self._start_round(index, chain.tip.round)

    def _note_certificates(self, member: Member) -> None:
        """Count a certificate that changed or went (the newest noted is checked again each time)."""
        chain = member.replica.chain
        newest = max(member.history, default=0)
        for round_ in range(max(1, newest), chain.round + 1):
            certificate = chain.certificates[round_]
            said = (certificate.value_id, certificate.state)
            if member.history.setdefault(round_, said) != said:
                member.rollbacks += 1
        if newest > chain.round:
            member.rollbacks += 1

    def _start_round(self, index: int, round_: int) -> None:
        member = self.members[index]
        if round_ in member.started or member.key not in member.replica.contributors(round_):
            return
        member.started.add(round_)
        self.at(member.training, lambda: self._commit(index, round_))

    def _commit(self, index: int, round_: int) -> None:
        member = self.members[index]
        if not member.alive or member.behaviour == "silent" or round_ in member.committed:
            return
        if member.replica.chain.tip.round != round_ or member.key not in member.replica.contributors(round_):
            return
        member.committed.add(round_)
        payload = hashlib.sha256(b"payload %d %d" % (index, round_)).digest()
        self._write(index, "commit", {"round": round_, "hash": payload, "size": 1000})

    def _write(self, index: int, op_type: str, fields: dict[str, Any]) -> None:
        member = self.members[index]
        try:
            data = member.replica.create(member.identity, op_type, **fields)
        except ProtocolError:
            return  # a limit, or a statement we made already: an honest node skips it
        self._gossip(index, data)
        self._seen_ops(index)

    def _gossip(self, index: int, data: bytes, targets: list[int] | None = None) -> None:
        for other in range(self.n) if targets is None else targets:
            if self.reachable(index, other):
                self.at(self.rng.uniform(0.01, self.max_delay), lambda o=other, d=data, s=index: self._deliver(s, o, d))

    def _deliver(self, source: int, index: int, data: bytes) -> None:
        if not self.reachable(source, index):
            return
        member = self.members[index]
        try:
            member.replica.add(data)
        except ProtocolError:
            return
        self._seen_ops(index)
        self._observe(index)

    def _seen_ops(self, index: int) -> None:
        """Fetch the payload of every commit of the tip round we do not hold yet."""
        member = self.members[index]
        round_ = member.replica.chain.tip.round
        commits = member.replica.facts.in_round("commit", round_)
        if commits and round_ not in member.first_seen:
            member.first_seen[round_] = self.now
        held = member.held.setdefault(round_, set())
        for author in commits:
            if author == member.key:
                held.add(author)
            elif author not in held and (round_, author) not in member.fetching:
                member.fetching.add((round_, author))
                self.at(self.fetch_delay * self.rng.uniform(0.5, 1.5), lambda a=author, r=round_: self._fetched(index, r, a))

    def _fetched(self, index: int, round_: int, author: bytes) -> None:
        owner = next(m for m in self.members if m.key == author)
        if owner.behaviour == "withhold":
            return  # nobody serves it
        self.members[index].held.setdefault(round_, set()).add(author)

    def _anti_entropy(self, index: int) -> None:
        member = self.members[index]
        peers = [other for other in range(self.n) if self.reachable(index, other)]
        if member.alive and peers:
            source = self.members[self.rng.choice(peers)]
            ops = source.replica.facts.ops
            missing = sorted(source.replica.op_ids() - member.replica.op_ids(), key=lambda i: (ops[i][2], i))
            for op in missing:
                try:
                    member.replica.add(source.replica.get(op))
                except ProtocolError:
                    pass
            if missing:
                self._seen_ops(index)
                self._observe(index)
        self.at(1.0, lambda: self._anti_entropy(index))

    def _pull_all(self, member: Member) -> None:
        for other in self.members:
            for data in _in_causal_order(other.replica):
                try:
                    member.replica.add(data)
                except ProtocolError:
                    pass

    # --- the seat's questions ---------------------------------------------------------------------

    def _carry_out(self, index: int, out: list) -> None:
        member = self.members[index]
        for item in out:
            if isinstance(item, Write):
                self._write_agreement(index, item)
            elif isinstance(item.question, tm.NeedValue):
                member.waiting_value.append(item)
                self._try_value(index, item)
            elif isinstance(item.question, tm.Check):
                member.waiting_checks.append((item, self.now + self.check_timeout))
                self._try_check(index, item, self.now + self.check_timeout)
            elif isinstance(item.question, tm.Hash):
                state = state_of(item.question.value.id)
                if member.behaviour == "wrong_hash":
                    state = hashlib.sha256(state).digest()
                answer = Answer(item.round, item.epoch, tm.Hashed(item.question.value.id, state))
                self.at(self.hash_time, lambda a=answer: self._answer(index, a))

    def _write_agreement(self, index: int, write: Write) -> None:
        member, fields = self.members[index], dict(write.fields)
        behaviour = member.behaviour
        if behaviour == "equivocate" and write.op_type == "prevote":
            other = dict(fields, value=hashlib.sha256(fields["value"] + b"x").digest())
            half = list(range(0, self.n, 2))
            for op_fields, targets in ((fields, half), (other, [i for i in range(self.n) if i not in half])):
                try:
                    data = member.replica.create(member.identity, "prevote", **op_fields)
                except ProtocolError:
                    continue
                self._gossip(index, data, targets)
            return
        if behaviour == "future" and write.op_type in ("prevote", "precommit"):
            ahead = dict(fields, attempt=fields["attempt"] + self.rng.randint(1, 4), value=self.rng.randbytes(32))
            if write.op_type == "precommit":
                ahead["state"] = self.rng.randbytes(32)
            self._write(index, write.op_type, ahead)
        if behaviour in ("sybil_proposal", "unfetchable") and write.op_type == "proposal":
            commits = member.replica.commit_ops(fields["round"])
            if behaviour == "sybil_proposal":
                chosen = [commits[member.key]] if member.key in commits else []
            else:
                withheld = [op for author, op in commits.items()
                            if next(m for m in self.members if m.key == author).behaviour == "withhold"]
                chosen = sorted(set(commits.values()))[:1] + withheld
            if chosen:
                value = Value(fields["round"], tuple(sorted(set(chosen))), (), tuple(fields["last"]))
                fields.update(value.fields(), valid=0)
        self._write(index, write.op_type, fields)

    def _try_value(self, index: int, question: Asked) -> None:
        member = self.members[index]
        chain = member.replica.chain
        if (question.round, question.epoch) != (chain.tip.round, chain.tip.epoch.number):
            member.waiting_value.remove(question)
            return
        first = member.first_seen.get(question.round)
        if question.question.attempt == 0 and (first is None or self.now < first + self.window):
            if first is not None:
                self.at(first + self.window - self.now + 0.01, lambda: self._observe(index))
            return
        value = own_value(chain, member.replica.facts, member.held.get(question.round, set()) | {member.key})
        waited = self.now - (first if first is not None else self.now)
        if value is None and waited < self.timeouts.propose:
            return  # more payloads may come: ask again at the next look
        member.waiting_value.remove(question)
        self._answer(index, Answer(question.round, question.epoch, tm.ValueReady(question.question.attempt, value)))

    def _try_check(self, index: int, question: Asked, give_up: float) -> None:
        member = self.members[index]
        if (question, give_up) not in member.waiting_checks:
            return
        value = question.question.value
        authors = {member.replica.facts.refs[op][1][1] for op in value.set}
        held = member.held.get(question.round, set()) | {member.key}
        if authors <= held or self.now >= give_up:
            member.waiting_checks.remove((question, give_up))
            ok = authors <= held
            self._answer(index, Answer(question.round, question.epoch, tm.Checked(value.id, ok)))
        elif not any(q is question for q, _ in member.waiting_checks[:-1]):
            self.at(min(1.0, give_up - self.now), lambda: self._try_check(index, question, give_up))

    def _answer(self, index: int, answer: Answer) -> None:
        member = self.members[index]
        if member.alive:
            self._carry_out(index, member.seat.answer(answer))

    # --- what the tests read ------------------------------------------------------------------------

    def honest(self) -> list[Member]:
        return [member for member in self.members if member.behaviour is None]

    def certified(self, members: list[Member] | None = None) -> int:
        """The fewest certified rounds among `members` (default: the honest ones that are up)."""
        members = members if members is not None else [m for m in self.honest() if m.alive]
        return min(member.replica.chain.round for member in members)

    def agree(self) -> bool:
        """Do all replicas agree on every round they both certified, and did none take one back?"""
        seen: dict[int, tuple[bytes, bytes]] = {}
        for member in self.members:
            self._note_certificates(member)
            if member.rollbacks:
                return False
            for round_, certificate in member.replica.chain.certificates.items():
                said = (certificate.value_id, certificate.state)
                if seen.setdefault(round_, said) != said:
                    return False
        return True


def _in_causal_order(replica: Replica) -> list[bytes]:
    order = sorted(replica.op_ids(), key=lambda i: (replica.facts.ops[i][2], i))
    return [data for data in (replica.get(i) for i in order) if data is not None]
