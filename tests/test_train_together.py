"""Training together across real daemon processes on loopback (issue: train together).

Four daemons train the default task; one is a test adversary committing sign-flip x100 payloads,
one is killed in the middle of a round, and a fifth joins at round 2 and catches up. Every honest
peer must end with the same parameters hash, the eval loss must fall, and no round may run past
its deadline.
"""

from __future__ import annotations

import signal
import time

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.swarm_cmd import common_round, create_run, hashes_at, join, join_all, start_swarm, wait_connected

ROUND_DEADLINE = 60.0
ATTACKER, VICTIM = 3, 2


def statuses(daemons, run_id):
    return [daemon.rpc().call("run.status", {"run_id": run_id}) for daemon in daemons]


def wait_for(daemons, run_id, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = statuses(daemons, run_id)
        if predicate(seen):
            return seen
        time.sleep(0.2)
    progress = [(s["phase"], s["round"], s["next_round"], sorted(rounds_done(s))) for s in seen]
    raise AssertionError(f"timed out waiting for {what}: {progress}")


def rounds_done(status):
    return {record["round"] for record in status["history"]}


def trained_after_catching_up(statuses):
    """The late joiner trained a round of its own, and every peer has finished one round past
    round 4 that all of them recorded (how far the run got before the joiner arrived varies: it
    syncs straight to the newest certified round)."""
    late = statuses[-1]["history"]
    return any(not record["synced"] for record in late) and common_round(statuses, 10**9) >= 4


def test_four_daemons_train_through_an_attacker_a_crash_and_a_late_joiner(tmp_path):
    log = open(tmp_path / "daemons.log", "wb")
    extra = {ATTACKER: ["--attack", "sign_flip_x100"]}
    daemons = start_swarm(tmp_path, 4, log=log, extra_args=extra)
    late = None
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 8, "round_deadline_s": ROUND_DEADLINE, "min_peers": 4},
                            admitted=daemons)
        join_all(daemons, run_id)
        wait_for(daemons, run_id, lambda s: min(x["round"] for x in s) >= 1, 120, "round 1")

        # Kill one peer while round 2 is under way.
        wait_for(daemons, run_id, lambda s: s[VICTIM]["phase"] in ("train", "committed"), 60, "round 2 to start")
        daemons[VICTIM].process.send_signal(signal.SIGKILL)
        daemons[VICTIM].wait()
        alive = [d for i, d in enumerate(daemons) if i != VICTIM]

        # A fifth daemon joins by ID and catches up.
        bootstrap = daemons[0].rpc().call("node.status")["listen_addrs"][:1]
        late = DaemonProcess(tmp_path / "late", bootstrap=bootstrap, log=log).start()
        late.wait_ready()
        wait_connected([daemons[0], late])
        join(late, run_id)
        everyone = [*alive, late]
        final = wait_for(everyone, run_id, trained_after_catching_up, 240, "a round trained by the late joiner")
    finally:
        for daemon in [*daemons, *( [late] if late else [])]:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
        log.close()

    honest = [status for index, status in enumerate(final) if index != 2]  # alive[2] is the attacker
    assert len(hashes_at(honest, common_round(honest, 10**9))) == 1, "honest peers disagree on the parameters"
    history = final[0]["history"]
    assert history[-1]["eval_loss"] < final[0]["initial_eval_loss"], "eval loss did not fall"
    for status in final:
        for record in status["history"]:
            assert record["seconds"] < ROUND_DEADLINE
    assert final[-1]["history"][0]["synced"], "the late joiner should have caught up by a sync"


def test_with_delayed_updates_rounds_train_ahead_and_honest_peers_still_agree(tmp_path):
    """One-round-delayed outer updates between real daemons, one of them an attacker: each honest
    peer trains its next round while the last one is exchanged, and all end on one state."""
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 4, log=log, extra_args={ATTACKER: ["--attack", "sign_flip_x100"]})
    try:
        wait_connected(daemons)
        settings = {"inner_steps": 8, "round_deadline_s": ROUND_DEADLINE, "min_peers": 4, "delayed_updates": True}
        run_id = create_run(daemons[0], settings, admitted=daemons)
        join_all(daemons, run_id)
        final = wait_for(daemons, run_id, lambda s: common_round(s, 10**9) >= 4, 240, "round 4 everywhere")
    finally:
        for daemon in daemons:
            daemon.stop()
        log.close()

    honest = [status for index, status in enumerate(final) if index != ATTACKER]
    assert len(hashes_at(honest, common_round(honest, 10**9))) == 1, "honest peers disagree on the parameters"
    assert final[0]["history"][-1]["eval_loss"] < final[0]["initial_eval_loss"], "eval loss did not fall"
    for status in honest:
        assert not status["history"][0]["trained_ahead"]  # round 1 has no round before it to overlap
        trained = [record for record in status["history"] if not record["synced"]]
        assert any(record["trained_ahead"] for record in trained), status["history"]
        assert all(record["seconds"] < ROUND_DEADLINE for record in status["history"])
