"""Auditing a run: replay its certified rounds from the record and check every certificate.

A certificate says that more than two thirds of a round's electorate computed one state hash. An
honest peer computes it one way only (`machine`, steps 4 to 6, and `replay`): it aggregates the
payloads of exactly one proposal's set of authors, keyed by author, with `Participant.aggregate`
on the certified state of the round before (bit-exact on every CPU), and hashes the result
(`Participant.state_hash`). The participant is made from the genesis manifest alone, as the daemon
makes it (`RoundService.join`). So whoever holds a round's committed payloads can recompute it.
Per certified round r, from the certified state of round r - 1:

Only the proposals of r's electorate count (the electorates of the attempts up to the certifying
one, as `crdt/electorate.py` derives them into the certificate): honest peers follow no other
proposer, so anyone else's set cannot be what they computed.

- ``ok``: the set of one of those proposals gives the certified hash (the proposals that the
  certificate's voters name in their votes are tried first);
- ``mismatch``: every such set was built here, or is *bogus*, and none gives it: the certificate
  does not follow from its contributions. Its voters signed a hash no honest peer computes: that
  is the evidence, and the report names them. A set is bogus when it names an author with no
  commit for the round in the op log: no honest peer aggregated it (it proposes only authors
  whose commits it holds). A set holding a payload that breaks the run's limits counts as built
  (every honest peer refuses it); an author with two commits (an equivocation) is tried with each;
- ``missing``: some set could not be built here for want of payloads in the store, so no
  verdict (an archive node, `node start --archive`, keeps them all; others only the last few
  rounds; `run audit --fetch` downloads them), or because it names more authors with two
  commits than there is time to try (MAX_VARIANTS).

The op log is taken as this node holds it: what it lacks (a commit, a proposal that votes name)
is not a gap that could hide a verdict, since any member could make such a gap on purpose (a
proposal naming a key that never committed, votes naming a proposal never made). So audit from a
node that has synced the run.

After a round that is not ok the replay goes on from that round's certified state if the store
holds an attested checkpoint of it with the certified hash; else it stops, and the next round is
reported missing with those checkpoint IDs. The replay starts from the newest certified state
before the range that the store holds, else from the genesis state (round 0): rounds before the
range are replayed too, not reported.

Every payload is loaded with the limits its commit allows (`payload_limits`: run, round, size)
and every state with `state_limits`, checked before anything is allocated.

`audit_rounds` is the pure part: facts, genesis, a participant and two loaders in, reports out.
`audit_data_dir` runs it over a node's data dir (run manifest, op log, checkpoint store), reading
only, so it is safe beside a running daemon: the op log is append-only (a record still being
written is left out) and every store write is atomic (a checkpoint removed meanwhile is missing).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locomesh.crdt import Facts, Genesis, Replica, RunState, derive
from locomesh.crdt.view import Certificate, checkpoint_candidates
from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import format_run_id, load_manifest
from locomesh.training.checkpoint_manifest import CheckpointError, ManifestLimits

from locomesh.node.datadir import CHECKPOINT_DIR
from locomesh.node.replication.op_log import stored_ops
from locomesh.node.runs.store import RunStore
from locomesh.node.transfer.store import is_missing, load_checkpoint, load_payload

OK, MISMATCH, MISSING = "ok", "mismatch", "missing"
# Equivocating authors in one set make one set per choice of their commits; past this many the
# set is left unbuilt (a gap), so that equivocations cannot make an audit run for ever.
MAX_VARIANTS = 64

# (checkpoint ID, the limits it must keep) -> a payload's bytes, or a state's tensors by name.
# Both raise `Missing` when the checkpoint is not (wholly) here, a `ValueError` when it is bad.
PayloadLoader = Callable[[bytes, ManifestLimits], bytes]
StateLoader = Callable[[bytes, ManifestLimits], Mapping[str, Any]]


class Missing(Exception):
    """A checkpoint a loader was asked for is not (wholly) here."""


class AuditError(Exception):
    """The audit cannot start (no such run here, a run this node cannot compute); one line for the user."""


@dataclass(frozen=True)
class RoundAudit:
    """The verdict on one certified round (see the module docstring)."""

    round: int
    verdict: str  # OK, MISMATCH or MISSING
    certified: bytes  # the hash its certificate names
    proposer: bytes | None = None  # ok: whose proposed set gives the certified hash
    voters: tuple[bytes, ...] = ()  # mismatch: who signed the certificate
    missing: tuple[bytes, ...] = ()  # missing: the checkpoint IDs (payloads or states) not here
    bogus: tuple[bytes, ...] = ()  # the electorate members whose proposed set names an author with no commit
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "verdict": self.verdict, "certified": self.certified.hex(),
                "proposer": None if self.proposer is None else self.proposer.hex(),
                "voters": [v.hex() for v in self.voters], "missing": [m.hex() for m in self.missing],
                "bogus": [b.hex() for b in self.bogus], "note": self.note}


def audit_rounds(facts: Facts, genesis: Genesis, participant: Any, *, load_payload: PayloadLoader,
                 load_state: StateLoader, first: int = 1, last: int | None = None) -> list[RoundAudit]:
    """The verdicts on the certified rounds `first` to `last` (default: the newest certified), in
    order; fewer if the replay had to stop (the last one then says why). `participant` holds the
    genesis state (`Participant.for_run` of the run's manifest body) and is used up."""
    return _Replay(facts, genesis, participant, load_payload, load_state).run(first, last)


class _Replay:
    def __init__(self, facts: Facts, genesis: Genesis, participant: Any, load_payload: PayloadLoader,
                 load_state: StateLoader) -> None:
        self.facts, self.run_id, self.participant = facts, genesis.run_id, participant
        self.state: RunState = derive(facts, genesis)
        self.load_payload, self.load_state = load_payload, load_state
        self.genesis_state = participant.snapshot()

    def run(self, first: int, last: int | None) -> list[RoundAudit]:
        first, last = max(first, 1), self.state.round if last is None else min(last, self.state.round)
        reports: list[RoundAudit] = []
        if first > last:
            return reports
        for number in range(self._start(first - 1) + 1, last + 1):
            report = self._round(number)
            if number >= first:
                reports.append(report)
            if report.verdict == OK:
                continue
            went_on, ids = self._adopt_certified(number)
            if not went_on:
                if number < last:
                    stopped = max(number + 1, first)
                    reports.append(RoundAudit(stopped, MISSING, self._certificate(stopped).hash, missing=ids,
                                              note=f"no certified state of round {number} in the store to go on "
                                                   "from: the audit stops here"))
                break
        return reports

    def _certificate(self, number: int) -> Certificate:
        return self.state.certificates[number]

    # --- states ----------------------------------------------------------------------------------

    def _start(self, before: int) -> int:
        """Hold the newest certified state up to round `before` that the store has, else the
        genesis state; its round."""
        for number in range(before, 0, -1):
            if self._adopt_certified(number)[0]:
                return number
        self.participant.adopt(self.genesis_state.tensors, 0)
        return 0

    def _adopt_certified(self, number: int) -> tuple[bool, tuple[bytes, ...]]:
        """Adopt an attested checkpoint of round `number` that holds its certified hash, most
        attested first: (done, the IDs not in the store). Not done: the participant's state is
        unusable until something else is adopted."""
        absent = []
        limits = self.participant.state_limits(self.run_id, number)
        for checkpoint in checkpoint_candidates(self.facts, self.state, number):
            try:
                tensors = self.load_state(checkpoint.id, limits)
            except Missing:
                absent.append(checkpoint.id)
                continue
            except ValueError:  # not a state of this run's round: its attesters were wrong
                continue
            self.participant.adopt(tensors, number)
            if self.participant.state_hash() == self._certificate(number).hash:
                return True, ()
        return False, tuple(absent)

    # --- one round -------------------------------------------------------------------------------

    def _round(self, number: int) -> RoundAudit:
        """The verdict on round `number`, the participant holding round `number - 1`'s certified
        state; when ok, it holds round `number`'s after.

        The round's ops are read as they are, not through the view's present eligibility or bans: a
        key banned after the round, or a late join, changes nothing about what was computed then."""
        certificate = self._certificate(number)
        before = self.participant.snapshot()  # the outer step never writes into arrays it handed out
        gaps = _Gaps()
        tried = 0
        candidates = self._candidates(number, certificate, gaps)
        for proposer, authors in candidates:
            for payloads in self._builds(number, proposer, authors, gaps):
                if tried:
                    self.participant.adopt(before.tensors, number - 1)
                tried += 1
                try:
                    self.participant.aggregate(payloads)
                except ValueError:  # nothing valid to apply: an honest peer votes for no hash
                    continue
                if self.participant.state_hash() == certificate.hash:
                    return RoundAudit(number, OK, certificate.hash, proposer=proposer)
        bogus = tuple(sorted(gaps.bogus))
        if gaps:  # a set not built here might give the hash: no verdict
            return RoundAudit(number, MISSING, certificate.hash, missing=tuple(sorted(gaps.ids)), bogus=bogus,
                              note="; ".join([*sorted(gaps.notes), *sorted(gaps.remarks)]))
        summary = (f"none of the {len(candidates)} sets proposed by the electorate ({tried} computed) "
                   "gives the certified hash")
        return RoundAudit(number, MISMATCH, certificate.hash, voters=tuple(sorted(certificate.voters)), bogus=bogus,
                          note="; ".join([summary, *sorted(gaps.remarks)]))

    def _candidates(self, number: int, certificate: Certificate, gaps: _Gaps) -> list[tuple[bytes, tuple[bytes, ...]]]:
        """(proposer, set) for each distinct set that a member of round `number`'s electorate
        proposed, those the certificate's voters name in their votes first (most named first).
        A named proposal that is not in the op log, or not the electorate's, is remarked on only
        (module docstring)."""
        electorate = frozenset().union(*certificate.attempts)
        proposed = {p: sets for p, sets in self.facts.proposals_in(number).items() if p in electorate}
        votes = self.facts.votes_in(number)
        named = Counter(proposer for voter in certificate.voters for _attempt, _hash, proposer in votes.get(voter, ())
                        if proposer)
        for proposer in sorted(set(named) - set(proposed)):
            why = "which this node's op log lacks" if proposer in electorate else "not of the round's electorate"
            gaps.remarks.add(f"votes name a proposal by {proposer.hex()[:16]}, {why}")
        ordered, seen = [], set()
        for proposer in sorted(proposed, key=lambda p: (-named[p], p)):
            for authors in sorted(proposed[proposer]):
                if authors not in seen:
                    seen.add(authors)
                    ordered.append((proposer, authors))
        return ordered

    def _builds(self, number: int, proposer: bytes, authors: tuple[bytes, ...],
                gaps: _Gaps) -> Iterator[dict[bytes, bytes]]:
        """The payloads of `authors` by author, each way an honest peer could have aggregated them:
        one, or one per choice among the commits of the authors that committed twice. None at all
        when the set is bogus (an author with no commit: `gaps.bogus`) or has too many choices (a
        gap); none of a choice whose payload is not here (a gap) or breaks the run's limits (every
        honest peer refuses it)."""
        commits = self.facts.commits_in(number)
        choices = [sorted(commits.get(author, ())) for author in authors]
        lacking = [author for author, said in zip(authors, choices) if not said]
        if lacking:
            gaps.bogus.add(proposer)
            gaps.remarks.add(f"the set proposed by {proposer.hex()[:16]} is bogus: no commit of "
                             + ", ".join(author.hex()[:16] for author in lacking))
            return
        if math.prod(map(len, choices)) > MAX_VARIANTS:
            gaps.notes.add(f"the set proposed by {proposer.hex()[:16]} names too many authors with two commits to try")
            return
        loaded: dict[tuple[bytes, int], bytes | None] = {}  # commit -> its payload, None if it breaks the limits
        for payload_id, size in sorted({commit for said in choices for commit in said}):
            try:
                loaded[(payload_id, size)] = self.load_payload(
                    payload_id, self.participant.payload_limits(self.run_id, number, size))
            except Missing:
                gaps.ids.add(payload_id)
            except ValueError:
                loaded[(payload_id, size)] = None
        for variant in itertools.product(*choices):
            payloads = [loaded.get(commit) for commit in variant]
            if all(payload is not None for payload in payloads):
                yield dict(zip(authors, payloads))


class _Gaps:
    """What kept a round's sets from being built here: checkpoint IDs not in the store, and notes
    on them (both hold a verdict back); and what is only remarked on: the bogus sets' proposers
    (`bogus`), and remarks."""

    def __init__(self) -> None:
        self.ids: set[bytes] = set()
        self.notes: set[str] = set()
        self.bogus: set[bytes] = set()
        self.remarks: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.ids or self.notes)


# --- over a node's data dir ---------------------------------------------------------------------


def store_loaders(directory: str | os.PathLike) -> tuple[PayloadLoader, StateLoader]:
    """The payload and state loaders over the checkpoint store at `directory`."""

    def payload(payload_id: bytes, limits: ManifestLimits) -> bytes:
        with _missing_as_missing():
            return load_payload(directory, payload_id, limits)

    def state(checkpoint_id: bytes, limits: ManifestLimits) -> Mapping[str, Any]:
        with _missing_as_missing():
            return load_checkpoint(directory, checkpoint_id, limits)[0]

    return payload, state


@contextmanager
def _missing_as_missing() -> Iterator[None]:
    """Turn the store's ``missing-*`` `CheckpointError` into `Missing`."""
    try:
        yield
    except CheckpointError as error:
        if is_missing(error):
            raise Missing(str(error)) from None
        raise


def read_replica(data_dir: str | os.PathLike, manifest: bytes) -> Replica:
    """The run of `manifest` as this node's op log on disk holds it (read only; an op that fails
    its checks is left out, as the daemon leaves it out)."""
    replica = Replica(Genesis.from_manifest(manifest))
    for data in stored_ops(data_dir, replica.run_id):
        try:
            replica.add(data)
        except ProtocolError:
            pass
    return replica


def audit_data_dir(data_dir: str | os.PathLike, run_id: bytes, *, first: int = 1,
                   last: int | None = None) -> tuple[RunState, list[RoundAudit]]:
    """Audit run `run_id` from what the node with data dir `data_dir` holds (its manifest, op
    log and checkpoint store): the run state and the verdicts. `AuditError` if the node knows no
    such run or cannot compute it."""
    from locomesh.training.participant import Participant  # torch: only now
    from locomesh.training.run_settings import ParticipantError

    runs = RunStore(data_dir)
    runs.load()
    known = runs.get(run_id)
    if known is None:
        raise AuditError(f"this node knows no run {format_run_id(run_id)} (data dir {Path(data_dir)})")
    replica = read_replica(data_dir, known.manifest)
    store = Path(data_dir) / CHECKPOINT_DIR
    try:  # whose key does not matter: it picks the data shard of training, never used here
        participant = Participant.for_run(load_manifest(known.manifest)[1].body, bytes(32))
        _start_from_initial_weights(participant, store)
    except ParticipantError as error:
        raise AuditError(f"this node cannot compute run {format_run_id(run_id)}: {error}") from None
    load_pay, load_st = store_loaders(store)
    reports = audit_rounds(replica.facts, replica.genesis, participant, load_payload=load_pay, load_state=load_st,
                           first=first, last=last)
    return replica.state, reports


def _start_from_initial_weights(participant: Any, store: Path) -> None:
    """Give a run that starts from stored weights (`run create --init`) its genesis state, from the
    node's store; `AuditError` if the store lacks them."""
    needs = participant.data_needs()
    if needs.init is None:
        return
    try:
        tensors, _metadata = load_checkpoint(store, needs.init, needs.init_limits)
    except CheckpointError as error:
        raise AuditError(f"the run's initial weights {needs.init.hex()[:16]} are not in this node's store: {error}") from None
    participant.attach_data(None, [], tensors)
