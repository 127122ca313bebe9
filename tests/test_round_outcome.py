"""What became of this node's part in a finished round (node/rounds/outcome.py), as the round
history keeps it and `run status` / `run watch` say it. Issue #37: a round this node trained and
then adopted by a download read "synced", as if its work had been discarded."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from types import SimpleNamespace

from locomesh.cli.run_view import format_status, outcome_text, round_line, round_table, show_status
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.history import RoundHistory
from locomesh.node.rounds.outcome import (
    AFTER_THE_CUT, CERTIFIED_FIRST, COUNTED, NOT_A_MEMBER, NOT_COUNTED, NOT_PROPOSED, SAT_OUT, SYNCED_ONLY,
    TRAINING_OVERTAKEN, Outcome, outcome_of, refusal, round_outcome,
)
from locomesh.node.rounds.work import RoundRecord, RoundWork
from locomesh.training.codec import CodecError

ME, A, B = b"m" * 32, b"a" * 32, b"b" * 32
H = b"\x01" * 32
EVALUATION = {"loss": 2.5, "floor": 1.6}


def sent(round_number: int = 32, **fields) -> RoundWork:
    """Our work on `round_number`: trained and committed."""
    return RoundWork(round_number, 0.0, committed=True, train_loss=1.705, train_seconds=1.5, payload_size=1000, **fields)


def outcome(work=None, *, accepted=frozenset({ME, A}), committed=False, in_our_cut=True, sitting_out=None,
            contributor=True) -> Outcome:
    return round_outcome(32, work, me=ME, accepted=accepted, committed=committed, in_our_cut=in_our_cut,
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
    assert outcome(sent(), accepted=frozenset({A}), in_our_cut=False) == Outcome(NOT_COUNTED, AFTER_THE_CUT)
    assert outcome(sent(), accepted=frozenset({A}), in_our_cut=None) == Outcome(NOT_COUNTED, CERTIFIED_FIRST)
    refused = outcome(sent(refused="bad-scale: a block scale is not finite"))
    assert refused == Outcome(NOT_COUNTED, "left out by the aggregator: bad-scale: a block scale is not finite")
    record = RoundRecord.of(rm.RoundDone(32, H, 0, synced=True), sent(), EVALUATION, 10.0,
                            outcome(sent(), accepted=frozenset({A}), in_our_cut=False)).to_json()
    assert outcome_text(record) == "contributed, not counted (committed after the cut)"


def test_a_round_without_our_payload_is_sat_out_or_synced_only():
    others = frozenset({A})
    assert outcome(accepted=others, sitting_out="outside the schedule 22:00-07:00") == (
        Outcome(SAT_OUT, "outside the schedule 22:00-07:00"))
    assert outcome(accepted=others, contributor=False) == Outcome(SAT_OUT, NOT_A_MEMBER)  # a late joiner's first rounds
    assert outcome(accepted=frozenset({A})) == Outcome(SYNCED_ONLY)  # a member catching up after a restart
    assert outcome(sent(31), accepted=frozenset({A})) == Outcome(SYNCED_ONLY), "another round's work says nothing"
    overtaken = RoundWork(32, 0.0)  # training, uncommitted, when the round was certified
    assert outcome(overtaken, accepted=frozenset({A}), sitting_out="paused") == Outcome(SYNCED_ONLY, TRAINING_OVERTAKEN)


def test_a_round_committed_before_a_restart_is_judged_by_the_run_not_by_the_work_lost_with_the_process():
    assert outcome(None, accepted=frozenset({ME})) == Outcome(COUNTED), "the certified set names us"
    assert outcome(None, accepted=frozenset({A}), committed=True, in_our_cut=None) == Outcome(NOT_COUNTED, CERTIFIED_FIRST)
    for kind, why, text in ((SAT_OUT, "paused", "sat out (paused)"), (SYNCED_ONLY, None, "synced only")):
        record = RoundRecord.of(rm.RoundDone(32, H, 0, synced=True), None, EVALUATION, 10.0, Outcome(kind, why))
        assert f", {text}; " in round_line(record.to_json())


def test_the_machine_remembers_whether_our_commit_made_our_cut_past_the_round():
    machine = rm.RoundMachine(ME)
    machine.handle(rm.Observation(0.0, 0, None, frozenset({ME, A, B}), {}))
    both = {A: (b"pa" * 16, 10), B: (b"pb" * 16, 10)}
    machine.handle(rm.Observation(1.0, 0, None, frozenset({ME, A, B}), both))
    machine.handle(rm.Fetched(1, A, True, 1.5))
    machine.handle(rm.Fetched(1, B, True, 1.6))
    assert machine.in_our_cut(1) is None, "no cut yet"
    machine.handle(rm.Trained(1, b"p" * 32, 100, 4.0, 5.0))  # the cutoff was at 3.0
    assert machine.in_our_cut(1) is False
    assert machine.handle(rm.Observation(6.0, 1, H, frozenset({ME, A, B}), {})) == [rm.Discard(1), rm.StartSync(1, H)]
    machine.handle(rm.Synced(1, H, 7.0))
    assert machine.in_our_cut(1) is False and machine.in_our_cut(2) is None, "outlives the round's state"


def participation(work, *, paused=False, accepted=frozenset({ME}), members=frozenset({ME, A}), in_our_cut=True):
    certificates = {32: SimpleNamespace(accepted=accepted)}
    commits = {} if work is None or not work.committed else {ME: (b"p" * 32, 1000)}
    return SimpleNamespace(
        work=work, me=ME, paused=paused, sitting_out=lambda: "outside the schedule 22:00-07:00",
        replica=SimpleNamespace(state=SimpleNamespace(certificates=certificates), contributors=lambda r: set(members),
                                commits=lambda r: commits),
        machine=SimpleNamespace(in_our_cut=lambda r: in_our_cut if r == 32 else None))


def test_a_participation_asks_the_certificate_its_cut_and_its_schedule():
    assert outcome_of(participation(sent()), 32) == Outcome(COUNTED)
    assert outcome_of(participation(sent(), accepted=frozenset({A}), in_our_cut=False), 32) == (
        Outcome(NOT_COUNTED, AFTER_THE_CUT))
    others = frozenset({A})
    assert outcome_of(participation(None, accepted=others), 32) == (
        Outcome(SAT_OUT, "outside the schedule 22:00-07:00"))
    assert outcome_of(participation(None, accepted=others, paused=True), 32) == Outcome(SAT_OUT, "paused")
    uncertified = participation(None)
    uncertified.replica.state.certificates, uncertified.replica.commits = {}, lambda r: {ME: (b"p" * 32, 1000)}
    assert outcome_of(uncertified, 32).kind == "contributed", "a commit of ours, before a restart"
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
    assert "  round 7: contributed, not counted (committed after the cut)\n" in shown.getvalue()
    assert "contributed, not counted (committed after the cut); train 1.5 s" in format_status(status)


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
