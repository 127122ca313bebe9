"""Issue #33 between real daemons on loopback: a join into a run of one, and a kill -9 and restart
of one of two members right after a round certified, each cost at most a round, never the run's
deadline (600 s by default). On 198eff9 the restart split the two members' votes for good: each
proposed and voted its own set, and votes were once per round."""

from __future__ import annotations

import os
import signal
import time

import pytest

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.swarm_cmd import create_run, join, start_swarm, wait_connected

from .test_attacks_crash_restart import _status, _wait_status

pytestmark = pytest.mark.slow

MOST_SECONDS_A_ROUND = 120  # the longest gap between certificates allowed here; the run's deadline is 600 s
INNER_STEPS = 40


def _certified_at(statuses_seen: dict[int, float], status: dict | None) -> None:
    if status is not None and status["certified"] not in statuses_seen:
        statuses_seen[status["certified"]] = time.monotonic()


def _longest_gap(certified: dict[int, float]) -> float:
    rounds = sorted(certified)
    return max((certified[b] - certified[a] for a, b in zip(rounds, rounds[1:])), default=0.0)


def _follow(daemons, run_id: str, certified: dict[int, float], predicate, timeout: float) -> list[dict]:
    """Poll every daemon's `run.status`, noting when each round was first seen certified, until
    `predicate(statuses)`; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    statuses: list = []
    while time.monotonic() < deadline:
        statuses = [_status(daemon, run_id) for daemon in daemons]
        for status in statuses:
            _certified_at(certified, status)
        if None not in statuses and predicate(statuses):
            return statuses
        time.sleep(0.2)
    raise AssertionError(f"timed out: {[s and (s['phase'], s['round'], s['certified'], s['waiting']) for s in statuses]}")


def test_a_join_into_a_run_of_one_and_a_restart_of_one_of_two_cost_no_deadline(tmp_path):
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 2, log=log)
    alone, joiner = daemons
    restarted = None
    certified: dict[int, float] = {}
    try:
        wait_connected(daemons)
        run_id = create_run(alone, {"inner_steps": INNER_STEPS})  # the run's default deadline: 600 s
        join(alone, run_id)
        _wait_status(alone, run_id, lambda s: s["certified"] >= 3, 180)
        join(joiner, run_id)
        joined_at = _wait_status(alone, run_id, lambda s: True, 10)["certified"]
        # Both contribute: a certified round's set holds the joiner's payload too.
        _follow(daemons, run_id, certified,
                lambda s: min(x["certified"] for x in s) >= joined_at + 4 and all(
                    record["contributors"] == 2 for x in s for record in x["history"][-1:]), 240)
        # kill -9 right after a certificate, and start again on the same data dir at once.
        statuses = _follow(daemons, run_id, certified, lambda s: s[1]["phase"] == "train", 60)
        killed_at = statuses[1]["certified"]
        joiner.process.send_signal(signal.SIGKILL)
        joiner.wait()
        bootstrap = alone.rpc().call("node.status")["listen_addrs"][:1]
        restarted = DaemonProcess(joiner.data_dir, bootstrap=bootstrap, log=log,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}).start()
        restarted.wait_ready()
        final = _follow([alone, restarted], run_id, certified,
                        lambda s: min(x["certified"] for x in s) >= killed_at + 4
                        and _trained_after_restart(s[1], killed_at), 300)
    finally:
        for daemon in [*daemons, *([restarted] if restarted else [])]:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
        log.close()
    assert _longest_gap(certified) < MOST_SECONDS_A_ROUND, certified
    assert not any(s["banned"] for s in final)
    assert final[0]["state_hash"] == final[1]["state_hash"] or final[0]["round"] != final[1]["round"]


def _trained_after_restart(status: dict, killed_at: int) -> bool:
    """Did the restarted node train (not only sync) a round at least two past the kill?"""
    return any(record["round"] > killed_at + 1 and not record["synced"] for record in status["history"])
