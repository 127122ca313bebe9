"""Auditing a run: replay its certified rounds from the record and check every certificate.

Theory of operation
-------------------
A certificate of round r (crdt/chain.py) says that more than two thirds of r's electorate
precommitted one value and one state hash. The value (crdt/value.py) names exactly one commit op
per payload author, so it names exactly the payloads the round aggregates
(`certificate.reading.payloads`: author -> `Payload` (checkpoint ID, size, commit op)). An honest
member precommits only a value whose every payload it holds, and only the state it computed from
them one way (node/rounds/deciding.py): the outer step of those payloads, keyed by author, with
`Participant.aggregate` on the certified state of round r - 1 (bit-exact on every CPU), hashed
(`Participant.state_hash`). The participant is made from the genesis manifest alone, as the daemon
makes it (`RoundService.join`). So whoever holds a round's payloads can recompute it. Per
certified round r, from the certified state of round r - 1:

- ``ok``: the value's payloads give the certified hash;
- ``mismatch``: they do not: they give another hash, or nothing at all (no valid payload to
  apply), or one of them breaks the run's limits (no honest member holds it, so none computed any
  state of the value). The precommitters of the certified (value, state) (`Chain.voters`: every
  member of r's electorate whose precommit names them, late ones included) signed a state no
  honest member computes: that is the evidence, and the report names them;
- ``missing``: some payload of the value is not in this node's store, and none breaks the limits,
  so no verdict; the report names the payloads and their authors (an archive node, `node start
  --archive`, keeps them all; others only the last few rounds; `run audit --fetch` downloads them).

The op log is taken as this node holds it. A certificate can only stand on ops it holds (the
proposal of the value, which depends on every commit it names, and the precommits), so what the
log lacks hides no verdict; it may only leave the newest rounds uncertified here (audit from a
node that has synced the run) and leave out late precommitters.

After a round that is not ok the replay goes on from that round's certified state if the store
holds a checkpoint of it with the certified hash, attested by its precommitters
(`Replica.checkpoint_candidates`, most attested first); else it stops, and the next round is
reported missing with those checkpoint IDs. The replay starts from the newest certified state
before the range that the store holds, else from the genesis state (round 0): rounds before the
range are replayed too, not reported.

Every payload is loaded with the limits its commit allows (`payload_limits`: run, round, size)
and every state with `state_limits`, checked before anything is allocated. A payload that is in
the store but fails to load breaks those limits for every member alike (a checkpoint is checked
against its content-addressed ID when stored and again when loaded; only a copy damaged on this
disk since would fail here alone, and the note gives the error).

Known limit: a round of sharded exchange (node/exchange/sharded.py) commits to Merkle roots of
framed payloads, which are not checkpoints of the store, so such a round shows as missing here.

`audit_rounds` is the pure part: a replica, a participant and two loaders in, reports out.
`audit_data_dir` runs it over a node's data dir (run manifest, op log, checkpoint store), reading
only, so it is safe beside a running daemon: the op log is append-only (a record still being
written is left out) and every store write is atomic (a checkpoint removed meanwhile is missing).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from locomesh.crdt import Certificate, Genesis, Replica, RunState
from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import format_run_id, load_manifest
from locomesh.training.checkpoint_manifest import CheckpointError, ManifestLimits

from locomesh.node.datadir import CHECKPOINT_DIR
from locomesh.node.replication.op_log import stored_ops
from locomesh.node.runs.store import RunStore
from locomesh.node.transfer.store import is_missing, load_checkpoint, load_payload

OK, MISMATCH, MISSING = "ok", "mismatch", "missing"

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
    certified: bytes  # the state hash its certificate names
    value: bytes  # the certified value's ID
    authors: tuple[bytes, ...] = ()  # the value's payload authors
    voters: tuple[bytes, ...] = ()  # mismatch: the precommitters of the certified (value, state)
    missing: tuple[bytes, ...] = ()  # missing: the checkpoint IDs (payloads or states) not here
    missing_authors: tuple[bytes, ...] = ()  # missing: the authors of the payloads not here
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "verdict": self.verdict, "certified": self.certified.hex(),
                "value": self.value.hex(), "authors": [a.hex() for a in self.authors],
                "voters": [v.hex() for v in self.voters], "missing": [m.hex() for m in self.missing],
                "missing_authors": [a.hex() for a in self.missing_authors], "note": self.note}


def audit_rounds(replica: Replica, participant: Any, *, load_payload: PayloadLoader, load_state: StateLoader,
                 first: int = 1, last: int | None = None) -> list[RoundAudit]:
    """The verdicts on the certified rounds `first` to `last` (default: the newest certified) of
    `replica`'s chain, in order; fewer if the replay had to stop (the last one then says why).
    `participant` holds the genesis state (`Participant.for_run` of the run's manifest body) and
    is used up."""
    return _Replay(replica, participant, load_payload, load_state).run(first, last)


class _Replay:
    def __init__(self, replica: Replica, participant: Any, load_payload: PayloadLoader,
                 load_state: StateLoader) -> None:
        self.replica, self.chain, self.run_id = replica, replica.chain, replica.run_id
        self.participant = participant
        self.load_payload, self.load_state = load_payload, load_state
        self.genesis_state = participant.snapshot()

    def run(self, first: int, last: int | None) -> list[RoundAudit]:
        first, last = max(first, 1), self.chain.round if last is None else min(last, self.chain.round)
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
                    stopped = self._certificate(max(number + 1, first))
                    reports.append(RoundAudit(stopped.round, MISSING, stopped.state, stopped.value_id,
                                              stopped.reading.authors, missing=ids,
                                              note=f"no certified state of round {number} in the store to go on "
                                                   "from: the audit stops here"))
                break
        return reports

    def _certificate(self, number: int) -> Certificate:
        return self.chain.certificates[number]

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
        for checkpoint in self.replica.checkpoint_candidates(number):
            try:
                tensors = self.load_state(checkpoint.id, limits)
            except Missing:
                absent.append(checkpoint.id)
                continue
            except ValueError:  # not a state of this run's round: its attesters were wrong
                continue
            self.participant.adopt(tensors, number)
            if self.participant.state_hash() == self._certificate(number).state:
                return True, ()
        return False, tuple(absent)

    # --- one round -------------------------------------------------------------------------------

    def _round(self, number: int) -> RoundAudit:
        """The verdict on round `number`, the participant holding round `number - 1`'s certified
        state; when ok, it holds round `number`'s after.

        The value's payloads are read from its certificate as they are, not through the view's
        present bans: a key banned after the round changes nothing about what was computed then."""
        certificate = self._certificate(number)
        payloads = certificate.reading.payloads
        report = RoundAudit(number, OK, certificate.state, certificate.value_id, certificate.reading.authors)
        loaded: dict[bytes, bytes] = {}
        absent: dict[bytes, bytes] = {}  # author -> payload ID
        bad: dict[bytes, str] = {}  # author -> why its payload breaks the run's limits
        for author, payload in sorted(payloads.items()):
            try:
                limits = self.participant.payload_limits(self.run_id, number, payload.size)
                loaded[author] = self.load_payload(payload.hash, limits)
            except Missing:
                absent[author] = payload.hash
            except ValueError as error:
                bad[author] = str(error)
        if bad:  # no honest member held this value, however the missing payloads look
            return self._mismatch(report, "; ".join(
                f"the payload of {author.hex()[:16]} breaks the run's limits ({why}): no honest member holds the value"
                for author, why in sorted(bad.items())))
        if absent:
            return replace(report, verdict=MISSING, missing=tuple(sorted(set(absent.values()))),
                           missing_authors=tuple(sorted(absent)),
                           note=f"{len(absent)} of the value's {len(payloads)} payloads not in the store")
        try:
            self.participant.aggregate(loaded)
        except ValueError as error:  # nothing valid to apply: an honest member computes no state
            return self._mismatch(report, f"the value's {len(payloads)} payloads aggregate to nothing: {error}")
        computed = self.participant.state_hash()
        if computed == certificate.state:
            return report
        return self._mismatch(report, f"the value's {len(payloads)} payloads give state {computed.hex()[:16]}, "
                                      f"not the certified {certificate.state.hex()[:16]}")

    def _mismatch(self, report: RoundAudit, note: str) -> RoundAudit:
        """`report` as a mismatch: the precommitters of the certified (value, state), late ones too."""
        return replace(report, verdict=MISMATCH, voters=tuple(sorted(self.chain.voters(report.round))), note=note)


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
    reports = audit_rounds(replica, participant, load_payload=load_pay, load_state=load_st, first=first, last=last)
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
