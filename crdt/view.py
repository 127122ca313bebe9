"""What the run state says, in one summary: members, the electorate, bans, certified rounds,
checkpoints, hyperparameters, epochs, who is earning a say.

The certified history itself is crdt/chain.py's, built as ops arrive; `derive` reads it and the
facts into a `RunState` (a value: a caller keeps it while the replica moves on). The rules here:

- **Checkpoints**: a `checkpoint` op announces (round, id, size) and counts as its author's
  attestation; `attest` ops add more. Only members whose precommit names a round's certified
  (value, state) attest its state (they computed it; a key that merely joined, or a member that
  precommitted another state, has no say). For each certified round the canonical checkpoint is
  the most attested, ties broken by the smaller ID; `checkpoint_candidates` ranks all of them, for
  a peer that must try the next when one does not hold the certified state.
- **Hyperparameters**: changes come only from keys named at genesis (checked per op); each names
  the round it takes effect. The value for round r is the genesis value overlaid by the changes
  with round <= r, in (round, op ID) order.
- **Bans**: the keys banned by certified values (crdt/membership.py), and those the facts prove
  equivocated (banned once a value names the proof).
- **Snapshots**: a snapshot (state hash, frontier, op count) is certified when more than 2/3 of
  the tip's electorate signed the same one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import unpack

from .chain import Certificate, Chain
from .facts import Facts
from .genesis import Genesis
from .quorum import is_quorum


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
    members: tuple[bytes, ...]  # the roster of the round under way: who may take part
    electorate: tuple[bytes, ...]  # its electorate: who proposes and votes
    banned: tuple[bytes, ...]
    rounds: tuple[tuple[int, bytes], ...]  # certified (round, state hash), from round 1 up
    checkpoint: Checkpoint | None  # the canonical checkpoint of the newest round that has one
    hparams: dict[str, Any]  # in effect for the round being trained (certified round + 1)
    hparam_schedule: tuple[tuple[int, dict[str, Any]], ...]
    snapshot: Snapshot | None
    epoch: int = 0
    certificates: dict[int, Certificate] = field(default_factory=dict, compare=False)
    earning: dict[bytes, int] = field(default_factory=dict, compare=False)  # fresh key -> rounds it still needs

    @property
    def round(self) -> int:
        """The newest certified round; 0 before any."""
        return self.rounds[-1][0] if self.rounds else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly summary (bytes as hex), for RPC and the CLI."""
        return {
            "ops": self.ops,
            "round": self.round,
            "epoch": self.epoch,
            "members": [m.hex() for m in self.members],
            "electorate": [m.hex() for m in self.electorate],
            "banned": [b.hex() for b in self.banned],
            "rounds": [{"round": r, "hash": h.hex()} for r, h in self.rounds],
            "checkpoint": _checkpoint_json(self.checkpoint),
            "hparams": self.hparams,
            "earning": {key.hex(): rounds for key, rounds in self.earning.items()},
            "snapshot": None
            if self.snapshot is None
            else {"state": self.snapshot.state.hex(), "ops": self.snapshot.ops, "signers": self.snapshot.signers},
        }


def derive(chain: Chain, facts: Facts, genesis: Genesis) -> RunState:
    """The run state that the chain and the facts describe."""
    tip = chain.tip.membership
    banned = set(tip.banned) | facts.forked | facts.equivocated | facts.convicted
    schedule = _hparam_schedule(facts, banned)
    rounds = tuple((r, chain.certificates[r].state) for r in range(1, chain.tip.round))
    return RunState(
        ops=len(facts.ops),
        members=tuple(sorted(tip.roster)),
        electorate=tuple(sorted(chain.tip.electorate)),
        banned=tuple(sorted(banned)),
        rounds=rounds,
        checkpoint=_newest_checkpoint(chain, facts),
        hparams=_hparams_at(genesis.hparams, schedule, chain.round + 1),
        hparam_schedule=tuple(schedule),
        snapshot=_certified_snapshot(facts, chain.tip.electorate),
        epoch=chain.tip.epoch.number,
        certificates=chain.certificates,
        earning=tip.earning(genesis),
    )


def checkpoint_candidates(chain: Chain, facts: Facts, round_: int) -> tuple[Checkpoint, ...]:
    """Every checkpoint of certified round `round_` that members who computed its state attested,
    most attested first (ties: the smaller ID)."""
    if round_ not in chain.certificates:
        return ()
    voters = chain.voters(round_)
    attesters: dict[tuple[bytes, int], set[bytes]] = defaultdict(set)
    for author, attested, checkpoint, size in facts.attests:
        if attested == round_ and author in voters:
            attesters[(checkpoint, size)].add(author)
    ranked = [Checkpoint(round_, checkpoint, size, len(who)) for (checkpoint, size), who in attesters.items()]
    return tuple(sorted(ranked, key=lambda c: (-c.attestations, c.id, c.size)))


def _newest_checkpoint(chain: Chain, facts: Facts) -> Checkpoint | None:
    rounds = sorted({row[1] for row in facts.attests if row[1] in chain.certificates}, reverse=True)
    for round_ in rounds:
        candidates = checkpoint_candidates(chain, facts, round_)
        if candidates:
            return candidates[0]
    return None


def _hparam_schedule(facts: Facts, banned: set[bytes]) -> list[tuple[int, dict[str, Any]]]:
    rows = sorted((round_, op_id, changes) for round_, op_id, author, changes in facts.rows["hparams"]
                  if author not in banned)
    return [(round_, unpack(changes, max_size=len(changes))) for round_, _op, changes in rows]


def _hparams_at(initial: dict[str, Any], schedule: list[tuple[int, dict]], round_: int) -> dict[str, Any]:
    values = dict(initial)
    for effective, changes in schedule:
        if effective <= round_:
            values.update(changes)
    return values


def _certified_snapshot(facts: Facts, electorate: frozenset[bytes]) -> Snapshot | None:
    signers: dict[tuple, set[bytes]] = defaultdict(set)
    for author, state, frontier, ops in facts.rows["snapshot"]:
        if author in electorate:
            signers[(ops, state, frontier)].add(author)
    certified = [key for key, who in signers.items() if is_quorum(len(who), len(electorate))]
    if not certified:
        return None
    ops, state, frontier = max(certified)
    return Snapshot(state, frontier, ops, len(signers[(ops, state, frontier)]))


def _checkpoint_json(checkpoint: Checkpoint | None) -> dict | None:
    if checkpoint is None:
        return None
    return {"round": checkpoint.round, "id": checkpoint.id.hex(), "size": checkpoint.size,
            "attestations": checkpoint.attestations}
