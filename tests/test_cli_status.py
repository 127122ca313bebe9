"""`run status` (labelled times, members by peer ID, what the round waits for, `--follow`, the rounds
kept after `run leave` and a restart), `run state`'s members, Ctrl-C in any command, and `status`'s
protocol errors: each message and exit code."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

import pytest

from locomesh.cli import run_cmd, watch_cmd
from locomesh.cli.client import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, RpcCallError
from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.main import main
from locomesh.cli.run_state import format_state
from locomesh.cli.run_view import format_status
from locomesh.cli.status_cmd import format_status as format_node_status
from locomesh.cli.swarm_cmd import create_run, join
from locomesh.node.rounds.history import MAX_LINE_BYTES, RoundHistory, read_history
from locomesh.node.rounds.work import RoundRecord
from locomesh.node.runtime import Node
from locomesh.protocol import peer_id_from_public_key

KEYS = [bytes([index]) * 32 for index in range(1, 4)]
PEERS = [peer_id_from_public_key(key) for key in KEYS]


def record(round_number: int) -> RoundRecord:
    return RoundRecord(round=round_number, state_hash="ab" * 32, synced=False, contributors=3, train_loss=2.5,
                       eval_loss=2.4, floor=1.6, payload_bytes=1000, bytes_fetched=2000, seconds=3.0,
                       train_seconds=1.5, exchange_seconds=0.5, fetch_seconds=0.25, aggregate_seconds=0.125,
                       finished_at=1_700_000_000.0 + round_number)


def training_status() -> dict:
    members = [{"peer_id": peer, "key": key.hex(), "you": index == 0, "connected": index == 1}
               for index, (peer, key) in enumerate(zip(PEERS, KEYS))]
    return {"run_id": "r" * 52, "phase": "committed", "training": True, "round": 4, "certified": 3, "members": 3,
            "peers": 1, "waiting": {"for": "precommits of more than two thirds of 3", "on": PEERS[1:]},
            "say": {"has": True, "why": "in the electorate"}, "earning": {},
            "member_peers": members, "contributions": {KEYS[1].hex(): 2}, "history": [record(3).to_json()]}


def test_run_status_names_what_the_round_waits_for_and_the_members_by_peer_id():
    text = format_status(training_status())
    assert (f"  now: round 5: payload sent: agreeing on the round's set; waiting for precommits of more than two "
            f"thirds of 3 from {PEERS[1]}, {PEERS[2]}") in text
    assert "  say: yes, this node votes on the rounds (in the electorate)" in text
    assert f"    {PEERS[0]}  this node, 0 aggregated" in text
    assert f"    {PEERS[1]}  connected, 2 aggregated" in text and f"    {PEERS[2]}  not connected" in text
    assert KEYS[1].hex() not in text, "members by peer ID, not by key"
    assert "train 1.5 s, exchange 0.5 s (fetch 0.2 s, outer step 0.1 s), round 3.0 s" in text, "every time named"


def agreement(**fields) -> dict:
    """`waiting` while the round's agreement runs here (node/rounds/status.py `round_clock`)."""
    return {"for": "prevotes of more than two thirds of 3", "on": PEERS[2:], "unreachable": PEERS[2:], "attempt": 1,
            "epoch": 0, "step": "prevote", "waited_s": 40.2, "deadline_s": 180.0, "usual_s": 12.0, "stuck": None,
            "next": "precommit once two thirds prevote one value; a recover is due in 140 s", **fields}


def test_run_status_says_where_the_agreement_stands_and_what_comes_next():
    text = format_status({**training_status(), "waiting": agreement()})
    assert (f"  now: round 5: payload sent: agreeing on the round's set; waiting for prevotes of more than two thirds "
            f"of 3 from {PEERS[2]} (not connected) (attempt 1, prevote step: 40 s of the 180 s before a recover, a "
            "round usually takes 12 s); next: precommit once two thirds prevote one value; a recover is due in "
            "140 s") in text.splitlines()
    assert "FAIL" not in text and "fix:" not in text, "a round that may still advance is not stuck"
    recovering = format_status({**training_status(), "waiting": agreement(epoch=2, usual_s=None)})
    assert "(attempt 1, recovery epoch 2, prevote step: 40 s of the 180 s before a recover); next: " in recovering


def test_run_status_says_why_a_stuck_round_is_stuck_and_the_fix():
    stuck = {"cause": "round 5 has had no certificate for 200 s: 2 of the 3 members of its electorate sent nothing",
             "fix": "start the silent members' nodes (locomesh node start), or wait for the others' recovers"}
    lines = format_status({**training_status(), "waiting": agreement(waited_s=200.0, stuck=stuck)}).splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("  now: "))
    assert lines[at + 1:at + 3] == [f"  FAIL  stuck: {stuck['cause']}", f"        fix: {stuck['fix']}"]


def test_run_status_says_how_many_counted_rounds_a_fresh_key_still_needs_for_a_say():
    fresh = {**training_status(), "say": {"has": False, "why": "earning a say: 2 more counted round(s), then a place "
                                                                "in the rounds' draw of new voters"},
             "earning": {PEERS[0]: 2, PEERS[2]: 1}}
    text = format_status(fresh)
    assert ("  say: none yet, earning one: 2 more counted rounds (rounds whose certified set counts our payload), "
            "then a place in the rounds' draw of new voters") in text.splitlines()
    assert f"    {PEERS[0]}  this node, 0 aggregated, earning a say (2 more counted rounds)" in text
    assert f"    {PEERS[2]}  not connected, 0 aggregated, earning a say (1 more counted round)" in text
    assert f"    {PEERS[1]}  connected, 2 aggregated\n" in text, "a member with a say earns none"
    joining = {**fresh, "say": {"has": False, "why": "not on the run's roster: a join waits for a round to admit it"},
               "earning": {}}
    assert "  say: none (not on the run's roster: a join waits for a round to admit it)" in format_status(joining)


def test_run_status_of_a_run_left_says_so_above_its_rounds():
    left = {"run_id": "r" * 52, "phase": "left", "training": False, "left_after": 7,
            "history": [record(6).to_json(), record(7).to_json()]}
    lines = format_status(left).splitlines()
    assert lines[0] == f"run {'r' * 52}: not training (left after round 7); 2 rounds it finished here kept"
    assert lines[-1].startswith("  round    7: eval loss 2.4000")


def test_run_state_lists_members_and_bans_by_peer_id():
    state = {"run_id": "r", "round": 2, "members": [KEYS[0].hex(), KEYS[1].hex()], "banned": [KEYS[2].hex()],
             "checkpoint": None, "snapshot": None, "ops": 5, "heads": 1, "pending": 0, "wanted": 0, "hparams": {}}
    text = format_state(state)
    assert f"member      {PEERS[0]}" in text or f"member      {PEERS[1]}" in text
    assert all(peer in text for peer in PEERS) and KEYS[0].hex() not in text


def test_status_explains_protocol_errors_by_code_and_counts_early_ends_apart():
    status = {"protocol_errors": 3, "protocol_errors_by_code": {"timeout": 2, "too-large": 1},
              "streams_ended_early": {"stream-failed": 4, "unknown-run": 1}}
    lines = format_node_status(status).splitlines()
    assert ("protocol errors      3 (timeout 2, too-large 1): bad or slow input from peers, dropped "
            "(the log at INFO names each peer)") in lines
    assert any(line.startswith("streams ended early  5 (stream-failed 4, unknown-run 1): peers that closed")
               and line.endswith("normal, not errors") for line in lines)
    assert "protocol errors  0" in format_node_status({"protocol_errors": 0}).splitlines()


def test_streams_a_healthy_peer_ends_are_not_counted_as_protocol_errors(identity_factory):
    node = Node.create(identity_factory(1), listen_addrs=[])
    for code in ("timeout", "stream-failed", "closed", "unknown-run", "timeout"):
        node.count_protocol_error(code)
    errors = dict(node.metrics["locomesh_protocol_errors_total"].samples())
    ended = dict(node.metrics["locomesh_streams_ended_early_total"].samples())
    assert errors == {("timeout",): 2}
    assert ended == {("closed",): 1, ("stream-failed",): 1, ("unknown-run",): 1}


def test_the_round_history_survives_a_reload_stays_bounded_and_skips_bad_lines(tmp_path):
    run_id = bytes(32)
    history = RoundHistory.load(tmp_path, run_id, maxlen=3)
    for round_number in range(1, 9):
        history.append(record(round_number))
    assert [r.round for r in history] == [6, 7, 8]
    assert len(history.path.read_text().splitlines()) <= 2 * 3, "rewritten with the newest once twice the cap"
    with open(history.path, "a") as file:  # a torn line, an edit, a line too long: skipped
        file.write('{"round": 9, "bogus": 1}\n' + "x" * (MAX_LINE_BYTES + 1) + '\n{"round": 10, "synced"')
    again = RoundHistory.load(tmp_path, run_id, maxlen=3)
    assert list(again) == list(history) and again[-1] == record(8)
    assert [r.round for r in read_history(tmp_path, run_id, 3)] == [6, 7, 8]
    again.append(record(9))  # not swallowed by the torn line before it
    assert [r.round for r in RoundHistory.load(tmp_path, run_id, maxlen=3)] == [7, 8, 9]


def test_ctrl_c_ends_any_command_with_one_line_and_130(monkeypatch, tmp_path, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cmd.RpcClient, "for_data_dir", interrupted)
    assert main(["run", "join", "r", "--data-dir", str(tmp_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "locomesh: interrupted\n"


class ScriptedDaemon:
    """An `RpcClient` stand-in answering ``run.status`` with each of `answers` in turn (an exception: raised)."""

    def __init__(self, answers: list) -> None:
        self.answers = iter(answers)

    def call(self, method: str, params: dict | None = None) -> dict:
        answer = next(self.answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_run_status_follow_prints_new_rounds_and_what_changed_until_ctrl_c(capsys):
    first = training_status()
    later = {**first, "phase": "train", "round": 4, "certified": 4, "waiting": {"for": "our inner steps", "on": []},
             "history": [record(3).to_json(), record(4).to_json()]}
    daemon = ScriptedDaemon([first, first, later, KeyboardInterrupt()])
    assert watch_cmd.follow_status(daemon, "r", interval=0.01) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run rrrr") and sum(line.startswith("  now: ") for line in lines) == 2, lines
    assert lines[-2].startswith("  round    4: eval loss") and lines[-1] == (
        "  now: round 5: training (inner steps); waiting for our inner steps")


def test_run_status_follow_says_once_when_the_round_gets_stuck(capsys):
    def stuck(seconds: int) -> dict:
        return agreement(waited_s=float(seconds), next="signed a recover",
                         stuck={"cause": f"round 5 has had no certificate for {seconds} s", "fix": "start the nodes"})

    going = {**training_status(), "waiting": agreement()}
    daemon = ScriptedDaemon([going, {**going, "waiting": stuck(200)}, {**going, "waiting": stuck(201)}, KeyboardInterrupt()])
    assert watch_cmd.follow_status(daemon, "r", interval=0.01) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    failing = [index for index, line in enumerate(lines) if "FAIL" in line]
    assert len(failing) == 1, "said once, not at every poll"
    assert lines[failing[0] - 1].startswith("  now: ") and lines[failing[0]:failing[0] + 2] == [
        "  FAIL  stuck: round 5 has had no certificate for 200 s", "        fix: start the nodes"]


def test_run_status_follow_ends_with_0_when_the_node_left_and_watch_with_1(capsys):
    left = {"run_id": "r" * 52, "phase": "left", "training": False, "left_after": 3, "history": [record(3).to_json()]}
    assert watch_cmd.follow_status(ScriptedDaemon([training_status(), left]), "r", interval=0.01) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "  not training (left after round 3)"
    watching = argparse.Namespace(run_id="r", json=False, until=None, timeout=None, interval=0.01)
    assert watch_cmd._watch_lines(watching, ScriptedDaemon([left])) == EXIT_ERROR
    assert "training stopped: this node left it after round 3" in capsys.readouterr().err


def locomesh(daemon: DaemonProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "locomesh.cli.main", *args, "--data-dir", str(daemon.data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def follow(daemon: DaemonProcess, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "locomesh.cli.main", *args, "--data-dir", str(daemon.data_dir)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt(process: subprocess.Popen) -> tuple[int, str, str]:
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


def lines_until(process: subprocess.Popen, wanted, limit: float = 120) -> list[str]:
    """`process`'s stdout lines up to the first one `wanted` accepts."""
    deadline = time.monotonic() + limit
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"the command ended first: {seen}"
        seen.append(line.rstrip("\n"))
        if wanted(seen[-1]):
            return seen
    raise AssertionError(f"no such line within {limit} s: {seen}")


@pytest.mark.slow  # a daemon that trains, stops and starts again: about 30 s
def test_run_status_follows_rounds_and_keeps_them_after_a_leave_and_a_restart(tmp_path):
    log = open(tmp_path / "daemon.log", "wb")
    daemon = DaemonProcess(tmp_path / "node", log=log, env=None).start()
    try:
        daemon.wait_ready()
        run_id = create_run(daemon, {"inner_steps": 3, "round_deadline_s": 60, "min_peers": 1})
        joining = follow(daemon, "run", "join", run_id, "--follow")
        lines_until(joining, lambda line: line.startswith("finding the run"))
        code, _out, err = interrupt(joining)  # Ctrl-C in the join's start-up
        assert code == EXIT_INTERRUPTED and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        join(daemon, run_id)  # the daemon went on joining: this returns at once

        following = follow(daemon, "run", "status", run_id, "--follow", "--interval", "0.2")
        seen = lines_until(following, lambda line: line.startswith("  round    2: "))
        code, _out, err = interrupt(following)
        assert code == EXIT_OK and "Traceback" not in err, err
        assert seen[0].startswith(f"run {run_id}: ") and any(line.startswith("  now: round ") for line in seen)
        assert "; train " in seen[-1] and ", round " in seen[-1]

        left = locomesh(daemon, "run", "leave", run_id)
        assert left.returncode == 0, left.stderr
        for when in ("after the leave", "after a restart"):
            shown = locomesh(daemon, "run", "status", run_id)
            assert shown.returncode == 0, (when, shown.stderr)
            assert "not training (left after round" in shown.stdout.splitlines()[0], (when, shown.stdout)
            assert "  round    2: eval loss" in shown.stdout, when
            as_json = json.loads(locomesh(daemon, "run", "status", run_id, "--json").stdout)
            assert as_json["phase"] == "left" and [r["round"] for r in as_json["history"]][:2] == [1, 2]
            if when == "after the leave":
                daemon.stop()
                daemon.start().wait_ready()
        assert run_id[:16] not in json.dumps(daemon.rpc().call("node.status").get("training")), "a run left stays left"
    finally:
        daemon.stop()
        log.close()


# --- issue #37: plain reasons, next steps, counts ---------------------------------------------------


def daemon_answering(monkeypatch, answers: list) -> None:
    """Every command's `RpcClient` is a `ScriptedDaemon` answering `answers` in turn."""
    monkeypatch.setattr(run_cmd.RpcClient, "for_data_dir", classmethod(lambda cls, *a, **k: ScriptedDaemon(answers)))


@pytest.mark.parametrize("command", [["run", "watch", "abcdefgh"], ["run", "report", "abcdefgh", "--out", "out"],
                                     ["run", "status", "abcdefgh"], ["run", "join", "abcdefgh", "--no-follow"]])
def test_a_refused_call_prints_the_reason_alone_whatever_method_the_command_called(command, monkeypatch, tmp_path,
                                                                                     capsys):
    """`run watch` and `run report` call ``run.status``: their errors began "run.status failed: invalid
    params: ...", the RPC's words, not the command's."""
    reason = "no such run: no run this node knows starts with 'abcdefgh'"
    daemon_answering(monkeypatch, [RpcCallError(-32004, reason)])
    assert main([*command, "--data-dir", str(tmp_path)]) == EXIT_ERROR
    assert capsys.readouterr().err == f"locomesh: {reason}\n"
    daemon_answering(monkeypatch, [RpcCallError(-32602, "invalid params: 'x' is not a run ID")])
    assert main([*command, "--data-dir", str(tmp_path)]) == EXIT_ERROR
    assert capsys.readouterr().err == "locomesh: 'x' is not a run ID\n"


def test_run_create_says_how_to_join_the_run_on_stderr_leaving_stdout_to_the_id(monkeypatch, tmp_path, capsys):
    run_id = "a" * 51 + "q"
    daemon_answering(monkeypatch, [{"run_id": run_id, "public": True}])
    assert main(["run", "create", "--task", "synthetic-lm", "--public", "--data-dir", str(tmp_path / "my node")]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out == f"{run_id}\n"
    assert err == (f"run created; this node does not train in it until it joins: locomesh run join {run_id} "
                   f"--data-dir '{tmp_path / 'my node'}' (others find it with: locomesh run browse); joiners earn a say "
                   "by counted work, one new voter every few rounds at first: admit your own team with --admit PEER_ID "
                   "or `locomesh run admit`\n")
    daemon_answering(monkeypatch, [{"run_id": run_id, "public": False}])
    assert main(["run", "create", "--task", "synthetic-lm", "--admission", "creator", "--data-dir", str(tmp_path)]) == EXIT_OK
    assert capsys.readouterr().err.endswith(f"locomesh run join {run_id} --data-dir {tmp_path}\n")


def test_watch_until_a_round_done_before_this_nodes_record_says_so(monkeypatch, tmp_path, capsys):
    """A node that joined at round 10 has no record of round 3: `run watch --until 3` printed nothing."""
    later = {**training_status(), "round": 11, "history": [record(10).to_json(), record(11).to_json()]}
    daemon_answering(monkeypatch, [later])
    assert main(["run", "watch", "r", "--until", "3", "--data-dir", str(tmp_path)]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out == "" and err == ("locomesh: round 3 is already done; this node has no record of it to show "
                                 "(its record of the run holds rounds 10 to 11)\n")
    daemon_answering(monkeypatch, [later])
    assert main(["run", "watch", "r", "--until", "10", "--data-dir", str(tmp_path)]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out.startswith("round   10: eval loss") and err == ""


def test_counts_of_one_read_in_the_singular():
    alone = {**training_status(), "members": 1, "peers": 1,
             "history": [{**record(3).to_json(), "contributors": 1}]}
    text = format_status(alone)
    assert "1 member, 1 peer connected" in text and "1 payload aggregated," in text
    assert "3 members, 1 peer connected" in format_status(training_status())
    left = {"run_id": "r" * 52, "phase": "left", "training": False, "left_after": 7, "history": [record(7).to_json()]}
    assert format_status(left).splitlines()[0].endswith("; 1 round it finished here kept")
