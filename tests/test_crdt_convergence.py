"""Stateful property test: honest replicas converge whatever the network and the Byzantine peers do.

Five honest replicas and two Byzantine authors share one run (all admitted at genesis: every one
has a say once round 1's value admits its join). Hypothesis drives: honest writes (payload
commits, and the agreement's ops: the proposer of an attempt proposes the value of the commits it
holds, members prevote and precommit a valid proposal, each precommitting one value per round, so
rounds are certified), delivery of gossiped ops in any order, duplicates, drops, partitions and
heals, and Byzantine misbehaviour (forged signatures, forks, double prevotes, precommits,
proposals and payload commitments, invented parents, oversized and non-canonical bytes, ops of
another run, wrong seqs, round inflation, ops past the per-round caps, writing after its own
leave). After a heal and a full anti-entropy sync, every honest replica must hold the same ops,
the same state and the same certified chain; no op one replica rejected may be applied by
another; every proven equivocator is proven (and banned) everywhere; any topological order of the
ops gives the same state and chain certificates; and snapshot plus later ops equals a full replay.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from locomesh.crdt import (
    Chain, Facts, InvalidValue, Replica, Value, encode_op, evidence_fields, is_quorum, load_snapshot, op_id,
    snapshot_fields,
)
from locomesh.crdt.limits import LIMIT_CODES, RULES
from locomesh.crdt.ops import REGISTRY
from locomesh.crdt.sync import SyncPuller, SyncServer
from locomesh.node.agreement.proposing import own_value
from locomesh.protocol import ProtocolError

from .test_crdt_support import H1, H2, content_of, genesis, in_causal_order, joined_replica, keys, reordered, rewrap

HONEST, BYZANTINE = keys(5), keys(2, offset=100)
GENESIS = genesis(HONEST[0], hparam_writers=[HONEST[0].public_key, BYZANTINE[0].public_key],
                  admitted=[key.public_key for key in HONEST[1:] + BYZANTINE])
OTHER_RUN = joined_replica(HONEST[:1], name="another run")
HASHES = [H1, H2, b"\x33" * 32]
H3 = HASHES[2]
ATTEMPTS = 3  # the attempts of a round honest members take part in


class Convergence(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.replicas = [Replica(GENESIS) for _ in HONEST]
        self.in_flight: list[tuple[int, bytes]] = []  # (destination, op bytes)
        self.delivered: list[tuple[int, bytes]] = []
        self.group = [0] * len(HONEST)  # partition group of each replica
        self.byz_chain: dict[bytes, tuple[int, bytes | None]] = {k.public_key: (0, None) for k in BYZANTINE}
        self.forks: list[tuple[bytes, bytes, bytes]] = []  # (author, op a, op b)
        self.snapshot: tuple[bytes, list[bytes]] | None = None

    @initialize()
    def everyone_joins(self) -> None:
        """Every member joins before the run starts (so round 1's value admits them all, and the
        Byzantine members stay under a third of round 2's electorate)."""
        for index, key in enumerate(HONEST):
            data = self.replicas[index].create(key, "join", round=1)
            for other in range(len(HONEST)):
                self._receive(other, data)
        for key in BYZANTINE:
            self._byzantine_send(self._byz_op(key, 0, "crdt.join", round=1), list(range(len(HONEST))), advance=True)

    # --- honest behaviour ----------------------------------------------------------------------

    @rule(who=st.integers(0, 4),
          what=st.sampled_from(["commit", "propose", "prevote", "precommit", "attest", "hparams", "leave", "join"]),
          choice=st.integers(0, 2))
    def honest_write(self, who: int, what: str, choice: int) -> None:
        replica, key = self.replicas[who], HONEST[who]
        tip = replica.chain.tip
        next_round = tip.round
        if what in ("propose", "prevote", "precommit"):
            specs = self._agreement(who, what, attempt=choice)
            if not specs:
                return
        elif what == "hparams" and who != 0:
            return
        elif what == "commit" and key.public_key in replica.facts.commits_in(next_round):
            return  # an honest member commits to one payload per round (saying it twice is allowed, but dull)
        else:
            specs = [(what, {
                "commit": {"round": next_round, "hash": HASHES[who % 3], "size": 100 + who},
                "attest": {"round": replica.chain.round, "id": HASHES[choice], "size": 10},
                "hparams": {"round": next_round, "changes": {"outer_lr": 0.1 * choice}},
                "leave": {"round": next_round},
                "join": {"round": next_round},
            }[what])]
        for data in _within_limits(replica, key, specs):
            self._gossip(who, data)

    @rule(who=st.integers(0, 4), count=st.integers(2, 5))
    def honest_batch(self, who: int, count: int) -> None:
        """Several ops under one seal: attestations, each on top of the one before."""
        replica, key = self.replicas[who], HONEST[who]
        specs = [("attest", {"round": replica.chain.round, "id": HASHES[i % 3], "size": i}) for i in range(count)]
        for data in _within_limits(replica, key, specs):
            self._gossip(who, data)

    @rule(attempt=st.integers(0, ATTEMPTS - 1))
    def everyone_agrees(self, attempt: int) -> None:
        """Every honest member commits, proposes if it is the attempt's proposer, and prevotes and
        precommits the attempt's proposal if it holds a valid one: on what its own replica holds."""
        for who in range(len(HONEST)):
            for what in ("commit", "propose", "prevote", "precommit"):
                self.honest_write(who, what, attempt)

    @rule(attempt=st.integers(0, ATTEMPTS - 1), seed=st.integers(0, 2**16), byzantine=st.booleans())
    def calm_round(self, attempt: int, seed: int, byzantine: bool) -> None:
        """A calm moment: honest members go through the agreement step by step, everything in
        flight delivered after each step (within the partition): commits, then attempt by attempt
        from `attempt` on (round the attempts), the proposal, then prevotes and precommits; then
        the commits of the next round (training starts once a round is certified). With
        `byzantine`, the Byzantine members take part their way: a Byzantine proposer proposes one
        value or two, and each sends double prevotes and precommits, to some honest replicas."""
        rng = random.Random(seed)
        if byzantine and rng.random() < 0.5:  # a Byzantine member's turn first, if it has one
            chain = self.replicas[0].chain
            attempt = next((a for a in range(ATTEMPTS) if chain.proposer(a) in {k.public_key for k in BYZANTINE}),
                           attempt)
        steps = [("commit",)] + [step for i in range(ATTEMPTS) for step in (("propose",), ("prevote", "precommit"))]
        attempts = [attempt] + [(attempt + i) % ATTEMPTS for i in range(ATTEMPTS) for _ in range(2)]
        steps, attempts = steps + [("commit",)], attempts + [attempt]
        for index, (step, each) in enumerate(zip(steps, attempts)):
            if byzantine and step != ("commit",):
                for byz, key in enumerate(BYZANTINE):
                    view = rng.randrange(len(HONEST))
                    receivers = set(rng.sample(range(len(HONEST)), rng.randint(1, len(HONEST))))
                    if step == ("propose",) and self.replicas[view].chain.proposer(each) == key.public_key:
                        attack = rng.choice(["proposal", "double-proposal"])  # one to all, or two to some each
                        self.byzantine(byz, view, set(range(len(HONEST))) if attack == "proposal" else receivers, attack,
                                       each)
                    elif step != ("propose",):
                        self.byzantine(byz, view, receivers, rng.choice(["double-prevote", "double-precommit", "fork"]),
                                       each)
            for who in range(len(HONEST)):
                for what in step:
                    self.honest_write(who, what, each)
            self.flush(rng.randrange(2**16))

    def _agreement(self, who: int, what: str, attempt: int) -> list[tuple[str, dict]]:
        """The proposal, prevote or precommit an honest member writes for `attempt` of the round
        its replica stands at, or none. An honest member precommits one value per round (its lock):
        then no two values of a round can both gather more than two thirds of the electorate from
        honest members, and the Byzantine members never precommit the state honest members compute
        (H1), so every certificate is made of honest precommits."""
        replica, me = self.replicas[who], HONEST[who].public_key
        chain, facts = replica.chain, replica.facts
        round_, epoch = chain.tip.round, chain.tip.epoch.number
        place = {"round": round_, "epoch": epoch, "attempt": attempt}
        mine = {row[5] for row in facts.in_round("precommit", round_).get(me, ()) if row[5]}
        if what == "propose":
            if chain.proposer(attempt) != me or _said(facts, "proposal", me, place):
                return []
            value = (_proposed(facts, round_, next(iter(mine))) if mine
                     else own_value(chain, facts, set(replica.commit_ops(round_))))
            return [] if value is None else [("proposal", {**place, "valid": 0, **value.fields()})]
        proposals = {Value.of_proposal(row) for row in facts.in_round("proposal", round_).get(chain.proposer(attempt), ())
                     if row[3:5] == (epoch, attempt)}
        if len(proposals) != 1:
            return []  # none yet, or its proposer equivocated
        (value,) = proposals
        try:
            chain.read(value)
        except InvalidValue:
            return []
        if mine - {value.id} or _said(facts, what, me, place):
            return []  # locked on another value, or said already in this attempt
        return [(what, {**place, "value": value.id, **({"state": H1} if what == "precommit" else {})})]

    # --- the network -----------------------------------------------------------------------------

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10**6), keep_copy=st.booleans())
    def deliver(self, pick: int, keep_copy: bool) -> None:
        destination, data = self.in_flight[pick % len(self.in_flight)]
        if not keep_copy:  # a kept copy is a later duplicate
            self.in_flight.remove((destination, data))
        self._receive(destination, data)

    @precondition(lambda self: self.in_flight)
    @rule(seed=st.integers(0, 2**16))
    def flush(self, seed: int) -> None:
        """A fast network for a moment: everything in flight is delivered, in a shuffled order (what
        a partition blocks is lost, as in `deliver`)."""
        batch, self.in_flight = self.in_flight, []
        random.Random(seed).shuffle(batch)
        for destination, data in batch:
            self._receive(destination, data)

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10**6))
    def drop(self, pick: int) -> None:
        del self.in_flight[pick % len(self.in_flight)]

    @precondition(lambda self: self.delivered)
    @rule(pick=st.integers(0, 10**6))
    def replay(self, pick: int) -> None:
        destination, data = self.delivered[pick % len(self.delivered)]
        self._receive(destination, data)

    @rule(groups=st.lists(st.integers(0, 1), min_size=5, max_size=5))
    def partition(self, groups: list[int]) -> None:
        self.group = groups

    @rule()
    def heal_and_sync(self) -> None:
        self.group = [0] * len(HONEST)
        self._full_sync()
        self._check_converged()

    @precondition(lambda self: self.snapshot is None)
    @rule()
    def certify_snapshot(self) -> None:
        """After a full sync, every honest member signs a snapshot of the same frontier."""
        self.heal_and_sync()
        fields, facts_bytes = snapshot_fields(self.replicas[0])
        signed = [(key, data) for replica, key in zip(self.replicas, HONEST)  # members only: not those that left
                  for data in _within_limits(replica, key, [("snapshot", fields)])]
        for key, data in signed:
            self._gossip(HONEST.index(key), data)
        electorate = Chain(GENESIS, Facts.decode(facts_bytes)).tip.electorate
        if is_quorum(len(electorate & {key.public_key for key, _data in signed}), len(electorate)):
            self.snapshot = (facts_bytes, [data for _key, data in signed])  # (honest members may have left: no quorum)

    # --- Byzantine behaviour ---------------------------------------------------------------------

    @rule(byz=st.integers(0, 1), view=st.integers(0, 4), receivers=st.sets(st.integers(0, 4), min_size=1),
          attack=st.sampled_from(["forged", "fork", "double-prevote", "double-precommit", "double-proposal", "proposal",
                                  "double-commit", "invented-parent", "oversized", "non-canonical", "other-run",
                                  "bad-seq", "inflation", "hparams", "broken-seal", "over-cap", "after-leave",
                                  "honest-looking"]),
          attempt=st.integers(0, ATTEMPTS - 1))
    def byzantine(self, byz: int, view: int, receivers: set[int], attack: str, attempt: int) -> None:
        key = BYZANTINE[byz]
        targets = sorted(receivers)
        chain = self.replicas[view].chain
        round_ = chain.tip.round  # the round under way as replica `view` sees it
        if "proposal" in attack:  # its own turn to propose, if it has one in the attempts honest members take part in
            attempt = next((a for a in range(ATTEMPTS) if chain.proposer(a) == key.public_key), attempt)
        place = {"round": round_, "epoch": chain.tip.epoch.number, "attempt": attempt}
        seen = self._seen_value(view, round_) or H3  # a value it holds, or a made-up value ID
        prevote = {**place, "value": seen}
        ops_in_flight = [data for _destination, data in self.in_flight if _is_op(data)]
        if attack == "forged":
            data = bytearray(self._byz_op(key, view, "crdt.prevote", **prevote))
            data[-10] ^= 1  # inside the signature
            self._byzantine_send(bytes(data), targets)
        elif attack in ("fork", "double-prevote", "double-precommit", "double-proposal", "double-commit"):
            if attack == "double-proposal":
                a_fields, b_fields = self._two_values(key, view, targets, round_)
                # (`valid` differs too: the two are different statements even when the values are one)
                kind, a_fields, b_fields = "crdt.proposal", {**place, "valid": 0, **a_fields}, {**place, "valid": 1, **b_fields}
            elif attack == "double-commit":
                kind, a_fields, b_fields = "crdt.commit", {"round": round_, "hash": H1, "size": 10}, {
                    "round": round_, "hash": H2, "size": 10}
            elif attack == "double-precommit":  # never the state honest members compute (H1)
                kind, a_fields, b_fields = "crdt.precommit", {**place, "value": seen, "state": H2}, {
                    **place, "value": b"", "state": b""}
            else:  # a fork (two ops at one seq) of two different prevotes, or a double prevote
                kind, a_fields, b_fields = "crdt.prevote", prevote, {**place, "value": b""}
            half = max(1, len(targets) // 2)
            a = self._byz_op(key, view, kind, **a_fields)
            if attack == "fork":  # b at a's seq, beside it
                b = self._byz_op(key, view, kind, **b_fields)
                self._byzantine_send(a, targets[:half])
            else:  # b on top of a
                self._byzantine_send(a, targets[:half], advance=True)
                b = self._byz_op(key, view, kind, **b_fields)
            self.forks.append((key.public_key, a, b))
            self._byzantine_send(b, targets[half:] or targets, advance=True)
        elif attack == "proposal":  # one value, that honest members may find valid and precommit
            value, _alone = self._two_values(key, view, targets, round_)
            self._byzantine_send(self._byz_op(key, view, "crdt.proposal", **place, valid=0, **value), targets,
                                 advance=True)
        elif attack == "invented-parent":
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.prevote", [b"\x99" * 32], 1, **prevote), targets)
        elif attack == "oversized":
            self._byzantine_send(b"\x80" * 200_000, targets)
        elif attack == "non-canonical":
            self._byzantine_send(reordered(self._byz_op(key, view, "crdt.prevote", **prevote)), targets)
        elif attack == "other-run":
            self._byzantine_send(in_causal_order(OTHER_RUN)[0], targets)
        elif attack == "bad-seq":
            seq, _newest = self.byz_chain[key.public_key]
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.prevote", self.replicas[view].heads, seq + 5,
                                           **prevote), targets)
        elif attack == "broken-seal" and ops_in_flight:  # an honest op with a bad signature, before the real one
            self._byzantine_send(rewrap(ops_in_flight[view % len(ops_in_flight)], sig=bytes(64)), targets)
        elif attack == "inflation":
            self._byzantine_send(self._byz_op(key, view, "crdt.precommit",
                                              **{**place, "round": 2**40, "value": H1, "state": H1}), targets)
        elif attack == "over-cap":  # attestations past the cap, each op to other receivers
            for index in range(RULES["attest"].cap + 1):  # (the chain goes on from the last valid one)
                data = self._byz_op(key, view, "crdt.attest", round=chain.round, id=HASHES[index % 3], size=index)
                self._byzantine_send(data, targets[index % len(targets):] or targets, advance=True)
        elif attack == "after-leave":  # a prevote on top of its own leave: no longer a member; then it joins again
            leave = self._byz_op(key, view, "crdt.leave", round=round_)
            self._byzantine_send(leave, targets, advance=True)
            seq, _newest = self.byz_chain[key.public_key]
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.prevote", [op_id(leave)], seq + 1, **prevote),
                                 targets)
            self._byzantine_send(self._byz_op(key, view, "crdt.join", round=round_), targets, advance=True)
        elif attack == "hparams":  # BYZANTINE[0] is a genesis writer, BYZANTINE[1] is not
            self._byzantine_send(self._byz_op(key, view, "crdt.hparams", round=1, changes={"outer_lr": 99.0}), targets,
                                 advance=True)
        else:  # honest-looking: one prevote for what it saw, one attestation
            self._byzantine_send(self._byz_op(key, view, "crdt.prevote", **prevote), targets, advance=True)
            self._byzantine_send(self._byz_op(key, view, "crdt.attest", round=chain.round, id=H2, size=1), targets,
                                 advance=True)

    def _seen_value(self, view: int, round_: int) -> bytes:
        """The ID of some value proposed for `round_` that replica `view` holds, else b"" (nil)."""
        rows = sorted(row for rows in self.replicas[view].facts.in_round("proposal", round_).values() for row in rows)
        return Value.of_proposal(rows[0]).id if rows else b""

    def _two_values(self, key, view: int, targets: list[int], round_: int) -> tuple[dict, dict]:
        """Two different values for `round_`: the commits replica `view` holds with the Byzantine
        author's own (committed now if it has none), and its own alone."""
        replica = self.replicas[view]
        commits = dict(replica.commit_ops(round_))
        if key.public_key not in commits:
            own = self._byz_op(key, view, "crdt.commit", round=round_, hash=H3, size=10)
            self._byzantine_send(own, targets, advance=True)
            commits[key.public_key] = op_id(own)
        everything = Value(round_, tuple(sorted(commits.values())))
        alone = Value(round_, (commits[key.public_key],))
        return everything.fields(), alone.fields()

    # --- checks ------------------------------------------------------------------------------------

    @invariant()
    def replicas_never_disagree_on_what_is_invalid(self) -> None:
        for replica in self.replicas:
            for other in self.replicas:
                assert not any(other.is_rejected(i) for i in replica.op_ids())

    def teardown(self) -> None:
        self._full_sync()
        self._check_converged()
        self._check_any_topological_order()
        self._check_snapshot()

    def _check_converged(self) -> None:
        first = self.replicas[0]
        for replica in self.replicas[1:]:
            assert replica.op_ids() == first.op_ids()
            assert replica.facts.encode() == first.facts.encode()
            assert replica.state == first.state
            assert _certificates(replica) == _certificates(first)
            assert replica.chain.tip.membership == first.chain.tip.membership
        ops = first.op_ids()
        for author, a, b in self.forks:
            if op_id(a) in ops and op_id(b) in ops:
                assert all(replica.facts.proven(author) for replica in self.replicas)
                assert author in first.state.banned
        for key in HONEST + BYZANTINE:  # proven on one replica, proven on all
            assert len({replica.facts.proven(key.public_key) for replica in self.replicas}) == 1
        for key in HONEST:
            assert not first.facts.proven(key.public_key) and key.public_key not in first.state.banned
        for round_, certificate in first.chain.certificates.items():
            assert certificate.voters <= certificate.electorate and first.chain.voters(round_) <= certificate.electorate
            assert is_quorum(len(certificate.voters), len(certificate.electorate))
            # Byzantine members never precommit the state honest members compute: every
            # certificate is of honest precommits, for H1.
            assert certificate.state == H1 and certificate.voters <= {key.public_key for key in HONEST}
            for author, payload in certificate.reading.payloads.items():  # the set's commits, read as they are
                assert first.facts.refs[payload.commit] == ("commit", (payload.commit, author, round_, payload.hash,
                                                                       payload.size))
        for round_ in range(1, first.chain.tip.round + 1):
            committed = first.commits(round_)
            assert all(replica.commits(round_) == committed for replica in self.replicas)

    def _check_any_topological_order(self) -> None:
        source = self.replicas[0]
        ops = in_causal_order(source)
        # a different linear extension: deepest-last still, but ties broken by reversed ID
        reordered = sorted(ops, key=lambda d: (source.facts.ops[op_id(d)][2], bytes(255 - x for x in op_id(d))))
        for order in (reordered, list(reversed(ops))):
            replica = Replica(GENESIS)
            for data in order:
                replica.add(data)
            assert replica.facts.encode() == source.facts.encode() and replica.state == source.state
            assert _certificates(replica) == _certificates(source)

    def _check_snapshot(self) -> None:
        if self.snapshot is None:
            return
        facts_bytes, certificate = self.snapshot
        full = self.replicas[0]
        newcomer = load_snapshot(GENESIS, facts_bytes, certificate)
        covered = full.ancestry(newcomer.heads)
        for data in in_causal_order(full):
            if op_id(data) not in covered:
                newcomer.add(data)
        assert newcomer.facts.encode() == full.facts.encode() and newcomer.state == full.state
        assert _certificates(newcomer) == _certificates(full)

    # --- plumbing ----------------------------------------------------------------------------------

    def _gossip(self, sender: int, data: bytes) -> None:
        self.in_flight += [(index, data) for index in range(len(self.replicas)) if index != sender]

    def _receive(self, destination: int, data: bytes, *, ignore_partition: bool = False) -> bool:
        """Deliver `data` (unless a partition keeps it away); False if the replica refused it."""
        try:
            name = op_id(data)
        except ProtocolError:
            name = None  # junk bytes: nobody holds them
        sender_groups = {self.group[i] for i, r in enumerate(self.replicas) if name in r}
        if not ignore_partition and sender_groups and self.group[destination] not in sender_groups:
            return True  # partitioned away from every replica that holds it
        self.delivered.append((destination, data))
        try:
            receipt = self.replicas[destination].add(data)
        except ProtocolError:
            return False
        self._publish_evidence(destination, receipt.equivocations)
        return True

    def _publish_evidence(self, index: int, pairs) -> None:
        replica = self.replicas[index]
        for a, b in pairs:
            fields = evidence_fields(a, b)
            if fields and a.author not in replica.facts.convicted:
                for data in _within_limits(replica, HONEST[index], [("evidence", fields)]):
                    self._gossip(index, data)

    def _full_sync(self) -> None:
        # A sweep can take a Byzantine chain only a step or two further when its ops were sent to
        # different replicas, each parked where its parent is missing; long chains need many sweeps.
        for _sweep in range(64):
            before = [len(r) for r in self.replicas]
            for i in range(len(self.replicas)):
                for j in range(len(self.replicas)):
                    if i != j:
                        self._pull(i, j)
            if [len(r) for r in self.replicas] == before:
                return
        raise AssertionError("anti-entropy did not settle")

    def _pull(self, i: int, j: int) -> None:
        puller = SyncPuller(self.replicas[i], HONEST[i], peer=HONEST[j].public_key)
        server = SyncServer(self.replicas[j], HONEST[j], batch_bytes=8 * 1024)
        request = puller.start()
        while request is not None:
            request = puller.receive(server.answer(request).reply)
        self._publish_evidence(i, puller.progress.equivocations)

    def _byz_op(self, key, view: int, kind: str, **fields) -> bytes:
        """A well-formed op by a Byzantine author on top of what replica `view` holds and its own
        newest op."""
        seq, newest = self.byz_chain[key.public_key]
        parents = self.replicas[view].heads + ([newest] if newest else [])
        return encode_op(key, GENESIS.run_id, kind, parents[-64:], seq + 1, **fields)

    def _byzantine_send(self, data: bytes, targets: list[int], *, advance: bool = False) -> None:
        """Straight to the targets (a Byzantine peer talks to whom it likes), plus a late copy.
        `advance`: the author's next ops go on top of this one, unless every target refused it
        (a Byzantine author does not build on what it knows to be invalid: it would silence itself)."""
        taken = [self._receive(target, data, ignore_partition=True) for target in targets]
        self.in_flight.append((targets[0], data))
        if advance and any(taken):
            content = content_of(data)
            self.byz_chain[content["author"]] = (content["body"]["seq"], op_id(data))


def _certificates(replica: Replica) -> dict[int, tuple]:
    """What each certified round's certificate says: its epoch, value, state, electorate, what
    the value means, and who precommitted the certified (value, state) (`Chain.voters`). Not the
    attempt it was found in, its proposer, nor the precommitters counted then (`voters`): when
    honest members precommit one value in two attempts (a member that missed the first quorum
    goes on to the next attempt, where its lock makes it precommit that value again), which
    quorum a replica sees first depends on the order the ops came in."""
    return {round_: (c.epoch, c.value_id, c.state, c.electorate, c.reading, replica.chain.voters(round_))
            for round_, c in sorted(replica.chain.certificates.items())}


def _is_op(data: bytes) -> bool:
    try:
        op_id(data)
    except ProtocolError:
        return False
    return True


def _said(facts: Facts, op_type: str, author: bytes, place: dict) -> bool:
    """Did `author` write an op of `op_type` at `place` (round, epoch, attempt)?"""
    column = REGISTRY[op_type].column
    return any(column(row, "epoch") == place["epoch"] and column(row, "attempt") == place["attempt"]
               for row in facts.in_round(op_type, place["round"]).get(author, ()))


def _proposed(facts: Facts, round_: int, value_id: bytes) -> Value | None:
    """The value `value_id` as a proposal of `round_` proposed it (what a locked proposer proposes again)."""
    for rows in facts.in_round("proposal", round_).values():
        for row in rows:
            if Value.of_proposal(row).id == value_id:
                return Value.of_proposal(row)
    return None


def _within_limits(replica: Replica, key, specs: list) -> list[bytes]:
    """The ops written, or none if the run's limits refuse them (crdt/limits.py: an honest node
    writes nothing after its leave, and stays within the caps)."""
    try:
        return replica.create_batch(key, specs)
    except ProtocolError as error:
        if error.code not in LIMIT_CODES:
            raise
        return []


Convergence.TestCase.settings = settings(max_examples=50, stateful_step_count=80, deadline=None)
test_convergence = Convergence.TestCase
