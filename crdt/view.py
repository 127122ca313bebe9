"""What the run state says: members, bans, certified rounds, checkpoints, hyperparameters.

Everything here is a pure function of the facts (facts.py), so of the op set. The rules:

- **Bans**: an author is banned when the set proves it equivocated: two of its ops share a
  `seq` (a fork), two of its votes for one attempt of a round differ, two of its payload commitments (or
  two proposals) for one round differ, two of its shard results for one shard of one
  contributor set of a round differ, or an evidence op convicts it (evidence.py); or when
  disputes of a shard result it signed come from more than a third of the round's electorate
  (`dispute_bans`). A banned author's ops stay in the DAG (others' ops point at them) but
  count for nothing below.
- **Membership** (add-wins per author): an author's own join and leave ops form one chain, so
  its newest one by `seq` decides; it is a member when that is a join. Concurrent join/leave by
  one author can only come from a fork, and a fork is a ban. Only admitted authors can write at
  all (genesis.py).
- **Who weighs in a round** (contributors, the electorate, its attempts, the certificate):
  electorate.py. Honest nodes name (certified round + 1) when joining.
- **Rounds**: round r is certified with hash h when round r-1 is certified (round 0 is the
  genesis) and, in one of r's attempts, more than 2/3 of that attempt's electorate have a
  standing vote for (r, h).
  So the round number moves one step per quorum: a single peer cannot push it ahead, its votes
  for far rounds count for nothing. Known limit: a late join that names an old round enlarges
  that round's electorate and can take back its certificate; honest nodes never do that and a
  full causal-past rule would cost a walk of the DAG per certificate. The same holds, briefly,
  for a replica that receives a commit or vote of an old round only after a later round's
  certificate.
- **Commitments**: a `commit` op binds its author to one payload (its checkpoint ID: SHA-256
  of the payload's manifest, and the payload's size) for a round. `round_commits` lists, for
  one round, the commitments of its contributors; like `round_votes` it reads the facts'
  per-round index, so the round protocol can ask on every poll. A `propose` op names the
  commitments a round aggregates (`round_proposals`); the round protocol decides whose proposal
  counts (node/rounds/machine.py).
- **Checkpoints**: a `checkpoint` op announces (round, id, size) and counts as its author's
  attestation; `attest` ops add more. Only the voters of a round's certificate attest its state
  (they computed it; a key that merely joined, or a member that did not vote that hash, has no
  say). For each certified round the canonical checkpoint is the most attested, ties broken by
  the smaller ID; `checkpoint_candidates` ranks all of them, for a peer that must try the next
  when one does not hold the certified state. The current checkpoint is the canonical one of
  the newest such round.
- **Hyperparameters**: changes come only from keys named at genesis (checked per op); each names
  the round it takes effect. The value for round r is the genesis value overlaid by the changes
  with round ≤ r, in (round, op ID) order.
- **Contribution scores**: scores.py (a committee's signed reports, their median per contribution).
- **Snapshots**: a snapshot (state hash, frontier, op count) is certified when more than 2/3 of
  the current members signed the same one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import unpack

from .electorate import (  # noqa: F401 - re-exported: the view's questions are asked through here
    ACTIVITY_WINDOW, NEVER, Attempt, Certificate, banned, certify, contributors, first_electorate,
    has_lapsed, is_banned, is_eligible, is_more_than_a_third, is_quorum, round_history,
)
from .facts import Facts
from .genesis import Genesis


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
    certificates: dict[int, Certificate] = field(default_factory=dict, compare=False)
    earned: frozenset[bytes] = frozenset()  # authors a certified round accepted a contribution of
    # member -> the (round, contributor set, shard) whose disputes ban it (`dispute_bans`); these
    # are in `banned` too
    disputed: dict[bytes, tuple[int, bytes, int]] = field(default_factory=dict, compare=False)

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
    certificates, sizes = _certified_rounds(facts, genesis)
    disputed = dispute_bans(facts, genesis, certificates)
    if disputed:  # judged on the view without them (dispute_bans), they then take effect as any ban
        certificates, sizes = _certified_rounds(facts, genesis, frozenset(disputed))
    excluded = banned(facts, disputed)
    joined, left = _unbanned(facts.newest_join, excluded), _unbanned(facts.newest_leave, excluded)
    members = sorted(a for a, join in joined.items() if join[0] > left.get(a, (NEVER, 0))[0])
    certified = max(certificates, default=0)
    schedule = _hparam_schedule(facts, excluded)
    return RunState(
        ops=len(facts.ops),
        members=tuple(members),
        banned=tuple(sorted(excluded)),
        rounds=tuple((r, certificates[r].hash) for r in sorted(certificates)),
        checkpoints=tuple(ranked[0] for ranked in _ranked_checkpoints(facts, excluded, certificates).values()),
        hparams=_hparams_at(genesis.hparams, schedule, certified + 1),
        hparam_schedule=tuple(schedule),
        snapshot=_certified_snapshot(facts, set(members)),
        eligible=sizes,
        certificates=certificates,
        earned=frozenset().union(*(c.accepted for c in certificates.values())),
        disputed=disputed,
    )


def dispute_bans(facts: Facts, genesis: Genesis,
                 certificates: dict[int, Certificate]) -> dict[bytes, tuple[int, bytes, int]]:
    """Member -> the first (round, contributor set, shard) in which disputes ban it: for some
    (round, set, shard, hash) it signed a shard result with that hash, and the authors of
    disputes naming it, that (round, set, shard) and that hash number more than a third of the
    round's electorate (counting only its members). A dispute of a result the member never
    signed proves nothing, and neither does one naming another set than the result's: each set
    is its own aggregate. Members the facts ban already are left out (`ban_reason` names the
    self-verifying ban first).

    The electorate is attempt 0's (`round_attempts(...)[0]`) in the view *without* any dispute
    ban: `certificates` must be those `_certified_rounds` derives with none. Why not the final
    view: the verdicts shrink the electorates (a disputed member weighs in no round), so an
    electorate that depended on them would be circular, and a verdict could undo itself or
    another. Judged once against the view the self-verifying bans give, each verdict is a pure
    function of the op set, like every other ban; `derive` then applies them everywhere a ban
    applies. Here and not in electorate.py because the electorate of a round needs the
    certificates before it (earned influence), which only the view derives.
    """
    verdicts: dict[bytes, tuple[int, bytes, int]] = {}
    excluded = banned(facts)
    earned: frozenset[bytes] | None = None  # of every certified round: the electorate of an uncertified one
    for round_ in facts.disputed_rounds():
        if round_ in certificates:
            electorate = certificates[round_].attempts[0]
        else:  # past the certified ones (certificates run from round 1 with no gap)
            if earned is None:
                earned = frozenset().union(*(c.accepted for c in certificates.values()))
            electorate = first_electorate(facts, genesis, round_, earned)
        for set_id in facts.disputed_sets(round_):
            results = facts.shard_results_in(round_, set_id)
            for (member, shard, hash_), authors in sorted(facts.disputes_in(round_, set_id).items()):
                if member in verdicts or member in excluded or hash_ not in results.get(shard, {}).get(member, ()):
                    continue
                if is_more_than_a_third(len(authors & electorate), len(electorate)):
                    verdicts[member] = (round_, set_id, shard)
    return verdicts


def round_attempts(facts: Facts, genesis: Genesis, state: RunState, round_: int) -> list[frozenset[bytes]]:
    """The electorates of `round_`'s attempts so far (for a certified round: up to the one that
    certified it)."""
    certificate = state.certificates.get(round_)
    if certificate is not None:
        return list(certificate.attempts)
    return [attempt.electorate for attempt in uncertified_history(facts, genesis, state, round_)]


def uncertified_history(facts: Facts, genesis: Genesis, state: RunState, round_: int) -> list[Attempt]:
    """The attempts of `round_`, a round past the newest certified one, so far (electorate.py)."""
    return round_history(facts, round_, first_electorate(facts, genesis, round_, state.earned, state.disputed))


def electorate(facts: Facts, genesis: Genesis, state: RunState, round_: int) -> frozenset[bytes]:
    """Who votes, proposes and stores the state in `round_` now: its latest attempt's electorate."""
    return round_attempts(facts, genesis, state, round_)[-1]


def round_votes(history: list[Attempt]) -> dict[bytes, bytes]:
    """author -> the hash of its vote that stands in the latest of the attempts `history`."""
    return {author: hash_ for author, (hash_, _proposer) in history[-1].standing.items()}


def round_commits(facts: Facts, round_: int, disputed: Collection[bytes] = ()) -> dict[bytes, tuple[bytes, int]]:
    """author -> (payload ID, size), for the contributors of `round_` that committed (`disputed`:
    `RunState.disputed`, banned too)."""
    return {a: _only(said) for a, said in facts.commits_in(round_).items() if _counts(facts, a, round_, disputed)}


def round_proposals(facts: Facts, round_: int, disputed: Collection[bytes] = ()) -> dict[bytes, tuple[bytes, ...]]:
    """author -> the contributor set it proposed, for the contributors of `round_`."""
    return {a: _only(said) for a, said in facts.proposals_in(round_).items() if _counts(facts, a, round_, disputed)}


def checkpoint_candidates(facts: Facts, state: RunState, round_: int) -> tuple[Checkpoint, ...]:
    """Every checkpoint of certified round `round_` that its certificate's voters attested, most
    attested first (ties: the smaller ID)."""
    return _ranked_checkpoints(facts, set(state.banned), state.certificates, only=round_).get(round_, ())


def _counts(facts: Facts, author: bytes, round_: int, disputed: Collection[bytes]) -> bool:
    return not is_banned(facts, author, disputed) and is_eligible(facts, author, round_)


def _only(values: set):
    # An author with two values for one round is banned, so a counted author has exactly one.
    (value,) = values
    return value


def _unbanned(newest: dict[bytes, tuple[int, int]], excluded: set[bytes]) -> dict[bytes, tuple[int, int]]:
    return {author: row for author, row in newest.items() if author not in excluded}


def _certified_rounds(facts: Facts, genesis: Genesis, disputed: frozenset[bytes] = frozenset()):
    """round -> Certificate up to the first uncertified round, and round -> electorate size, with
    the members in `disputed` banned as well."""
    certificates: dict[int, Certificate] = {}
    sizes: dict[int, int] = {}
    earned: frozenset[bytes] = frozenset()
    round_ = 1
    while facts.votes_in(round_):  # rounds up to the first gap, not all votes
        history = round_history(facts, round_, first_electorate(facts, genesis, round_, earned, disputed))
        certificate = certify(facts, round_, history)
        sizes[round_] = len(history[-1].electorate if certificate is None else certificate.electorate)
        if certificate is None:
            break
        certificates[round_] = certificate
        earned |= certificate.accepted
        round_ += 1
    return certificates, sizes


def _ranked_checkpoints(facts: Facts, excluded: set[bytes], certificates: dict[int, Certificate],
                        only: int | None = None) -> dict[int, tuple[Checkpoint, ...]]:
    """round -> its attested checkpoints, best first, for the certified rounds (or round `only`)."""
    attesters: dict[tuple[int, bytes, int], set[bytes]] = defaultdict(set)
    for author, round_, ckpt_id, size in facts.attests:
        if only not in (None, round_) or author in excluded or round_ not in certificates:
            continue
        if author in certificates[round_].voters:
            attesters[(round_, ckpt_id, size)].add(author)
    ranked: dict[int, list[Checkpoint]] = defaultdict(list)
    for (round_, ckpt_id, size), who in attesters.items():
        ranked[round_].append(Checkpoint(round_, ckpt_id, size, len(who)))
    return {r: tuple(sorted(ranked[r], key=_rank)) for r in sorted(ranked)}


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
