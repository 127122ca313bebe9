"""`run pause` / `run resume` between real daemons on loopback: a paused node contributes to no
round but keeps the run's state current, the run goes on without waiting for it, and resuming
trains from the state it holds (no catch-up download)."""

from __future__ import annotations

import subprocess
import sys
import time

from locomesh.cli.client import EXIT_ERROR
from locomesh.cli.swarm_cmd import create_run, hashes_at, join_all, start_swarm, stop_swarm, wait_connected

PAUSED = 2


def locomesh(daemon, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "locomesh.cli.main", *args, "--data-dir", str(daemon.data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def status(daemon, run_id):
    return daemon.rpc(timeout=30.0).call("run.status", {"run_id": run_id})


def wait_until(daemons, run_id, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = [status(daemon, run_id) for daemon in daemons]
        if predicate(seen):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}: {[(s['phase'], s['round'], s['certified']) for s in seen]}")


def test_a_paused_node_keeps_its_state_current_and_resumes_without_a_download(tmp_path):
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 3, log=log)
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 4, "round_deadline_s": 60, "min_peers": 2}, admitted=daemons)
        join_all(daemons, run_id)
        wait_until(daemons, run_id, lambda s: min(x["round"] for x in s) >= 1, 120, "round 1 everywhere")

        paused = locomesh(daemons[PAUSED], "run", "pause", run_id[:16])
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith(f"run {run_id} paused: no contribution after round ")
        last_own = int(paused.stdout.split("after round ")[1].split(";")[0])

        # The run goes on with two contributors; the paused node follows every certified round.
        seen = wait_until(daemons, run_id, lambda s: s[PAUSED]["round"] >= last_own + 3 and s[PAUSED]["phase"] == "paused",
                          180, "three rounds past the pause")
        quiet = [r for r in seen[PAUSED]["history"] if r["round"] > last_own + 1]
        # It sends nothing; it still votes (it computes each value's state to precommit it), so it
        # keeps its place in the electorate.
        assert quiet and all(record["train_loss"] is None and not record["payload_bytes"] for record in quiet), \
            ("a paused node trains nothing", quiet)
        assert seen[PAUSED]["sitting_out"].startswith("paused")
        assert seen[PAUSED]["say"]["has"], "it keeps its place in the electorate"
        others = [r for r in seen[0]["history"] if r["round"] > last_own + 1]
        assert others and all(record["contributors"] == 2 for record in others), "nobody waits for the paused node"

        current = status(daemons[PAUSED], run_id)
        assert current["round"] == current["certified"], "the paused node holds the newest certified state"
        resumed = locomesh(daemons[PAUSED], "run", "resume", run_id[:16])
        assert resumed.returncode == 0 and " resumed at round " in resumed.stdout, resumed.stderr
        at_resume = int(resumed.stdout.split(" resumed at round ")[1].split(":")[0])
        assert at_resume >= current["round"]

        def trained_again(s):
            return any(record["train_loss"] is not None and record["round"] > at_resume for record in s[PAUSED]["history"])

        final = wait_until(daemons, run_id, trained_again, 180, "the resumed node to train a round")
        after = [r for r in final[PAUSED]["history"] if r["round"] > at_resume]
        first_trained = next(r["round"] for r in after if r["train_loss"] is not None)
        # A round already under way when it resumed is synced (it cannot join that one), and so is
        # the next if the others began it before that sync ended; no more: nothing is downloaded.
        assert sum(record["synced"] for record in after if record["round"] < first_trained) <= 2, after
        common = min(s["round"] for s in final)
        assert len(hashes_at(final, common)) == 1, "the resumed node agrees with the others"

        gone = locomesh(daemons[PAUSED], "run", "pause", "f" * 52)
        assert gone.returncode == EXIT_ERROR and gone.stderr.startswith(f"locomesh: {'f' * 52!r} is not a run ID")
    finally:
        stop_swarm(daemons)
        log.close()
