"""`locomesh run audit` (node/rounds/audit.py): a hand-built run, replayed from a node's data dir.

Four members train a tiny model for three rounds with real participants; each round's payloads
and certified state go to a real checkpoint store, its commits, the value's proposal, the
precommits (`certify`) and the attestations into a real replica, whose ops go to the op log of a
data dir laid out as the daemon's. Round 1's electorate is the creator alone (the others are
admitted at genesis and contribute from their join on); from round 2 all four vote. The same data
dir is then edited to make a round's payload or state go missing; other runs are built whose
round-2 precommitters signed a state the payloads do not give (`forge`), or a value naming a
payload that breaks the run's limits (`stale`).
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.main import main
from locomesh.crdt import Genesis, Replica
from locomesh.netsim.offload import run_inline
from locomesh.node.config import load_config
from locomesh.node.replication.op_log import OpLog
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.audit import MISMATCH, MISSING, OK, AuditError, audit_data_dir, read_replica
from locomesh.node.rounds.participation import RunParticipation
from locomesh.node.runs.store import RunStore
from locomesh.node.transfer.download import DownloadProgress
from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.transfer.store import checkpoint_ids, load_payload, manifest_path, write_payload, write_state
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import format_run_id, sign_manifest
from locomesh.training.contract import PAYLOAD_TENSOR
from locomesh.training.participant import Participant, payload_limits
from locomesh.training.state_chunks import FAST_LEVEL, chunk_state

from .test_crdt_support import certify, in_causal_order, keys

MEMBERS = keys(4)
KEYS = tuple(sorted(member.public_key for member in MEMBERS))
ROUNDS = 3
TASK_CONFIG = {"d_model": 32, "n_layer": 1, "n_head": 2}
HPARAMS = {"inner_steps": 2, "batch_size": 4}


class HandBuiltRun:
    """A run of ROUNDS rounds written into `data_dir` as a daemon would keep it. With `forge`, the
    precommitters of that round sign (and store, and attest) a state nudged away from what the
    payloads give, one of them late (after the certificate), and the later rounds build on it
    honestly. With `stale`, the last member's commit of that round names its payload of the round
    before (which breaks this round's limits), and the precommitters sign what it gives."""

    def __init__(self, data_dir, *, forge: int | None = None, stale: int | None = None) -> None:
        self.data_dir, self.store = data_dir, data_dir / "checkpoints"
        self.manifest = sign_manifest(MEMBERS[0], task="synthetic-lm", created=1_700_000_000, task_config=TASK_CONFIG,
                                      seed=3, hparams=HPARAMS, admitted=[m.public_key for m in MEMBERS[1:]])
        replica = Replica(Genesis.from_manifest(self.manifest))
        self.run_id = replica.run_id
        body = {"task": "synthetic-lm", "task_config": TASK_CONFIG, "seed": 3, "hparams": HPARAMS}
        peers = [Participant.for_run(body, member.public_key) for member in MEMBERS]
        self.payloads: dict[int, list[bytes]] = {}  # round -> payload IDs, in MEMBERS order
        self.states: dict[int, bytes] = {}  # round -> the attested state's checkpoint ID
        self.values: dict[int, bytes] = {}  # round -> the certified value's ID
        self.late: bytes | None = None  # the forged round's late precommitter
        for member in MEMBERS:
            replica.create(member, "join", round=1)
        sent: dict[int, dict[bytes, bytes]] = {0: {}}  # round -> the payloads committed, by author
        for number in range(1, ROUNDS + 1):
            payloads = sent[number] = {}
            for index, (member, peer) in enumerate(zip(MEMBERS, peers)):
                payload = peer.train().payload
                payload_id = write_payload(self.store, payload, self.run_id, number).id
                if number == stale and index == len(MEMBERS) - 1:  # its payload of the round before instead
                    payload, payload_id = sent[number - 1][member.public_key], self.payloads[number - 1][index]
                replica.create(member, "commit", round=number, hash=payload_id, size=len(payload))
                payloads[member.public_key] = payload
                self.payloads.setdefault(number, []).append(payload_id)
            for peer in peers:
                peer.aggregate(payloads)
            if number == forge:
                nudged = {**peers[0].state_tensors(), "theta": peers[0].outer.theta + np.float32(1e-3)}
                for peer in peers:
                    peer.adopt(nudged, number)
            state_hash = peers[0].state_hash()
            signers = list(MEMBERS)
            if number == forge:  # one precommits after the certificate: it counts among the voters too
                late = next(m for m in reversed(MEMBERS) if m.public_key != replica.chain.proposer(0))
                signers.remove(late)
            value = certify(replica, signers, state=state_hash)
            if number == forge:
                self.late = late.public_key
                replica.create(late, "precommit", round=number, epoch=0, attempt=0, value=value.id, state=state_hash)
            certificate = replica.chain.certificates[number]
            assert certificate.reading.authors == KEYS and certificate.state == state_hash
            self.values[number] = value.id
            state = write_state(self.store, peers[0].snapshot(), self.run_id)
            self.states[number] = state.id
            for member in MEMBERS:
                replica.create(member, "checkpoint", round=number, id=state.id, size=state.raw_size)
        assert replica.chain.round == ROUNDS
        if forge is not None:
            assert self.late in replica.chain.voters(forge) and self.late not in replica.chain.certificates[forge].voters
        RunStore(data_dir).add(self.manifest, "joined")
        log = OpLog.for_run(data_dir, self.run_id)
        list(log.load())
        for data in in_causal_order(replica):
            log.append(data)
        log.close()

    def copy(self, destination) -> HandBuiltRun:
        """The same run in another data dir (to edit it)."""
        shutil.copytree(self.data_dir, destination)
        copied = SimpleNamespace(**vars(self))
        copied.data_dir, copied.store = destination, destination / "checkpoints"
        return copied

    def audit(self, **kwargs):
        return audit_data_dir(self.data_dir, self.run_id, **kwargs)[1]


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    return HandBuiltRun(tmp_path_factory.mktemp("honest"))


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    return HandBuiltRun(tmp_path_factory.mktemp("forged"), forge=2)


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    return HandBuiltRun(tmp_path_factory.mktemp("stale"), stale=2)


def verdicts(reports):
    return [(report.round, report.verdict) for report in reports]


def test_an_honest_run_audits_ok_round_by_round(honest):
    reports = honest.audit()
    assert verdicts(reports) == [(1, OK), (2, OK), (3, OK)]
    assert [report.value for report in reports] == [honest.values[number] for number in (1, 2, 3)]
    assert all(report.authors == KEYS and report.voters == () and report.missing == () for report in reports)


def test_a_forged_state_is_a_mismatch_naming_its_precommitters_and_the_audit_goes_on_from_it(forged):
    reports = forged.audit()
    assert verdicts(reports) == [(1, OK), (2, MISMATCH), (3, OK)]  # round 3 builds on the attested state
    assert reports[1].voters == KEYS  # the late precommitter signed it too
    assert reports[1].certified == read_replica(forged.data_dir, forged.manifest).chain.state_of(2)
    assert "give state" in reports[1].note and f"not the certified {reports[1].certified.hex()[:16]}" in reports[1].note
    assert reports[0].voters == reports[2].voters == ()


def test_a_forgery_is_found_when_auditing_its_round_alone(forged):
    assert verdicts(forged.audit(first=2, last=2)) == [(2, MISMATCH)]


def test_a_payload_that_breaks_the_limits_is_a_mismatch_even_beside_a_missing_one(stale, tmp_path):
    reports = stale.audit()
    assert verdicts(reports) == [(1, OK), (2, MISMATCH), (3, OK)]
    assert reports[1].voters == KEYS
    assert f"the payload of {MEMBERS[-1].public_key.hex()[:16]} breaks the run's limits" in reports[1].note
    run = stale.copy(tmp_path / "node")
    manifest_path(run.store, run.payloads[2][0]).unlink()  # no payload here could make it right
    reports = HandBuiltRun.audit(run)
    assert verdicts(reports) == [(1, OK), (2, MISMATCH), (3, OK)]
    assert reports[1].missing == ()


def add_ops(run: HandBuiltRun, ops) -> None:
    """Write (identity, op kind, fields) ops on top of the op log of `run`'s data dir."""
    replica = read_replica(run.data_dir, run.manifest)
    log = OpLog.for_run(run.data_dir, run.run_id)
    list(log.load())
    for identity, kind, fields in ops:
        log.append(replica.create(identity, kind, **fields))
    log.close()


def test_only_the_values_payloads_are_aggregated_not_every_commit_of_the_round(honest, tmp_path):
    run = honest.copy(tmp_path / "node")
    (stranger,) = keys(1, offset=10)
    # A commit of round 2 that no value names, of a payload that is there and would change the state.
    add_ops(run, [(stranger, "join", {"round": ROUNDS + 1}),
                  (stranger, "commit", {"round": 2, "hash": run.payloads[2][1], "size": 1})])
    assert stranger.public_key in read_replica(run.data_dir, run.manifest).facts.commits_in(2)
    reports = HandBuiltRun.audit(run)
    assert verdicts(reports) == [(1, OK), (2, OK), (3, OK)]
    assert stranger.public_key not in reports[1].authors


def test_a_missing_payload_is_reported_with_its_author_and_the_certified_state_carries_the_audit_on(honest, tmp_path):
    run = honest.copy(tmp_path / "node")
    gone = run.payloads[1][1]
    manifest_path(run.store, gone).unlink()
    reports = HandBuiltRun.audit(run)
    assert verdicts(reports) == [(1, MISSING), (2, OK), (3, OK)]
    assert reports[0].missing == (gone,) and reports[0].missing_authors == (MEMBERS[1].public_key,)
    assert reports[0].voters == () and reports[0].authors == KEYS


def test_without_the_state_to_go_on_from_the_audit_stops_and_says_which(honest, tmp_path):
    run = honest.copy(tmp_path / "node")
    manifest_path(run.store, run.payloads[1][0]).unlink()
    manifest_path(run.store, run.states[1]).unlink()
    reports = HandBuiltRun.audit(run)
    assert verdicts(reports) == [(1, MISSING), (2, MISSING)]
    assert reports[1].missing == (run.states[1],) and reports[1].missing_authors == () and "stops" in reports[1].note


def test_a_range_starts_from_the_newest_stored_state_before_it(honest, tmp_path):
    assert verdicts(honest.audit(first=3)) == [(3, OK)]
    assert verdicts(honest.audit(first=2, last=2)) == [(2, OK)]
    run = honest.copy(tmp_path / "node")
    manifest_path(run.store, run.payloads[1][3]).unlink()  # no replay of round 1 could get past it...
    manifest_path(run.store, run.states[1]).unlink()
    assert verdicts(HandBuiltRun.audit(run, first=3)) == [(3, OK)]  # ... and none is needed: round 2's state is here
    shutil.rmtree(run.data_dir)
    run = honest.copy(tmp_path / "node")
    manifest_path(run.store, run.states[2]).unlink()  # round 2 is replayed from round 1's state
    manifest_path(run.store, run.states[1]).unlink()  # ... or from the genesis state
    assert verdicts(HandBuiltRun.audit(run, first=3)) == [(3, OK)]
    manifest_path(run.store, run.payloads[1][3]).unlink()  # a replayed round before the range is not reported...
    reports = HandBuiltRun.audit(run, first=3)  # ... but the replay cannot get past it
    assert verdicts(reports) == [(3, MISSING)] and reports[0].missing == (run.states[1],)


def test_a_payload_over_its_commit_size_is_refused_not_loaded(honest, tmp_path):
    run = honest.copy(tmp_path / "node")
    payload_id = run.payloads[1][0]
    with pytest.raises(ValueError, match="over-limit"):  # the manifest is checked before anything is allocated
        load_payload(run.store, payload_id, payload_limits(run.run_id, 1, 10, 1 << 20))


def test_an_unknown_run_is_an_error(tmp_path):
    with pytest.raises(AuditError, match="knows no run"):
        audit_data_dir(tmp_path, b"\x01" * 32)


# --- the command ---------------------------------------------------------------------------------


def test_the_command_exits_0_for_an_honest_run_and_1_for_a_forged_one(honest, forged, capsys):
    assert main(["run", "audit", format_run_id(honest.run_id), "--data-dir", str(honest.data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["ok"], result["mismatch"], result["missing"], result["certified"]) == (3, 0, 0, 3)
    assert main(["run", "audit", format_run_id(forged.run_id), "--data-dir", str(forged.data_dir), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in result["rounds"]] == ["ok", "mismatch", "ok"]
    assert result["rounds"][1]["voters"] == sorted(member.public_key.hex() for member in MEMBERS)
    assert result["rounds"][1]["value"] == forged.values[2].hex()
    assert main(["run", "audit", format_run_id(forged.run_id), "--data-dir", str(forged.data_dir), "--from", "2",
                 "--to", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"round    2: MISMATCH: certified state {result['rounds'][1]['certified'][:16]} of value "
                               f"{forged.values[2].hex()[:16]}")
    assert lines[0].endswith("precommitted by " + ", ".join(peer_id_from_public_key(key) for key in KEYS))
    assert "0 ok, 1 mismatch, 0 missing" in lines[-1]


def test_the_command_names_what_is_missing_and_whose_it_is(honest, tmp_path, capsys):
    run = honest.copy(tmp_path / "node")
    gone = run.payloads[2][3]
    manifest_path(run.store, gone).unlink()
    assert main(["run", "audit", format_run_id(run.run_id), "--data-dir", str(run.data_dir)]) == 0  # nothing proved
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("round    1: ok (value ") and lines[0].endswith(", 4 payloads)")
    assert lines[1] == (f"round    2: missing: 1 checkpoint not in the store: {gone.hex()[:16]} (the payloads of "
                        f"{peer_id_from_public_key(MEMBERS[3].public_key)}); 1 of the value's 4 payloads not in the store")
    assert "2 ok, 0 mismatch, 1 missing" in lines[-1]


def test_the_command_takes_the_short_id_run_list_prints(honest, capsys):
    """Issue #37: every ID the CLI prints must be taken; `run list` prints 16 characters."""
    short = format_run_id(honest.run_id)[:16]
    assert main(["run", "audit", short, "--data-dir", str(honest.data_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == format_run_id(honest.run_id)


def test_the_command_refuses_a_bad_range_and_an_unknown_run(tmp_path, capsys):
    run_id = format_run_id(b"\x01" * 32)
    assert main(["run", "audit", run_id, "--data-dir", str(tmp_path), "--from", "0"]) == 2
    assert main(["run", "audit", run_id, "--data-dir", str(tmp_path)]) == 1
    assert "knows no run" in capsys.readouterr().err


# --- archive mode --------------------------------------------------------------------------------


def party(directory, *, archive: bool) -> RunParticipation:
    me = MEMBERS[0]
    replica = Replica(Genesis.from_manifest(sign_manifest(me, task="synthetic-lm", created=1_700_000_000)))
    participant = SimpleNamespace(settings=SimpleNamespace(delayed_updates=False))
    return RunParticipation(SimpleNamespace(identity=me), None, replica, participant, directory, scores=None,
                            timing=rm.Timing(), offload=run_inline, held=HeldCheckpoints(), archive=archive)


@pytest.mark.parametrize("archive", [False, True])
def test_an_archive_keeps_every_payload_and_only_the_last_states(tmp_path, archive):
    participation = party(tmp_path, archive=archive)
    run_id = participation.run_id
    payloads = [write_payload(tmp_path, bytes([number]) * 100, run_id, number).id for number in range(1, 6)]
    state = write_state(tmp_path, SimpleNamespace(chunks=lambda run: chunk_state(
        {"theta": np.zeros(10, np.float32)}, {"round": 1, "run": run})), run_id)
    participation.states.forget_old_rounds(6)
    kept = set(checkpoint_ids(tmp_path))
    assert state.id not in kept
    assert (set(payloads) <= kept) == archive and payloads[-1] in kept


@pytest.mark.trio
@pytest.mark.parametrize("archive", [False, True])
async def test_an_archive_writes_the_others_payloads_it_fetched_to_the_store(tmp_path, monkeypatch, archive):
    participation = party(tmp_path, archive=archive)
    payload = bytes(range(256)) * 8
    chunks = chunk_state({PAYLOAD_TENSOR: np.frombuffer(payload, np.uint8)},
                         {"round": 1, "run": participation.run_id, "kind": "payload"}, level=FAST_LEVEL)
    frames = [frame for _ref, frame in chunks]
    manifest = chunks.manifest()

    async def fetched_into_memory(*_args, held, **_kwargs):  # what a download does with `held`
        for index, frame in enumerate(frames):
            held.hold(manifest).store(index, frame)
        return manifest

    monkeypatch.setattr("locomesh.node.exchange.allgather.download_checkpoint", fetched_into_memory)
    limits = payload_limits(participation.run_id, 1, len(payload), 1 << 20)
    got = await participation.exchange.allgather._download(1, MEMBERS[1].public_key, manifest.id, limits,
                                                 DownloadProgress(manifest.id))
    assert bytes(got) == payload
    assert manifest_path(tmp_path, manifest.id).exists() == archive
    if archive:
        assert load_payload(tmp_path, manifest.id, limits) == payload


def test_archive_is_a_config_setting_and_a_flag(tmp_path):
    assert load_config(data_dir=tmp_path, environ={}).archive == "off"
    assert load_config(data_dir=tmp_path, environ={}, flags={"archive": "on"}).archive == "on"
    assert load_config(data_dir=tmp_path, environ={"LOCOMESH_ARCHIVE": "on"}).archive == "on"


# --- fetching what the audit lacks from a peer ----------------------------------------------------


def as_seen(run: HandBuiltRun) -> None:
    """Make the run one the node merely knows, so that its daemon does not take part in it."""
    joined = run.data_dir / "runs" / "joined"
    (run.data_dir / "runs" / "seen").mkdir(parents=True, exist_ok=True)
    for path in joined.iterdir():
        path.rename(run.data_dir / "runs" / "seen" / path.name)


def test_with_fetch_the_daemon_downloads_the_missing_payloads_from_an_archive_and_the_audit_passes(honest, tmp_path, capsys):
    archive, auditor = honest.copy(tmp_path / "archive"), honest.copy(tmp_path / "auditor")
    for number in (1, 2):
        manifest_path(auditor.store, auditor.payloads[number][2]).unlink()  # the auditor keeps only its own
    manifest_path(auditor.store, auditor.states[1]).unlink()
    for run in (archive, auditor):
        as_seen(run)
    run_id = format_run_id(honest.run_id)
    assert main(["run", "audit", run_id, "--data-dir", str(auditor.data_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing"] == 2
    with open(tmp_path / "daemons.log", "wb") as log, DaemonProcess(archive.data_dir, log=log) as server:
        server.wait_ready()
        address = server.rpc().call("node.status")["listen_addrs"][0]
        with DaemonProcess(auditor.data_dir, log=log) as client:
            client.wait_ready()
            assert main(["run", "audit", run_id, "--data-dir", str(auditor.data_dir), "--json", "--fetch",
                         "--provider", address, "--wait", "60"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["ok"], result["missing"]) == (3, 0)
    # A first pass finds round 1's payload and state missing (the replay stops there), the second
    # round 2's payload, which only a replay that went on could see.
    lacking = {auditor.payloads[1][2].hex(), auditor.states[1].hex(), auditor.payloads[2][2].hex()}
    assert set(result["fetched"]) == lacking and set(result["fetched"].values()) == {"done"}


def test_fetch_needs_the_daemon(honest, tmp_path, capsys):
    auditor = honest.copy(tmp_path / "auditor")
    manifest_path(auditor.store, auditor.payloads[1][2]).unlink()
    assert main(["run", "audit", format_run_id(honest.run_id), "--data-dir", str(auditor.data_dir), "--fetch"]) == 3
