"""What the run state says: members, bans, certified rounds, checkpoints, hyperparameters.

Everything here is a pure function of the facts (facts.py), so of the op set. The rules:

- **Bans**: an author is banned when the set proves it equivocated: two of its ops share a
  `seq` (a fork), two of its votes name different hashes for one round, two of its payload
  commitments (or two proposals) for one round differ, or an evidence op convicts it (evidence.py). A banned
  author's ops stay in the DAG (others' ops point at them) but count for nothing below.
- **Membership** (add-wins per author): an author's own join and leave ops form one chain, so
  its newest one by `seq` decides; it is a member when that is a join. Concurrent join/leave by
  one author can only come from a fork, and a fork is a ban. Only admitted authors can write at
  all (genesis.py).
- **Eligibility for round r**: a join names the first round its author trains in, a leave the
  last. Author a is eligible for r when its newest join names a round ≤ r and, if it left after
  that join, its leave names a round ≥ r, and it is *active*: its join names one of the last
  ACTIVITY_WINDOW rounds (r included), or it committed or voted in one of the ACTIVITY_WINDOW
  rounds before r. A member that crashed (or stopped without leaving) thus stops counting
  against the quorum after ACTIVITY_WINDOW rounds; without that, crashes would pile up in the
  electorate until a third of it was gone and no round could be certified again. A live member
  that lapsed (it only synced for that long) joins again (`has_lapsed`). Honest nodes name
  (certified round + 1) when joining.
- **Rounds**: round r is certified with hash h when round r-1 is certified (round 0 is the
  genesis) and more than 2/3 of the authors eligible for r voted (r, h). So the round number
  moves one step per quorum: a single peer cannot push it ahead, its votes for far rounds
  count for nothing. Known limit: a late join that names an old round enlarges that round's
  electorate and can take back its certificate; honest nodes never do that and a full
  causal-past rule would cost a walk of the DAG per certificate. The same holds, briefly, for a
  replica that receives a commit or vote of an old round only after a later round's certificate.
- **Commitments**: a `commit` op binds its author to one payload (SHA-256, size) for a round.
  `round_commits` lists, for one round, the commitments of unbanned authors eligible for it;
  like `round_votes` it reads the facts' per-round index, so the round protocol can ask on
  every poll. A `propose` op names the commitments a round aggregates (`round_proposals`); the
  round protocol decides whose proposal counts (node/round_machine.py).
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
ACTIVITY_WINDOW = 2  # rounds a member stays eligible without a commit or a vote (module docstring)


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
    joined, left = _unbanned(facts.newest_join, banned), _unbanned(facts.newest_leave, banned)
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


def is_banned(facts: Facts, author: bytes) -> bool:
    return author in facts.forked or author in facts.equivocated or author in facts.convicted


def is_eligible(facts: Facts, author: bytes, round_: int) -> bool:
    """May `author` take part in round `round_` (see the module docstring)? Bans not considered."""
    join = facts.newest_join.get(author)
    return join is not None and _eligible_with(facts, author, join, facts.newest_leave.get(author, (NEVER, 0)), round_)


def has_lapsed(facts: Facts, author: bytes, round_: int) -> bool:
    """Is `author` a member whose join names a round ≤ `round_` but who is not eligible for
    `round_` only because it was not active? Such a member must join again to take part."""
    join = facts.newest_join.get(author)
    if join is None:
        return False
    return _joined_for(join, facts.newest_leave.get(author, (NEVER, 0)), round_) and not _active(facts, author, join, round_)


def electorate(facts: Facts, round_: int) -> set[bytes]:
    """The unbanned authors eligible for `round_`."""
    return {a for a in facts.newest_join if not is_banned(facts, a) and is_eligible(facts, a, round_)}


def round_votes(facts: Facts, round_: int) -> dict[bytes, bytes]:
    """author -> voted hash, for the unbanned authors eligible for `round_` that voted in it."""
    return {a: _only(hashes) for a, hashes in facts.votes_in(round_).items() if _counts(facts, a, round_)}


def round_commits(facts: Facts, round_: int) -> dict[bytes, tuple[bytes, int]]:
    """author -> (payload hash, size), for the unbanned authors eligible for `round_` that committed."""
    return {a: _only(said) for a, said in facts.commits_in(round_).items() if _counts(facts, a, round_)}


def round_proposals(facts: Facts, round_: int) -> dict[bytes, tuple[bytes, ...]]:
    """author -> the contributor set it proposed, for the unbanned authors eligible for `round_`."""
    return {a: _only(said) for a, said in facts.proposals_in(round_).items() if _counts(facts, a, round_)}


def _counts(facts: Facts, author: bytes, round_: int) -> bool:
    return not is_banned(facts, author) and is_eligible(facts, author, round_)


def _only(values: set):
    # An author with two values for one round is banned, so a counted author has exactly one.
    (value,) = values
    return value


def _banned(facts: Facts) -> set[bytes]:
    return facts.convicted | facts.forked | facts.equivocated


def _unbanned(newest: dict[bytes, tuple[int, int]], banned: set[bytes]) -> dict[bytes, tuple[int, int]]:
    return {author: row for author, row in newest.items() if author not in banned}


def _eligible_with(facts: Facts, author: bytes, join: tuple[int, int], leave: tuple[int, int], round_: int) -> bool:
    return _joined_for(join, leave, round_) and _active(facts, author, join, round_)


def _joined_for(join: tuple[int, int], leave: tuple[int, int], round_: int) -> bool:
    """Do the newest join and leave, (seq, round) each, make their author a member in `round_`?"""
    (join_seq, first), (leave_seq, last) = join, leave
    return first <= round_ and (leave_seq < join_seq or last >= round_)


def _active(facts: Facts, author: bytes, join: tuple[int, int], round_: int) -> bool:
    """Joined for one of the last ACTIVITY_WINDOW rounds, or committed or voted in one before `round_`."""
    if round_ - join[1] < ACTIVITY_WINDOW:
        return True
    earlier = range(round_ - ACTIVITY_WINDOW, round_)
    return any(author in facts.commits_in(r) or author in facts.votes_in(r) for r in earlier)


def _eligible(facts: Facts, round_: int, joined: dict, left: dict) -> set[bytes]:
    return {a for a, join in joined.items() if _eligible_with(facts, a, join, left.get(a, (NEVER, 0)), round_)}


def _certified_rounds(facts: Facts, banned: set[bytes], joined: dict, left: dict):
    rounds, electorates = [], {}
    round_ = 1
    while ballots := _ballots(facts, round_, banned):  # rounds up to the first gap, not all votes
        electorate = _eligible(facts, round_, joined, left)
        electorates[round_] = len(electorate)
        winners = [h for h, voters in ballots.items() if is_quorum(len(voters & electorate), len(electorate))]
        if not winners:
            break
        rounds.append((round_, winners[0]))  # a quorum of single-vote authors is unique
        round_ += 1
    return rounds, electorates


def _ballots(facts: Facts, round_: int, banned: set[bytes]) -> dict[bytes, set[bytes]]:
    """hash -> the unbanned authors who voted for it in `round_`."""
    ballots: dict[bytes, set[bytes]] = defaultdict(set)
    for author, hashes in facts.votes_in(round_).items():
        if author not in banned:
            ballots[_only(hashes)].add(author)
    return ballots


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
