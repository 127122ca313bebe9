"""What became of this node's part in a finished round (node/rounds/outcome.py), as the round
history keeps it and `run status` / `run watch` say it. Issue #37: a round this node trained and
then adopted by a download read "synced", as if its work had been discarded."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from types import SimpleNamespace

from locomesh.cli.run_view import format_status, outcome_text, round_line, round_table, show_status
from locomesh.crdt import Replica, Value
from locomesh.node.agreement.proposing import own_value
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.history import RoundHistory
from locomesh.node.rounds.outcome import (
    AFTER_THE_CUT, CERTIFIED_FIRST, CONTRIBUTED, COUNTED, NOT_A_MEMBER, NOT_COUNTED, NOT_PROPOSED, SAT_OUT,
    SYNCED_ONLY, TRAINING_OVERTAKEN, Outcome, outcome_of, refusal, round_outcome,
)
from locomesh.node.rounds.work import RoundRecord, RoundWork
from locomesh.protocol import Identity
from locomesh.training.codec import CodecError

from .test_crdt_support import certify, in_causal_order, joined_replica, keys

ME, A, B = b"m" * 32, b"a" * 32, b"b" * 32
H = b"\x01" * 32
EVALUATION = {"loss": 2.5, "floor": 1.6}


def sent(round_number: int = 32, **fields) -> RoundWork:
    """Our work on `round_number`: trained and committed."""
    return RoundWork(round_number, 0.0, committed=True, train_loss=1.705, train_seconds=1.5, payload_size=1000, **fields)


def outcome(work=None, *, accepted=frozenset({ME, A}), committed=False, proposed=True, sitting_out=None,
            contributor=True) -> Outcome:
    return round_outcome(32, work, me=ME, accepted=accepted, committed=committed, proposed=proposed,
                         sitting_out=sitting_out, contributor=contributor)


def test_a_trained_round_adopted_by_a_download_says_our_payload_counted_not_synced():
    done = rm.RoundDone(32, H, 0, synced=True)  # certified while we collected: the state was downloaded
    record = RoundRecord.of(done, sent(), EVALUATION, 10.0, outcome(sent())).to_json()
    assert record["outcome"] == COUNTED and record["outcome_why"] is None
    assert record["synced"] is True and record["contributors"] == 0, "the old fields stay, for scripts and dashboards"
    line = round_line(record)
    assert "train loss 1.7050, contributed, counted; " in line and "synced" not in line
    assert round_table([record]).rows[0][5:7] == ("counted", "-")


def test_a_payload_left_out_says_why_where_this_node_knows():
    assert outcome(sent(), accepted=frozenset({A})) == Outcome(NOT_COUNTED, NOT_PROPOSED)
    assert outcome(sent(), accepted=frozenset({A}), proposed=False) == Outcome(NOT_COUNTED, AFTER_THE_CUT)
    assert outcome(sent(), accepted=frozenset({A}), proposed=None) == Outcome(NOT_COUNTED, CERTIFIED_FIRST)
    refused = outcome(sent(refused="bad-scale: a block scale is not finite"))
    assert refused == Outcome(NOT_COUNTED, "left out by the aggregator: bad-scale: a block scale is not finite")
    record = RoundRecord.of(rm.RoundDone(32, H, 0, synced=True), sent(), EVALUATION, 10.0,
                            outcome(sent(), accepted=frozenset({A}), proposed=False)).to_json()
    assert outcome_text(record) == f"contributed, not counted ({AFTER_THE_CUT})"


def test_a_round_without_our_payload_is_sat_out_or_synced_only():
    others = frozenset({A})
    assert outcome(accepted=others, sitting_out="outside the schedule 22:00-07:00") == (
        Outcome(SAT_OUT, "outside the schedule 22:00-07:00"))
    assert outcome(accepted=others, contributor=False) == Outcome(SAT_OUT, NOT_A_MEMBER)  # a late joiner's first rounds
    assert outcome(accepted=frozenset({A})) == Outcome(SYNCED_ONLY)  # a member catching up after a restart
    assert outcome(sent(31), accepted=frozenset({A})) == Outcome(SYNCED_ONLY), "another round's work says nothing"
    overtaken = RoundWork(32, 0.0, training=True)  # training, uncommitted, when the round was certified
    assert outcome(overtaken, accepted=frozenset({A}), sitting_out="paused") == Outcome(SYNCED_ONLY, TRAINING_OVERTAKEN)


def test_a_round_committed_before_a_restart_is_judged_by_the_run_not_by_the_work_lost_with_the_process():
    assert outcome(None, accepted=frozenset({ME})) == Outcome(COUNTED), "the certified set names us"
    assert outcome(None, accepted=frozenset({A}), committed=True, proposed=None) == Outcome(NOT_COUNTED, CERTIFIED_FIRST)
    for kind, why, text in ((SAT_OUT, "paused", "sat out (paused)"), (SYNCED_ONLY, None, "synced only")):
        record = RoundRecord.of(rm.RoundDone(32, H, 0, synced=True), None, EVALUATION, 10.0, Outcome(kind, why))
        assert f", {text}; " in round_line(record.to_json())


# --- asked of the run: a real replica, its certificates and its proposals ---------------------------

CREATOR, US, OTHER = EVERYONE = keys(3, offset=400)
ALL_BUT_US = [CREATOR, OTHER]


def _run() -> Replica:
    """A run of three (all admitted at genesis) whose round 1 is certified; round 2 is under way."""
    replica = joined_replica(EVERYONE)
    certify(replica, EVERYONE)
    assert replica.chain.tip.round == 2 and len(replica.chain.tip.electorate) == 3
    return replica


def _commit(replica: Replica, *who: Identity) -> None:
    for identity in who:
        replica.create(identity, "commit", round=replica.chain.tip.round, hash=identity.public_key, size=10)


def _propose(replica: Replica, held: list[Identity], attempt: int = 0) -> Value:
    """The proposer of `attempt` proposes the commits of `held` it holds (the others it could not fetch)."""
    chain = replica.chain
    value = own_value(chain, replica.facts, {identity.public_key for identity in held})
    proposer = next(identity for identity in EVERYONE if identity.public_key == chain.proposer(attempt))
    replica.create(proposer, "proposal", round=chain.tip.round, epoch=0, attempt=attempt, valid=0, **value.fields())
    return value


def _decide(replica: Replica, value: Value, attempt: int = 0) -> None:
    for identity in EVERYONE:
        replica.create(identity, "precommit", round=value.round, epoch=0, attempt=attempt, value=value.id, state=H)
    assert replica.chain.round == value.round


def participation(replica: Replica, work: RoundWork | None, *, paused: bool = False, sitting_out: str | None = None):
    """What `outcome_of` reads of a `RunParticipation`: its replica, work, key and schedule."""
    return SimpleNamespace(replica=replica, work=work, me=US.public_key, paused=paused, sitting_out=lambda: sitting_out)


def test_whether_a_proposal_named_our_commit_is_read_from_the_run_and_outlives_the_round_and_a_restart():
    """Why our payload was left out: no proposal named it (the proposers cut before it came, or
    could not fetch it), or one did but the round decided another. The proposals are the run's
    ops: the answer is the same rounds later, and after a restart that lost our work."""
    counted = _run()
    _commit(counted, *EVERYONE)
    _decide(counted, _propose(counted, EVERYONE))
    assert outcome_of(participation(counted, sent(2)), 2) == Outcome(COUNTED)

    unfetched = _run()
    _commit(unfetched, *EVERYONE)
    _decide(unfetched, _propose(unfetched, ALL_BUT_US))
    assert outcome_of(participation(unfetched, sent(2)), 2) == Outcome(NOT_COUNTED, AFTER_THE_CUT)

    outvoted = _run()
    _commit(outvoted, *EVERYONE)
    _propose(outvoted, EVERYONE, attempt=0)  # named ours; the members moved on to attempt 1
    _decide(outvoted, _propose(outvoted, ALL_BUT_US, attempt=1), attempt=1)
    assert outcome_of(participation(outvoted, sent(2)), 2) == Outcome(NOT_COUNTED, NOT_PROPOSED)
    certify(outvoted, EVERYONE)  # round 3: the run goes on
    assert outvoted.chain.round == 3
    assert outcome_of(participation(outvoted, sent(3)), 2) == Outcome(NOT_COUNTED, NOT_PROPOSED)
    restarted = Replica(outvoted.genesis)
    for data in in_causal_order(outvoted):
        restarted.add(data)
    assert outcome_of(participation(restarted, None), 2) == Outcome(NOT_COUNTED, NOT_PROPOSED)

    late = _run()
    _commit(late, *ALL_BUT_US)
    _decide(late, _propose(late, ALL_BUT_US))
    assert outcome_of(participation(late, sent(2)), 2) == Outcome(NOT_COUNTED, CERTIFIED_FIRST)  # ours not seen
    late.create(US, "commit", round=2, hash=US.public_key, size=10)  # seen once the round was decided
    assert outcome_of(participation(late, sent(2)), 2) == Outcome(NOT_COUNTED, AFTER_THE_CUT)


def test_a_participation_asks_the_certificate_the_proposals_and_its_schedule():
    run = _run()
    _commit(run, *ALL_BUT_US)
    _decide(run, _propose(run, ALL_BUT_US))
    schedule = "outside the schedule 22:00-07:00"
    assert outcome_of(participation(run, None, sitting_out=schedule), 2) == Outcome(SAT_OUT, schedule)
    assert outcome_of(participation(run, None, paused=True, sitting_out=schedule), 2) == Outcome(SAT_OUT, "paused")
    assert outcome_of(participation(run, None), 2) == Outcome(SYNCED_ONLY)
    assert outcome_of(participation(run, RoundWork(2, 0.0, training=True)), 2) == Outcome(SYNCED_ONLY, TRAINING_OVERTAKEN)
    _commit(run, US)  # round 3, not certified yet
    assert outcome_of(participation(run, None), 3) == Outcome(CONTRIBUTED), "a commit of ours, before a restart"
    stranger = SimpleNamespace(replica=run, work=None, me=b"s" * 32, paused=False, sitting_out=lambda: None)
    assert outcome_of(stranger, 2) == Outcome(SAT_OUT, NOT_A_MEMBER), "a key on no roster"
    result = SimpleNamespace(rejected={ME: CodecError("bad-scale", "a block scale is not finite"), A: CodecError("x", "y")})
    assert refusal(result, ME) == "bad-scale: a block scale is not finite"
    assert refusal(SimpleNamespace(rejected={A: CodecError("x", "y")}), ME) is None
    assert refusal(None, ME) is None, "the simulator's participant says nothing"


def test_the_history_keeps_the_outcome_and_still_reads_records_kept_before_it(tmp_path):
    run_id = bytes(32)
    history = RoundHistory.load(tmp_path, run_id, maxlen=5)
    history.append(RoundRecord.of(rm.RoundDone(31, H, 0, synced=True), sent(31), EVALUATION, 1.0,
                                  Outcome(NOT_COUNTED, NOT_PROPOSED)))
    with open(history.path, "a") as file:  # as an earlier version wrote it: no outcome
        old = {**history[0].to_json(), "round": 32}
        del old["outcome"], old["outcome_why"]
        file.write(json.dumps(old) + "\n")
    again = [record.to_json() for record in RoundHistory.load(tmp_path, run_id, maxlen=5)]
    assert (again[0]["outcome"], again[0]["outcome_why"]) == (NOT_COUNTED, NOT_PROPOSED)
    assert again[1]["outcome"] is None and outcome_text(again[1]) == "contributed", "a train loss: we sent a payload"


def test_run_status_says_under_its_table_why_a_payload_was_left_out():
    left_out = RoundRecord.of(rm.RoundDone(7, H, 0, synced=True), sent(7), EVALUATION, 1.0,
                              Outcome(NOT_COUNTED, AFTER_THE_CUT)).to_json()
    status = {"run_id": "r" * 52, "phase": "train", "training": True, "round": 7, "certified": 7, "members": 2,
              "peers": 1, "waiting": None, "history": [left_out]}
    shown = io.StringIO()
    with redirect_stdout(shown):
        show_status(status)
    assert f"  round 7: contributed, not counted ({AFTER_THE_CUT})\n" in shown.getvalue()
    assert f"contributed, not counted ({AFTER_THE_CUT}); train 1.5 s" in format_status(status)


def test_in_a_simulated_run_rounds_adopted_by_a_download_still_count_and_a_straggler_says_why_it_did_not():
    """netsim `train` (the daemon's round code, virtual time): followers that take round 1's state
    by a download were counted; a node training four times slower is overtaken every round."""
    import tempfile
    from pathlib import Path

    from locomesh.netsim.scenarios import train
    from locomesh.netsim.simulation import run_simulation

    config = train.Config(nodes=4, rounds=2, inner_steps=4, step_seconds=0.5, join_window=1.0, payload_bytes=8 * 1024,
                          slow=1, slow_factor=4.0)

    async def main(sim):
        with tempfile.TemporaryDirectory() as directory:
            run = train._Run(sim, config, Path(directory), lambda line: None)
            await run.train()
            return {member.kind + member.name: [record.to_json() for record in member.participation(run.run_id).history]
                    for member in run.members}

    histories = run_simulation(3, main)
    honest = [record for name, records in histories.items() if name.startswith("honest") for record in records]
    assert honest and all(record["outcome"] == COUNTED for record in honest)
    assert any(record["synced"] for record in honest), "some were adopted by a download, and counted all the same"
    assert all("synced" not in round_line(record) for record in honest)
    (slow,) = [records for name, records in histories.items() if name.startswith("slow")]
    assert slow and all((r["outcome"], r["outcome_why"]) == (SYNCED_ONLY, TRAINING_OVERTAKEN) for r in slow), slow
