"""`run join --follow`, `run watch` and `run report` against real daemons (child processes on
loopback), their output piped as a script would read it: plain lines, no escape codes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from locomesh.cli import watch_cmd
from locomesh.cli.client import EXIT_ERROR, EXIT_INTERRUPTED
from locomesh.cli.plots import PLOTS
from locomesh.cli.swarm_cmd import create_run, join, start_swarm, stop_swarm, wait_connected
from locomesh.node.datadir import CHECKPOINT_DIR
from tests.corpus import pack_corpus


def locomesh(daemon, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "locomesh.cli.main", *args, "--data-dir", str(daemon.data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def daemons(request, tmp_path):
    log = open(tmp_path / "daemons.log", "wb")
    started = start_swarm(tmp_path, request.param, log=log)
    try:
        wait_connected(started)
        yield started
    finally:
        stop_swarm(started)
        log.close()


class FakeDaemon:
    """An `RpcClient` stand-in: a run joined at round 1, and `on_status` for each ``run.status``."""

    port, cookie, timeout = 1, "c" * 64, 10.0

    def __init__(self, *args, on_status=lambda: {"phase": "training", "round": 0, "history": []}, **kwargs) -> None:
        self.on_status = on_status

    def call(self, method: str, params: dict | None = None):
        if method == "node.status":
            return {"checkpoints": {"downloads": []}}
        if method == "run.join":
            return {"joins_at": 1}
        return self.on_status()


def interrupted():
    raise KeyboardInterrupt


def test_a_followed_join_exits_1_when_its_first_round_does_not_come_in_time(monkeypatch):
    monkeypatch.setattr(watch_cmd, "RpcClient", FakeDaemon)
    assert watch_cmd.follow_join(FakeDaemon(), "r", timeout=0, rich=False, poll=0.01) == EXIT_ERROR


def test_ctrl_c_exits_130_from_a_followed_join_and_from_watch(monkeypatch):
    monkeypatch.setattr(watch_cmd, "RpcClient", FakeDaemon)
    daemon = FakeDaemon(on_status=interrupted)
    assert watch_cmd.follow_join(daemon, "r", timeout=60, rich=False, poll=0.01) == EXIT_INTERRUPTED
    monkeypatch.setattr(FakeDaemon, "for_data_dir", classmethod(lambda cls, *a, **k: daemon), raising=False)
    args = argparse.Namespace(run_id="r", json=True, until=None, timeout=None, interval=0.01, data_dir="/nonexistent")
    assert watch_cmd.watch_run(args) == EXIT_INTERRUPTED


@pytest.mark.slow  # a training daemon, three rounds and six CLI processes: about 22 s
@pytest.mark.parametrize("daemons", [1], indirect=True)
def test_a_followed_join_then_watch_then_report_of_a_training_daemon(daemons, tmp_path):
    (daemon,) = daemons
    run_id = create_run(daemon, {"inner_steps": 3, "round_deadline_s": 60, "min_peers": 1})

    joined = locomesh(daemon, "run", "join", run_id, "--follow", "--timeout", "120")
    assert joined.returncode == 0, joined.stderr
    lines = joined.stdout.splitlines()
    assert lines[:2] == ["finding the run and meeting its participants", "joined; training from round 1"]
    assert lines[-1].startswith("round    1: eval loss ") and "1 payload" in lines[-1] and "1 payloads" not in lines[-1]
    assert "\x1b" not in joined.stdout, "a pipe gets no terminal escape codes"

    watched = locomesh(daemon, "run", "watch", run_id, "--until", "3", "--timeout", "120")
    assert watched.returncode == 0, watched.stderr
    assert [line[:11] for line in watched.stdout.splitlines()] == ["round    1:", "round    2:", "round    3:"]

    as_json = locomesh(daemon, "run", "watch", run_id, "--until", "2", "--json")
    history = daemon.rpc().call("run.status", {"run_id": run_id})["history"]
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == history[:2], "records as run.status has them"

    again = locomesh(daemon, "run", "join", run_id)  # piped: no following, the one line it always printed
    assert again.returncode == 0 and again.stdout.startswith("joined; training from round ") and again.stdout.count("\n") == 1

    reported = locomesh(daemon, "run", "report", run_id, "--out", str(tmp_path / "report"))
    assert reported.returncode == 0, reported.stderr
    for name in PLOTS:
        assert (tmp_path / "report" / f"{name}.png").stat().st_size > 10_000, name
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert f"# Run {run_id}" in summary and "| 1 | - |" not in summary  # one member, no scores: "-"
    assert "computed, 0 synced" in summary


@pytest.mark.slow  # two daemons and the llama task on a dataset: about 22 s
@pytest.mark.parametrize("daemons", [2], indirect=True)
def test_a_followed_join_shows_the_downloads_of_the_runs_dataset(daemons, tmp_path):
    packer, joiner = daemons
    packed = pack_corpus(packer.data_dir / CHECKPOINT_DIR, tmp_path / "corpus", count=400, shard_tokens=200)
    model = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 32, "vocab_size": 128}
    settings = {**model, "inner_steps": 2, "batch_size": 4, "min_peers": 2, "round_deadline_s": 60.0,
                "dataset": packed.id.hex()}
    params = {"task": "llama", "settings": settings, "public": True, "name": "llama", "seed": 3}
    run_id = packer.rpc(timeout=60).call("run.create", params)["run_id"]
    join(packer, run_id)

    joined = locomesh(joiner, "run", "join", run_id, "--follow", "--timeout", "150")
    assert joined.returncode == 0, joined.stderr
    lines = joined.stdout.splitlines()
    wanted = [packed.id.hex(), packed.index.tokenizer.hex(), packed.index.heldout[0].hex()]
    for checkpoint_id in wanted:  # the index, its tokenizer, the held-out shard evaluation reads
        done = next(line for line in lines if line.startswith(f"checkpoint {checkpoint_id[:12]}: done"))
        assert lines.index(done) < lines.index("joined; training from round 1"), "fetched before the join returns"
    assert lines[-1].startswith("round    1: eval loss ")
    downloads = {d["id"]: d for d in joiner.rpc().call("node.status")["checkpoints"]["downloads"]}
    assert all(downloads[checkpoint_id]["state"] == "done" for checkpoint_id in wanted)
    index = downloads[packed.id.hex()]
    assert index["bytes_total"] > 0 and index["chunks_stored"] == index["chunks_total"]
