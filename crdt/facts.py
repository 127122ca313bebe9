"""The run state's facts: what the ops say, kept as sets that only grow.

Every op adds facts; no fact is ever removed or overwritten. Adding is set union (and the op
index is keyed by op ID), so the facts are a pure function of the op SET: any order of delivery,
any topological order, duplicates included, gives the same facts. Everything a user sees
(members, rounds, checkpoints, bans) is derived from the facts afterwards, in `view.py`; that
is where bans take effect, so an op by an author banned later keeps its place in the DAG while
its effects are dropped.

Beside the sets, `Facts` keeps a few indexes, each a pure function of the sets and updated as
rows are added, so the questions asked on every poll cost no scan of the whole log: votes and
commits (and scores, shard results and disputes) by round, each author's newest join and leave,
and the authors who contradicted themselves (two votes, two commitments, two proposals or two
scores for one round, two shard results for one shard of one contributor set of a round).

The facts are also what a snapshot carries: `encode` gives their one canonical form, its
SHA-256 is the state hash that a quorum signs, and the facts of the ops covered by a snapshot
plus the facts of the ops after it are the facts of a full replay (union is associative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol.kinds import MAX_PAYLOAD_SIZE, MAX_PROPOSAL, MAX_SCORE, MAX_SHARDS
from locomesh.protocol.schema import Bytes, Int, List, Map, Scalar, Spec, Struct

from .ops import Op, OpId

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024

_ROWS = 2**24


@dataclass(frozen=True)
class _Row(Spec):
    """A list of fixed length whose items each have their own spec (a table row)."""

    columns: tuple[Spec, ...]

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, list) or len(value) != len(self.columns):
            raise ProtocolError("bad-field", f"{path}: expected a row of {len(self.columns)} items")
        for index, (item, spec) in enumerate(zip(value, self.columns)):
            spec.check(item, f"{path}[{index}]")


def _table(*columns: Spec) -> List:
    return List(_Row(columns), max_len=_ROWS)


_hash, _int, _shard = Bytes(32, 32), Int(0, 2**50), Int(0, MAX_SHARDS - 1)
_FACTS_SCHEMA = Struct(
    {
        "ops": _table(_hash, _hash, Int(1, 2**40), _int),
        "joins": _table(_hash, Int(1, 2**40), _int),
        "leaves": _table(_hash, Int(1, 2**40), _int),
        "votes": _table(_hash, _int, _hash, Bytes(0, 32), Int(0, 63)),
        "commits": _table(_hash, Int(1, 2**40), _hash, Int(1, MAX_PAYLOAD_SIZE)),
        "proposals": _table(_hash, Int(1, 2**40), List(_hash, max_len=MAX_PROPOSAL, min_len=1)),
        "attests": _table(_hash, _int, _hash, _int),
        "hparams": _table(_int, _hash, _hash, Bytes(1, 64 * 1024)),
        "convicted": List(_hash, max_len=_ROWS),
        "snapshots": _table(_hash, _hash, List(_hash, max_len=64, min_len=1), _int),
        "timeouts": _table(_hash, _int, _int),
        "scores": _table(_hash, Int(1, 2**40), List(_hash, max_len=MAX_PROPOSAL, min_len=1),
                         List(Int(-MAX_SCORE, MAX_SCORE), max_len=MAX_PROPOSAL, min_len=1)),
        "shard_results": _table(_hash, Int(1, 2**40), _hash, _shard, _hash),
        "disputes": _table(_hash, Int(1, 2**40), _hash, _shard, _hash, _hash),
    },
    # Each written only when there are such rows, so the facts (and state hash) of a run without
    # any are what they were before these op kinds existed.
    optional=frozenset({"scores", "shard_results", "disputes"}),
)


@dataclass
class Facts:
    ops: dict[OpId, tuple[bytes, int, int]] = field(default_factory=dict)  # id -> (author, seq, depth)
    joins: set[tuple[bytes, int, int]] = field(default_factory=set)  # (author, seq, round)
    leaves: set[tuple[bytes, int, int]] = field(default_factory=set)  # (author, seq, round)
    # (author, round, hash, proposer or b"", attempt)
    votes: set[tuple[bytes, int, bytes, bytes, int]] = field(default_factory=set)
    commits: set[tuple[bytes, int, bytes, int]] = field(default_factory=set)  # (author, round, hash, size)
    proposals: set[tuple[bytes, int, tuple[bytes, ...]]] = field(default_factory=set)  # (author, round, authors)
    attests: set[tuple[bytes, int, bytes, int]] = field(default_factory=set)  # (author, round, id, size)
    hparams: set[tuple[int, OpId, bytes, bytes]] = field(default_factory=set)  # (round, op, author, packed changes)
    convicted: set[bytes] = field(default_factory=set)  # authors convicted by evidence ops
    # (author, state hash, frontier, op count)
    snapshots: set[tuple[bytes, bytes, tuple[OpId, ...], int]] = field(default_factory=set)
    timeouts: set[tuple[bytes, int, int]] = field(default_factory=set)  # (author, round, attempt)
    # (author, round, scored authors, their scores in SCORE_UNIT units)
    scores: set[tuple[bytes, int, tuple[bytes, ...], tuple[int, ...]]] = field(default_factory=set)
    # (author, round, contributor set, shard, hash)
    shard_results: set[tuple[bytes, int, bytes, int, bytes]] = field(default_factory=set)
    # (author, round, contributor set, shard, member whose signed result it disputes, that result's hash)
    disputes: set[tuple[bytes, int, bytes, int, bytes, bytes]] = field(default_factory=set)
    # Derived indexes, kept incrementally (see the module docstring).
    _chain: dict[tuple[bytes, int], OpId] = field(default_factory=dict, repr=False)
    forked: set[bytes] = field(default_factory=set)  # two ops at one (author, seq)
    # Two different votes for one attempt of a round; two commitments, proposals or score reports
    # for one round; two shard results for one shard of one contributor set of a round.
    equivocated: set[bytes] = field(default_factory=set)
    newest_join: dict[bytes, tuple[int, int]] = field(default_factory=dict, repr=False)  # author -> (seq, round)
    newest_leave: dict[bytes, tuple[int, int]] = field(default_factory=dict, repr=False)
    joins_of: dict[bytes, set[tuple[int, int]]] = field(default_factory=dict, repr=False)  # author -> its (seq, round)s
    leaves_of: dict[bytes, set[tuple[int, int]]] = field(default_factory=dict, repr=False)
    _votes_by_round: dict[int, dict[bytes, set[tuple[int, bytes, bytes]]]] = field(default_factory=dict, repr=False)
    _timeouts_by_round: dict[int, dict[bytes, set[int]]] = field(default_factory=dict, repr=False)
    _commits_by_round: dict[int, dict[bytes, set[tuple[bytes, int]]]] = field(default_factory=dict, repr=False)
    _proposals_by_round: dict[int, dict[bytes, set[tuple[bytes, ...]]]] = field(default_factory=dict, repr=False)
    _scores_by_round: dict[int, dict[bytes, set[tuple[tuple[bytes, ...], tuple[int, ...]]]]] = field(
        default_factory=dict, repr=False)
    # round -> set -> shard -> author -> hashes; round -> set -> (member, shard, hash) -> authors
    _results_by_round: dict[int, dict[bytes, dict[int, dict[bytes, set[bytes]]]]] = field(default_factory=dict,
                                                                                         repr=False)
    _disputes_by_round: dict[int, dict[bytes, dict[tuple[bytes, int, bytes], set[bytes]]]] = field(
        default_factory=dict, repr=False)

    def add(self, op: Op, depth: int, convicts: bytes | None = None) -> None:
        """Add the facts of one op; `convicts` is the author its (verified) evidence convicts."""
        self._index(op.id, op.author, op.seq, depth)
        body, author = op.body, op.author
        match op.type:
            case "join":
                self._add_join((author, op.seq, body["round"]))
            case "leave":
                self._add_leave((author, op.seq, body["round"]))
            case "vote":
                self._add_vote((author, body["round"], body["hash"], body.get("proposer", b""), body.get("attempt", 0)))
            case "timeout":
                self._add_timeout((author, body["round"], body["attempt"]))
            case "commit":
                self._add_commit((author, body["round"], body["hash"], body["size"]))
            case "propose":
                self._add_proposal((author, body["round"], tuple(body["authors"])))
            case "score":
                self._add_score((author, body["round"], tuple(body["authors"]), tuple(body["scores"])))
            case "shard_result":
                self._add_shard_result((author, body["round"], body["set"], body["shard"], body["hash"]))
            case "dispute":
                self._add_dispute((author, body["round"], body["set"], body["shard"], body["member"], body["hash"]))
            case "checkpoint" | "attest":
                self.attests.add((author, body["round"], body["id"], body["size"]))
            case "hparams":
                self.hparams.add((body["round"], op.id, author, pack(body["changes"])))
            case "snapshot":
                self.snapshots.add((author, body["state"], tuple(body["frontier"]), body["ops"]))
            case "evidence":
                assert convicts is not None, "evidence is verified before its facts are added"
                self.convicted.add(convicts)

    # --- the indexes ---------------------------------------------------------------------------

    def votes_in(self, round_: int) -> dict[bytes, set[tuple[int, bytes, bytes]]]:
        """author -> the (attempt, hash, proposer or b"") votes it cast in `round_` (two for one attempt: it
        equivocated)."""
        return self._votes_by_round.get(round_, {})

    def timeouts_in(self, round_: int) -> dict[bytes, set[int]]:
        """author -> the attempts of `round_` it said timed out."""
        return self._timeouts_by_round.get(round_, {})

    def commits_in(self, round_: int) -> dict[bytes, set[tuple[bytes, int]]]:
        """author -> the (hash, size) commitments it made for `round_` (more than one: it equivocated)."""
        return self._commits_by_round.get(round_, {})

    def proposals_in(self, round_: int) -> dict[bytes, set[tuple[bytes, ...]]]:
        """author -> the contributor sets it proposed for `round_` (more than one: it equivocated)."""
        return self._proposals_by_round.get(round_, {})

    def scores_in(self, round_: int) -> dict[bytes, set[tuple[tuple[bytes, ...], tuple[int, ...]]]]:
        """author -> the (authors, scores) it reported for `round_` (more than one: it equivocated)."""
        return self._scores_by_round.get(round_, {})

    def shard_results_in(self, round_: int, set_id: bytes) -> dict[int, dict[bytes, set[bytes]]]:
        """shard -> author -> the result hashes it signed for that shard of contributor set
        `set_id` in `round_` (more than one: it equivocated)."""
        return self._results_by_round.get(round_, {}).get(set_id, {})

    def disputes_in(self, round_: int, set_id: bytes) -> dict[tuple[bytes, int, bytes], set[bytes]]:
        """(member, shard, hash) -> the authors that disputed the result `hash` that `member`
        signed (or, as far as these facts know, did not) for that shard of contributor set
        `set_id` in `round_`."""
        return self._disputes_by_round.get(round_, {}).get(set_id, {})

    def disputed_rounds(self) -> list[int]:
        """The rounds that any dispute names, in order."""
        return sorted(self._disputes_by_round)

    def disputed_sets(self, round_: int) -> list[bytes]:
        """The contributor sets of `round_` that any dispute names, in order."""
        return sorted(self._disputes_by_round.get(round_, {}))

    def _index(self, op_id: OpId, author: bytes, seq: int, depth: int) -> None:
        self.ops[op_id] = (author, seq, depth)
        other = self._chain.setdefault((author, seq), op_id)
        if other != op_id:
            self.forked.add(author)

    def _add_join(self, row: tuple[bytes, int, int]) -> None:
        self.joins.add(row)
        _keep_newest(self.newest_join, row)
        self.joins_of.setdefault(row[0], set()).add(row[1:])

    def _add_leave(self, row: tuple[bytes, int, int]) -> None:
        self.leaves.add(row)
        _keep_newest(self.newest_leave, row)
        self.leaves_of.setdefault(row[0], set()).add(row[1:])

    def _add_vote(self, row: tuple[bytes, int, bytes, bytes, int]) -> None:
        # One vote per attempt: a member votes again in the attempt after a split (crdt/electorate.py).
        self.votes.add(row)
        author, round_, hash_, proposer, attempt = row
        said = self._votes_by_round.setdefault(round_, {}).setdefault(author, set())
        said.add((attempt, hash_, proposer))
        if sum(1 for vote in said if vote[0] == attempt) > 1:
            self.equivocated.add(author)

    def _add_timeout(self, row: tuple[bytes, int, int]) -> None:
        # Not equivocation: one member may say several attempts of a round timed out.
        self.timeouts.add(row)
        author, round_, attempt = row
        self._timeouts_by_round.setdefault(round_, {}).setdefault(author, set()).add(attempt)

    def _add_commit(self, row: tuple[bytes, int, bytes, int]) -> None:
        # Two commitments differing in hash or size: one payload cannot match both, so the
        # author told different peers different things about its round (same as a double vote).
        self.commits.add(row)
        author, round_, hash_, size = row
        self._by_round(self._commits_by_round, author, round_, (hash_, size))

    def _add_proposal(self, row: tuple[bytes, int, tuple[bytes, ...]]) -> None:
        self.proposals.add(row)
        author, round_, authors = row
        self._by_round(self._proposals_by_round, author, round_, authors)

    def _add_score(self, row: tuple[bytes, int, tuple[bytes, ...], tuple[int, ...]]) -> None:
        # Two different reports for one round: the measurer told peers different things.
        self.scores.add(row)
        author, round_, authors, values = row
        self._by_round(self._scores_by_round, author, round_, (authors, values))

    def _add_shard_result(self, row: tuple[bytes, int, bytes, int, bytes]) -> None:
        # Two different results for one shard of one contributor set: the aggregate is bit-exact,
        # so at most one is its author's honest computation; it told peers different things (same
        # as a double vote). Another set of the same round is another aggregate: no conflict.
        self.shard_results.add(row)
        author, round_, set_id, shard, hash_ = row
        by_shard = self._results_by_round.setdefault(round_, {}).setdefault(set_id, {})
        said = by_shard.setdefault(shard, {}).setdefault(author, set())
        said.add(hash_)
        if len(said) > 1:
            self.equivocated.add(author)

    def _add_dispute(self, row: tuple[bytes, int, bytes, int, bytes, bytes]) -> None:
        # Not equivocation: a member may dispute several results, even several of one shard.
        self.disputes.add(row)
        author, round_, set_id, shard, member, hash_ = row
        by_result = self._disputes_by_round.setdefault(round_, {}).setdefault(set_id, {})
        by_result.setdefault((member, shard, hash_), set()).add(author)

    def _by_round(self, index: dict[int, dict[bytes, set]], author: bytes, round_: int, value: Any) -> None:
        said = index.setdefault(round_, {}).setdefault(author, set())
        said.add(value)
        if len(said) > 1:
            self.equivocated.add(author)

    # --- the canonical form (snapshots) ------------------------------------------------------

    def encode(self) -> bytes:
        """The one byte form of these facts; its SHA-256 is the snapshot state hash."""
        encoded = {
            "ops": sorted([i, a, s, d] for i, (a, s, d) in self.ops.items()),
            "joins": sorted(list(row) for row in self.joins),
            "leaves": sorted(list(row) for row in self.leaves),
            "votes": sorted(list(row) for row in self.votes),
            "commits": sorted(list(row) for row in self.commits),
            "proposals": sorted([a, r, list(who)] for a, r, who in self.proposals),
            "attests": sorted(list(row) for row in self.attests),
            "hparams": sorted(list(row) for row in self.hparams),
            "convicted": sorted(self.convicted),
            "snapshots": sorted([a, s, list(f), n] for a, s, f, n in self.snapshots),
            "timeouts": sorted(list(row) for row in self.timeouts),
        }
        if self.scores:
            encoded["scores"] = sorted([a, r, list(who), list(values)] for a, r, who, values in self.scores)
        if self.shard_results:
            encoded["shard_results"] = sorted(list(row) for row in self.shard_results)
        if self.disputes:
            encoded["disputes"] = sorted(list(row) for row in self.disputes)
        return pack(encoded)

    @classmethod
    def decode(cls, data: bytes) -> Facts:
        """Facts from `encode`'s output, or `ProtocolError` for anything else."""
        raw = unpack(data, max_size=MAX_SNAPSHOT_BYTES)
        _FACTS_SCHEMA.check(raw, "facts")
        facts = cls()
        for op_id, author, seq, depth in raw["ops"]:
            facts._index(op_id, author, seq, depth)
        for row in raw["joins"]:
            facts._add_join(tuple(row))
        for row in raw["leaves"]:
            facts._add_leave(tuple(row))
        for row in raw["votes"]:
            facts._add_vote(tuple(row))
        for row in raw["commits"]:
            facts._add_commit(tuple(row))
        for author, round_, authors in raw["proposals"]:
            facts._add_proposal((author, round_, tuple(authors)))
        facts.attests = {tuple(row) for row in raw["attests"]}
        facts.hparams = {tuple(row) for row in raw["hparams"]}
        for row in raw["hparams"]:
            Map(Scalar(), max_len=64).check(unpack(row[3], max_size=64 * 1024), "facts.hparams")
        facts.convicted = set(raw["convicted"])
        facts.snapshots = {(a, s, tuple(f), n) for a, s, f, n in raw["snapshots"]}
        for row in raw["timeouts"]:
            facts._add_timeout(tuple(row))
        for author, round_, authors, values in raw.get("scores", ()):
            facts._add_score((author, round_, tuple(authors), tuple(values)))
        for row in raw.get("shard_results", ()):
            facts._add_shard_result(tuple(row))
        for row in raw.get("disputes", ()):
            facts._add_dispute(tuple(row))
        if facts.encode() != data:
            raise ProtocolError("non-canonical", "snapshot facts are not in their canonical order")
        return facts


def _keep_newest(newest: dict[bytes, tuple[int, int]], row: tuple[bytes, int, int]) -> None:
    """Keep author -> its (seq, round) that is largest (ties, only possible in a fork: larger round)."""
    author, seq, round_ = row
    if (seq, round_) > newest.get(author, (-1, 0)):
        newest[author] = (seq, round_)
