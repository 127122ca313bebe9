"""Stateful property test: honest replicas converge whatever the network and the Byzantine peers do.

Five honest replicas and two Byzantine authors share one run. Hypothesis drives: honest writes,
delivery of gossiped ops in any order, duplicates, drops, partitions and heals, and Byzantine
misbehaviour (forged signatures, forks, double votes and double payload commitments, invented
parents, oversized and non-canonical bytes, ops of another run, wrong seqs, round inflation,
ops past the per-round caps, writing after its own leave, writing after a ban). After
a heal and a full anti-entropy sync, every honest replica must hold the same ops and the same
state; no op one replica rejected may be applied by another; every proven equivocator is banned;
any topological order of the ops gives the same state; and snapshot plus later ops equals a
full replay.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from locomesh.crdt import (
    Facts, Replica, derive, encode_op, evidence_fields, is_quorum, load_snapshot, op_id, snapshot_fields,
)
from locomesh.crdt.limits import LIMIT_CODES, RULES
from locomesh.crdt.sync import SyncPuller, SyncServer
from locomesh.protocol import ProtocolError

from .test_crdt_support import H1, H2, genesis, in_causal_order, joined_replica, keys, reordered, rewrap

HONEST, BYZANTINE = keys(5), keys(2, offset=100)
GENESIS = genesis(HONEST[0], hparam_writers=[HONEST[0].public_key, BYZANTINE[0].public_key])
OTHER_RUN = joined_replica(HONEST[:1], name="another run")
HASHES = [H1, H2, b"\x33" * 32]


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
        for index, key in enumerate(HONEST):
            self._gossip(index, self.replicas[index].create(key, "join", round=1))
        for key in BYZANTINE:
            self._byzantine_send(self._byz_op(key, 0, "crdt.join", round=1), list(range(len(HONEST))))

    # --- honest behaviour ----------------------------------------------------------------------

    @rule(who=st.integers(0, 4), what=st.sampled_from(["vote", "commit", "attest", "hparams", "leave", "join"]),
          choice=st.integers(0, 2))
    def honest_write(self, who: int, what: str, choice: int) -> None:
        replica, key = self.replicas[who], HONEST[who]
        next_round = replica.state.round + 1
        fields = {
            "vote": {"round": next_round, "hash": H1},  # honest peers compute the same aggregate
            "commit": {"round": next_round, "hash": HASHES[who % 3], "size": 100 + who},  # one payload per round
            "attest": {"round": replica.state.round, "id": HASHES[choice], "size": 10},
            "hparams": {"round": next_round, "changes": {"outer_lr": 0.1 * choice}},
            "leave": {"round": next_round},
            "join": {"round": next_round},
        }[what]
        if what == "hparams" and who != 0:
            return
        if what == "vote" and any(row[1] == next_round for row in self._own_votes(replica, key)):
            return  # an honest member votes once per round
        if what == "commit" and key.public_key in replica.facts.commits_in(next_round):
            return  # and commits to one payload per round (saying it twice is allowed, but dull)
        for data in _within_limits(replica, key, [(what, fields)]):
            self._gossip(who, data)

    @rule(who=st.integers(0, 4), count=st.integers(2, 5))
    def honest_batch(self, who: int, count: int) -> None:
        """Several ops under one seal: attestations, each on top of the one before."""
        replica, key = self.replicas[who], HONEST[who]
        specs = [("attest", {"round": replica.state.round, "id": HASHES[i % 3], "size": i}) for i in range(count)]
        for data in _within_limits(replica, key, specs):
            self._gossip(who, data)

    @rule()
    def everyone_votes(self) -> None:
        """Every honest member votes for the round after the newest one it sees certified."""
        for who in range(len(HONEST)):
            self.honest_write(who, "vote", 0)

    # --- the network -----------------------------------------------------------------------------

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10**6), keep_copy=st.booleans())
    def deliver(self, pick: int, keep_copy: bool) -> None:
        destination, data = self.in_flight[pick % len(self.in_flight)]
        if not keep_copy:  # a kept copy is a later duplicate
            self.in_flight.remove((destination, data))
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
        certificate = [data for replica, key in zip(self.replicas, HONEST)  # members only: not those that left
                       for data in _within_limits(replica, key, [("snapshot", fields)])]
        for index, data in enumerate(certificate):
            self._gossip(index, data)
        members = set(derive(Facts.decode(facts_bytes), GENESIS).members)
        if is_quorum(len(members & {key.public_key for key in HONEST}), len(members)):
            self.snapshot = (facts_bytes, certificate)  # (honest members may have left: then no quorum)

    # --- Byzantine behaviour ---------------------------------------------------------------------

    @rule(byz=st.integers(0, 1), view=st.integers(0, 4), receivers=st.sets(st.integers(0, 4), min_size=1),
          attack=st.sampled_from(["forged", "fork", "double-vote", "double-commit", "invented-parent", "oversized",
                                  "non-canonical", "other-run", "bad-seq", "inflation", "hparams", "broken-seal",
                                  "over-cap", "after-leave", "honest-looking"]))
    def byzantine(self, byz: int, view: int, receivers: set[int], attack: str) -> None:
        key = BYZANTINE[byz]
        targets = sorted(receivers)
        vote = {"round": 1, "hash": H1}
        if attack == "forged":
            data = bytearray(self._byz_op(key, view, "crdt.vote", advance=False, **vote))
            data[-10] ^= 1  # inside the signature
            self._byzantine_send(bytes(data), targets)
        elif attack in ("fork", "double-vote", "double-commit"):
            kind, extra = ("crdt.commit", {"size": 10}) if attack == "double-commit" else ("crdt.vote", {})
            a = self._byz_op(key, view, kind, advance=attack != "fork", round=1, hash=H1, **extra)
            b = self._byz_op(key, view, kind, round=1, hash=H2, **extra)
            self.forks.append((key.public_key, a, b))
            half = max(1, len(targets) // 2)
            self._byzantine_send(a, targets[:half])
            self._byzantine_send(b, targets[half:] or targets)
        elif attack == "invented-parent":
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.vote", [b"\x99" * 32], 1, **vote), targets)
        elif attack == "oversized":
            self._byzantine_send(b"\x80" * 200_000, targets)
        elif attack == "non-canonical":
            self._byzantine_send(reordered(self._byz_op(key, view, "crdt.vote", advance=False, **vote)), targets)
        elif attack == "other-run":
            self._byzantine_send(in_causal_order(OTHER_RUN)[0], targets)
        elif attack == "bad-seq":
            seq, _newest = self.byz_chain[key.public_key]
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.vote", self.replicas[view].heads, seq + 5,
                                           **vote), targets)
        elif attack == "broken-seal" and self.in_flight:  # an honest op with a bad signature, before the real one
            _destination, honest = self.in_flight[view % len(self.in_flight)]
            self._byzantine_send(rewrap(honest, sig=bytes(64)), targets)
        elif attack == "inflation":
            self._byzantine_send(self._byz_op(key, view, "crdt.vote", advance=False, round=2**40, hash=H1), targets)
        elif attack == "over-cap":  # one attestation past the cap, each op to other receivers
            cap = RULES["attest"].cap
            for index in range(cap + 1):  # (the chain goes on from the last valid one)
                data = self._byz_op(key, view, "crdt.attest", advance=index < cap, round=1, id=HASHES[index % 3],
                                    size=index)
                self._byzantine_send(data, targets[index % len(targets):] or targets)
        elif attack == "after-leave":  # a vote on top of its own leave: no longer a member
            seq, _newest = self.byz_chain[key.public_key]
            leave = self._byz_op(key, view, "crdt.leave", advance=False, round=1)
            self._byzantine_send(leave, targets)
            self._byzantine_send(encode_op(key, GENESIS.run_id, "crdt.vote", [op_id(leave)], seq + 2, round=1,
                                           hash=H2), targets)
        elif attack == "hparams":  # BYZANTINE[0] is a genesis writer, BYZANTINE[1] is not
            self._byzantine_send(self._byz_op(key, view, "crdt.hparams", round=1, changes={"outer_lr": 99.0}),
                                 targets)
        else:
            self._byzantine_send(self._byz_op(key, view, "crdt.attest", round=0, id=H2, size=1), targets)

    # --- checks ------------------------------------------------------------------------------------

    @invariant()
    def replicas_in_one_group_never_disagree_on_what_is_invalid(self) -> None:
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
        ops = first.op_ids()
        for author, a, b in self.forks:
            if op_id(a) in ops and op_id(b) in ops:
                assert author in first.state.banned
        for key in HONEST:
            assert key.public_key not in first.state.banned
        for round_ in range(1, first.state.round + 2):
            committed = first.commits(round_)
            assert all(replica.commits(round_) == committed for replica in self.replicas)
            assert not set(committed) & set(first.state.banned)
            assert set(committed) <= first.electorate(round_) and set(first.votes(round_)) <= first.electorate(round_)

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

    # --- plumbing ----------------------------------------------------------------------------------

    def _gossip(self, sender: int, data: bytes) -> None:
        self.in_flight += [(index, data) for index in range(len(self.replicas)) if index != sender]

    def _receive(self, destination: int, data: bytes, *, ignore_partition: bool = False) -> None:
        try:
            name = op_id(data)
        except ProtocolError:
            name = None  # junk bytes: nobody holds them
        sender_groups = {self.group[i] for i, r in enumerate(self.replicas) if name in r}
        if not ignore_partition and sender_groups and self.group[destination] not in sender_groups:
            return  # partitioned away from every replica that holds it
        self.delivered.append((destination, data))
        try:
            receipt = self.replicas[destination].add(data)
        except ProtocolError:
            return
        self._publish_evidence(destination, receipt.equivocations)

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
            for i, puller_replica in enumerate(self.replicas):
                for j, server_replica in enumerate(self.replicas):
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

    def _byz_op(self, key, view: int, kind: str, *, advance: bool = True, **fields) -> bytes:
        """A well-formed op by a Byzantine author on top of what replica `view` holds."""
        seq, newest = self.byz_chain[key.public_key]
        parents = self.replicas[view].heads + ([newest] if newest else [])
        data = encode_op(key, GENESIS.run_id, kind, parents[-64:], seq + 1, **fields)
        if advance:
            self.byz_chain[key.public_key] = (seq + 1, op_id(data))
        return data

    def _byzantine_send(self, data: bytes, targets: list[int]) -> None:
        """Straight to the targets (a Byzantine peer talks to whom it likes), plus a late copy."""
        for target in targets:
            self._receive(target, data, ignore_partition=True)
        self.in_flight.append((targets[0], data))

    @staticmethod
    def _own_votes(replica: Replica, key):
        return [row for row in replica.facts.votes if row[0] == key.public_key]


def _within_limits(replica: Replica, key, specs: list) -> list[bytes]:
    """The ops written, or none if the run's limits refuse them (crdt/limits.py: an honest node
    writes nothing after its leave, and stays within the caps)."""
    try:
        return replica.create_batch(key, specs)
    except ProtocolError as error:
        if error.code not in LIMIT_CODES:
            raise
        return []


Convergence.TestCase.settings = settings(max_examples=20, stateful_step_count=50, deadline=None)
test_convergence = Convergence.TestCase
