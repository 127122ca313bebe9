"""What the run state says: members, bans, certified rounds, checkpoints, hyperparameters.

Everything here is a pure function of the facts (facts.py), so of the op set. The rules:

- **Bans**: an author is banned when the set proves it equivocated: two of its ops share a
  `seq` (a fork), two of its votes name different hashes for one round, or an evidence op
  convicts it (evidence.py). A banned author's ops stay in the DAG (others' ops point at them)
  but count for nothing below.
- **Membership** (add-wins per author): an author's own join and leave ops form one chain, so
  its newest one by `seq` decides; it is a member when that is a join. Concurrent join/leave by
  one author can only come from a fork, and a fork is a ban. Only admitted authors can write at
  all (genesis.py).
- **Eligibility for round r**: a join names the first round its author trains in, a leave the
  last. Author a is eligible for r when its newest join names a round ≤ r and, if it left after
  that join, its leave names a round ≥ r. Honest nodes name (certified round + 1) when joining.
- **Rounds**: round r is certified with hash h when round r-1 is certified (round 0 is the
  genesis) and more than 2/3 of the authors eligible for r voted (r, h). So the round number
  moves one step per quorum: a single peer cannot push it ahead, its votes for far rounds
  count for nothing. Known limit: a late join that names an old round enlarges that round's
  electorate and can take back its certificate; honest nodes never do that and a full
  causal-past rule would cost a walk of the DAG per certificate.
- **Checkpoints**: a `checkpoint` op announces (round, id, size) and counts as its author's
  attestation; `attest` ops add more. For each round up to the certified one, the canonical
  checkpoint is the most attested by unbanned authors that ever joined, ties broken by the
  smaller ID. The current checkpoint is the canonical one of the newest such round.
- **Hyperparameters**: changes come only from keys named at genesis (checked per op); each names
  the round it takes effect. The value for round r is the genesis value overlaid by the changes
  with round ≤ r, in (round, op ID) order.
- **Snapshots**: a snapshot (state hash, frontier, op count) is certified when more than 2/3 of
  the current members signed the same one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import unpack

from .facts import Facts
from .genesis import Genesis

NEVER = -1


def is_quorum(signers: int, electorate: int) -> bool:
    """More than two thirds, in integers (no float rounding at the boundary)."""
    return electorate > 0 and 3 * signers > 2 * electorate


@dataclass(frozen=True)
class Checkpoint:
    round: int
    id: bytes
    size: int
    attestations: int


@dataclass(frozen=True)
class Snapshot:
    state: bytes
    frontier: tuple[bytes, ...]
    ops: int
    signers: int


@dataclass(frozen=True)
class RunState:
    ops: int
    members: tuple[bytes, ...]
    banned: tuple[bytes, ...]
    rounds: tuple[tuple[int, bytes], ...]  # certified (round, hash), from round 1 up
    checkpoints: tuple[Checkpoint, ...]  # the canonical one per round, oldest first
    hparams: dict[str, Any]  # in effect for the round being trained (certified round + 1)
    hparam_schedule: tuple[tuple[int, dict[str, Any]], ...]
    snapshot: Snapshot | None
    eligible: dict[int, int] = field(default_factory=dict, compare=False)  # round -> electorate size

    @property
    def round(self) -> int:
        """The newest certified round; 0 before any."""
        return self.rounds[-1][0] if self.rounds else 0

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly summary (bytes as hex), for RPC and the CLI."""
        return {
            "ops": self.ops,
            "round": self.round,
            "members": [m.hex() for m in self.members],
            "banned": [b.hex() for b in self.banned],
            "rounds": [{"round": r, "hash": h.hex()} for r, h in self.rounds],
            "checkpoint": _checkpoint_json(self.checkpoint),
            "hparams": self.hparams,
            "snapshot": None
            if self.snapshot is None
            else {"state": self.snapshot.state.hex(), "ops": self.snapshot.ops, "signers": self.snapshot.signers},
        }


def derive(facts: Facts, genesis: Genesis) -> RunState:
    """The run state the facts describe under the genesis rules."""
    banned = _banned(facts)
    joined, left = _newest(facts.joins, banned), _newest(facts.leaves, banned)
    members = sorted(a for a, join in joined.items() if join[0] > left.get(a, (NEVER, 0))[0])
    rounds, electorates = _certified_rounds(facts, banned, joined, left)
    certified = rounds[-1][0] if rounds else 0
    schedule = _hparam_schedule(facts, banned)
    return RunState(
        ops=len(facts.ops),
        members=tuple(members),
        banned=tuple(sorted(banned)),
        rounds=tuple(rounds),
        checkpoints=_canonical_checkpoints(facts, banned, set(joined), certified),
        hparams=_hparams_at(genesis.hparams, schedule, certified + 1),
        hparam_schedule=tuple(schedule),
        snapshot=_certified_snapshot(facts, set(members)),
        eligible=electorates,
    )


def _banned(facts: Facts) -> set[bytes]:
    voted: dict[tuple[bytes, int], bytes] = {}
    double_voters = set()
    for author, round_, hash_ in facts.votes:
        if voted.setdefault((author, round_), hash_) != hash_:
            double_voters.add(author)
    return facts.convicted | facts.forked | double_voters


def _newest(rows: set[tuple[bytes, int, int]], banned: set[bytes]) -> dict[bytes, tuple[int, int]]:
    """author -> (seq, round) of its newest row by seq (ties, only possible in a fork: larger round)."""
    newest: dict[bytes, tuple[int, int]] = {}
    for author, seq, round_ in rows:
        if author not in banned and (seq, round_) > newest.get(author, (NEVER, 0)):
            newest[author] = (seq, round_)
    return newest


def _eligible(round_: int, joined: dict, left: dict) -> set[bytes]:
    electorate = set()
    for author, (join_seq, first) in joined.items():
        leave_seq, last = left.get(author, (NEVER, 0))
        if first <= round_ and (leave_seq < join_seq or last >= round_):
            electorate.add(author)
    return electorate


def _certified_rounds(facts: Facts, banned: set[bytes], joined: dict, left: dict):
    ballots: dict[int, dict[bytes, set[bytes]]] = defaultdict(lambda: defaultdict(set))
    for author, round_, hash_ in facts.votes:
        if author not in banned:
            ballots[round_][hash_].add(author)
    rounds, electorates = [], {}
    round_ = 1
    while round_ in ballots:
        electorate = _eligible(round_, joined, left)
        electorates[round_] = len(electorate)
        winners = [h for h, voters in ballots[round_].items() if is_quorum(len(voters & electorate), len(electorate))]
        if not winners:
            break
        rounds.append((round_, winners[0]))  # a quorum of single-vote authors is unique
        round_ += 1
    return rounds, electorates


def _canonical_checkpoints(facts: Facts, banned: set[bytes], ever_joined: set[bytes], certified: int):
    attesters: dict[tuple[int, bytes, int], set[bytes]] = defaultdict(set)
    for author, round_, ckpt_id, size in facts.attests:
        if author not in banned and author in ever_joined and round_ <= certified:
            attesters[(round_, ckpt_id, size)].add(author)
    best: dict[int, Checkpoint] = {}
    for (round_, ckpt_id, size), who in attesters.items():
        candidate = Checkpoint(round_, ckpt_id, size, len(who))
        current = best.get(round_)
        if current is None or _rank(candidate) < _rank(current):
            best[round_] = candidate
    return tuple(best[r] for r in sorted(best))


def _rank(checkpoint: Checkpoint) -> tuple:
    return (-checkpoint.attestations, checkpoint.id, checkpoint.size)


def _hparam_schedule(facts: Facts, banned: set[bytes]) -> list[tuple[int, dict[str, Any]]]:
    rows = sorted((round_, op_id, changes) for round_, op_id, author, changes in facts.hparams if author not in banned)
    return [(round_, unpack(changes, max_size=len(changes))) for round_, _op, changes in rows]


def _hparams_at(initial: dict[str, Any], schedule: list[tuple[int, dict]], round_: int) -> dict[str, Any]:
    values = dict(initial)
    for effective, changes in schedule:
        if effective <= round_:
            values.update(changes)
    return values


def _certified_snapshot(facts: Facts, members: set[bytes]) -> Snapshot | None:
    signers: dict[tuple, set[bytes]] = defaultdict(set)
    for author, state, frontier, ops in facts.snapshots:
        if author in members:
            signers[(ops, state, frontier)].add(author)
    certified = [key for key, who in signers.items() if is_quorum(len(who), len(members))]
    if not certified:
        return None
    ops, state, frontier = max(certified)
    return Snapshot(state, frontier, ops, len(signers[(ops, state, frontier)]))


def _checkpoint_json(checkpoint: Checkpoint | None) -> dict | None:
    if checkpoint is None:
        return None
    return {"round": checkpoint.round, "id": checkpoint.id.hex(), "size": checkpoint.size,
            "attestations": checkpoint.attestations}
