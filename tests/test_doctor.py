"""`locomesh doctor`: each check against a broken setup, and the memory ceiling a join honours.

The pure parts (the footprint, the reference hashes, the judging of a status, the memory verdict)
are tested directly; the broken setups with real daemons on loopback: no daemon (RPC down), a
bootstrap address with nothing behind it (no route to bootstrap), and a node whose memory limit is
below what a run needs (the join is refused with the figures; in the slow pair test, doctor says
so too, beside its members' reachability, links and the round-time prediction). The gateway that
refuses mappings is in the network-namespace lab (tests/test_doctor_netns.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from locomesh.cli.client import EXIT_ERROR, EXIT_NO_DAEMON, EXIT_OK, RpcCallError
from locomesh.cli.daemon_process import DaemonProcess
from locomesh.node.config import ConfigError, load_config, parse_size
from locomesh.node.doctor.checks import FAIL, OK, WARN
from locomesh.node.doctor.memory import NOT_ENOUGH_MEMORY, MemoryVerdict
from locomesh.node.doctor.network import network_checks
from locomesh.node.doctor.prediction import predict
from locomesh.training.codec import max_payload_size
from locomesh.training.footprint import run_footprint
from locomesh.training.run_settings import default_hparams

MiB = 1024 * 1024


def locomesh(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "locomesh.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def doctor_json(*args: str) -> tuple[int, dict]:
    done = locomesh("doctor", "--json", *args)
    return done.returncode, json.loads(done.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


def body(**task_config) -> dict:
    return {"task": "synthetic-lm", "task_config": task_config, "hparams": default_hparams(), "seed": 7}


# --- the footprint and the memory ceiling ------------------------------------------------------------


def test_the_footprint_comes_from_the_tasks_own_model():
    from locomesh.training.flat import param_count
    from locomesh.training.tasks import get_task

    small = run_footprint(body(), contributors=4)
    assert small.parameters == param_count(get_task("synthetic-lm").build_model(7))
    assert small.payload_bytes == max_payload_size("int8", small.parameters)
    assert small.activations_known and small.activation_bytes > 0
    assert small.memory_needed == small.training_bytes + small.outer_bytes + small.held_payload_bytes
    bigger = run_footprint(body(d_model=128), contributors=4)
    assert bigger.parameters > small.parameters and bigger.memory_needed > small.memory_needed
    crowded = run_footprint(body(), contributors=40)
    assert crowded.held_payload_bytes == 10 * small.held_payload_bytes
    assert crowded.exchange_bytes_down("allgather") == 39 * small.payload_bytes
    assert crowded.exchange_bytes_down("sharded") == 2 * small.payload_bytes  # whatever the group's size


def test_the_memory_verdict_names_the_figures_and_the_fix():
    over_limit = MemoryVerdict(needed=3 * MiB, limit=2 * MiB, available=100 * MiB)
    assert not over_limit.fits
    assert "3.0 MiB" in over_limit.problem() and "2.0 MiB" in over_limit.problem() and "--memory-limit" in over_limit.fix()
    short = MemoryVerdict(needed=3 * MiB, limit=0, available=MiB)
    assert not short.fits and "only 1.0 MiB is available" in short.problem() and short.fix()
    fine = MemoryVerdict(needed=MiB, limit=2 * MiB, available=3 * MiB)
    assert fine.fits and fine.fix() == ""


def test_memory_limit_reads_human_sizes_from_file_environment_and_refuses_nonsense(tmp_path):
    assert parse_size("8GiB") == 8 * 1024**3 and parse_size("1.5GB") == 1_500_000_000
    assert parse_size("512 MiB") == 512 * MiB and parse_size("123") == 123 and parse_size(0) == 0
    (tmp_path / "config.toml").write_text('memory_limit = "2GiB"\n')
    assert load_config(data_dir=tmp_path, environ={}).memory_limit == 2 * 1024**3
    assert load_config(data_dir=tmp_path, environ={"LOCOMESH_MEMORY_LIMIT": "100M"}).memory_limit == 100 * MiB
    for bad in ("lots", "-1G", "8 parsecs"):
        with pytest.raises(ConfigError, match="LOCOMESH_MEMORY_LIMIT"):
            load_config(data_dir=tmp_path, environ={"LOCOMESH_MEMORY_LIMIT": bad})


def test_the_round_prediction_adds_training_and_the_exchange():
    footprint = run_footprint(body(), contributors=5)
    quick = predict(footprint, seconds_per_step=0.01, bandwidth=10 * MiB)
    assert quick.train_s == pytest.approx(footprint.inner_steps * 0.01)
    assert quick.exchange_s == pytest.approx(4 * footprint.payload_bytes / (10 * MiB), abs=1e-3)
    assert quick.verdict == "in time"
    assert predict(footprint, seconds_per_step=100.0, bandwidth=None).verdict == "too slow"
    assert predict(footprint, seconds_per_step=footprint.round_deadline_s * 0.9 / footprint.inner_steps,
                   bandwidth=None).verdict == "close"


def test_this_cpu_computes_the_reference_hashes():
    from locomesh.training.reference_hashes import mismatches

    assert mismatches([("centered_clip", {}), ("mean", {})]) == []


# --- judging a status --------------------------------------------------------------------------------


def test_network_checks_explain_each_problem_with_a_fix():
    status = {
        "bootstrap": {"configured": 1, "connected": 0},
        "peers_connected": 0,
        "listen_addrs": ["/ip4/192.168.1.5/tcp/4001/p2p/12D3KooWx"],
        "observed_addrs": ["/ip4/198.51.100.1/tcp/50001", "/ip4/198.51.100.1/tcp/50002"],
        "reachability": {"verdict": "private", "confirmed_addrs": [], "probes_pending": 0,
                         "evidence": [{"outcome": "refuted"}, {"outcome": "refuted"}]},
        "port_mapping": {"state": "failed", "reason": "nat-pmp: gateway-refused; upnp: timeout"},
        "relay": {"offering": False, "reservations": [], "mode": "auto"},
    }
    dials = {"/ip4/10.9.9.9/tcp/4001/p2p/12D3KooWy": "DialError: no connection within 5 s"}
    checks = {check.name: check for check in network_checks(status, dials)}
    assert checks["bootstrap"].status == FAIL and "0/1" in checks["bootstrap"].detail
    assert "no route or no answer" in checks["bootstrap"].detail and "peer ID" in checks["bootstrap"].fix
    assert checks["reachability"].status == WARN and "2 dial-back(s)" in checks["reachability"].detail
    assert checks["NAT"].status == WARN and "symmetric" in checks["NAT"].detail
    assert checks["port mapping"].status == WARN and "gateway-refused" in checks["port mapping"].detail
    assert "forward TCP port 4001" in checks["port mapping"].fix
    assert checks["relays"].status == WARN and checks["relays"].fix
    assert all(check.fix for check in checks.values() if check.status != OK)  # every problem says what to do

    healthy = {**status, "bootstrap": {"configured": 1, "connected": 1}, "observed_addrs": [],
               "reachability": {"verdict": "public", "confirmed_addrs": ["/ip4/203.0.113.5/tcp/4001"]},
               "port_mapping": {"state": "not-needed"}, "relay": {"offering": True, "active_circuits": 2}}
    assert all(check.status == OK for check in network_checks(healthy, {}))


def test_the_verdict_follows_from_the_checks():
    from locomesh.node.doctor.checks import Check, takes_part, verdict

    fine, warned, failed = Check("python", OK, "3.11"), Check("NAT", WARN, "symmetric", "a router"), Check(
        "bootstrap", FAIL, "alone", "--bootstrap")
    assert verdict([fine]) == "this node can take part" and takes_part([fine])
    assert verdict([fine, warned]) == "this node can take part, with 1 warning(s) (NAT): see their fixes"
    assert takes_part([fine, warned])
    assert verdict([warned, failed]) == "this node cannot take part: 1 problem(s) to fix (bootstrap)"
    assert not takes_part([warned, failed])


def test_a_node_alone_cannot_take_part_and_each_fix_fits_the_others_findings():
    unknown = {"verdict": "unknown", "confirmed_addrs": [], "probes_pending": 0, "evidence": []}
    alone = {"bootstrap": {"configured": 0, "connected": 0}, "peers_connected": 0, "reachability": unknown,
             "listen_addrs": ["/ip4/192.168.1.5/tcp/4001"], "observed_addrs": []}
    checks = network_checks(alone, {})
    named = {check.name: check for check in checks}
    assert named["bootstrap"].status == FAIL and "cannot find anyone" in named["bootstrap"].detail
    assert "first node of a new network" in named["bootstrap"].fix
    assert named["reachability"].fix.startswith("connect to peers first (see the bootstrap check)")
    assert named["NAT"].fix.startswith("connect to peers first (see the bootstrap check)")
    from locomesh.node.doctor.checks import verdict

    assert verdict(checks).startswith("this node cannot take part: 1 problem(s) to fix (bootstrap)")

    connected = {**alone, "bootstrap": {"configured": 1, "connected": 1}, "peers_connected": 1}
    named = {check.name: check for check in network_checks(connected, {})}
    assert named["bootstrap"].status == OK and named["bootstrap"].detail == "1/1 bootstrap peers reachable"
    for name in ("reachability", "NAT"):  # a peer is connected: no fix asks to connect to one
        assert named[name].status == WARN and "connect to" not in named[name].fix and "bootstrap" not in named[name].fix
    assert "1 connected peer(s)" in named["reachability"].fix


def test_doctor_checks_the_device_the_running_daemon_was_started_with(tmp_path, monkeypatch, capsys):
    import torch

    from locomesh.cli import doctor_cmd
    from locomesh.cli.main import main
    from locomesh.node.doctor.checks import ok

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    daemon = {"checks": [ok("RPC", "the daemon answers")], "facts": {"device": "cuda"}}  # started with --device cuda
    monkeypatch.setattr(doctor_cmd, "daemon_checks", lambda data_dir, run_id: daemon)
    assert main(["doctor", "--data-dir", str(tmp_path)]) == EXIT_ERROR  # the configuration says "auto": not what runs
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL  device: cuda requested, not available: this machine has no CUDA device (the running daemon's device)" in lines
    assert lines[-1] == "this node cannot take part: 1 problem(s) to fix (device)"


# --- real daemons: each broken setup ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_rpc_down_doctor_says_how_to_start_it_still_checks_the_machine_and_exits_3(tmp_path):
    done = locomesh("doctor", "--data-dir", str(tmp_path / "node"))
    assert done.returncode == EXIT_NO_DAEMON
    assert "FAIL  RPC: the daemon's RPC is down" in done.stdout
    assert f"fix: start it (locomesh node start --data-dir {tmp_path / 'node'})" in done.stdout
    for local in ("python", "torch", "device", "outer step", "data dir"):
        assert f"ok    {local}:" in done.stdout, local
    assert done.stdout.strip().splitlines()[-1] == "this node cannot take part: 1 problem(s) to fix (RPC)"


def test_a_key_other_users_can_read_is_a_problem(tmp_path):
    from locomesh.cli.doctor_cmd import data_dir_check
    from locomesh.node.datadir import DataDir

    key = DataDir(tmp_path).identity_path
    key.write_bytes(b"x")
    os.chmod(key, 0o644)
    check = data_dir_check(tmp_path)
    assert check.status == FAIL and check.fix == f"chmod 600 {key}"
    os.chmod(key, 0o600)
    assert data_dir_check(tmp_path).status == OK


def test_no_route_to_bootstrap_is_a_failure_naming_the_address(tmp_path):
    from locomesh.protocol import Identity

    nowhere = f"/ip4/127.0.0.1/tcp/{_free_port()}/p2p/{Identity.generate().peer_id}"
    with open(tmp_path / "node.log", "wb") as log, DaemonProcess(tmp_path / "node", bootstrap=[nowhere], log=log) as node:
        node.wait_ready()
        code, report = doctor_json("--data-dir", str(tmp_path / "node"))
    bootstrap = by_name(report)["bootstrap"]
    assert code == EXIT_ERROR and report["ok"] is False
    assert bootstrap["status"] == FAIL and "0/1 bootstrap peers reachable" in bootstrap["detail"]
    assert nowhere in bootstrap["detail"] and bootstrap["fix"]
    assert by_name(report)["RPC"]["status"] == OK


def test_not_enough_memory_the_join_is_refused_with_the_figures(tmp_path):
    with open(tmp_path / "node.log", "wb") as log, \
            DaemonProcess(tmp_path / "node", log=log, extra_args=["--memory-limit", "1MiB"]) as node:
        node.wait_ready()
        run_id = node.rpc(timeout=60).call("run.create", {"task": "synthetic-lm", "settings": {"inner_steps": 5}})["run_id"]
        with pytest.raises(RpcCallError) as refused:
            node.rpc(timeout=120).call("run.join", {"run_id": run_id})
        assert refused.value.code == NOT_ENOUGH_MEMORY
        assert "needs about" in refused.value.message and "memory_limit of 1.0 MiB" in refused.value.message
        assert "--memory-limit" in refused.value.message
        assert not node.rpc().call("node.status").get("training")  # nothing started


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A (no limit) created a public run and joined it; B bootstraps from A with a 1 MiB memory limit."""
    root = tmp_path_factory.mktemp("doctor")
    logs = [open(root / f"{name}.log", "wb") for name in "ab"]
    a = DaemonProcess(root / "a", log=logs[0]).start()
    try:
        bootstrap = a.wait_ready()["listen_addrs"][:1]
        b = DaemonProcess(root / "b", bootstrap=bootstrap, log=logs[1], extra_args=["--memory-limit", "1MiB"]).start()
        try:
            b.wait_ready()
            run_id = a.rpc(timeout=60).call("run.create", {"task": "synthetic-lm", "public": True,
                                                          "settings": {"inner_steps": 5}})["run_id"]
            a.rpc(timeout=60).call("run.join", {"run_id": run_id})
            yield a, b, run_id
        finally:
            b.stop()
    finally:
        a.stop()
        for log in logs:
            log.close()


@pytest.mark.slow
def test_doctor_reaches_and_measures_a_run_s_members_and_finds_too_little_memory(pair):
    a, b, run_id = pair
    code, report = doctor_json(run_id, "--data-dir", str(b.data_dir))
    checks = by_name(report)
    assert code == EXIT_ERROR and report["ok"] is False
    assert checks["memory"]["status"] == FAIL and "memory_limit of 1.0 MiB" in checks["memory"]["detail"]
    assert "--memory-limit" in checks["memory"]["fix"]
    memory = report["facts"]["run"]["memory"]
    assert memory["needed"] > memory["limit"] == MiB and not memory["fits"]
    prediction = report["facts"]["run"]["prediction"]
    assert prediction["seconds_per_step"] > 0 and prediction["deadline_s"] == 600.0
    assert "5 inner steps" in checks["round time"]["detail"]
    assert checks["run"]["detail"] == "found in the DHT"
    assert checks["members"]["status"] == OK and "1/1 members reachable" in checks["members"]["detail"]
    assert checks["links"]["status"] == OK
    [member] = report["facts"]["run"]["member_reports"]
    assert member["peer_id"] == a.wait_ready()["peer_id"] and member["download_bps"] > 0 and member["rtt_ms"] > 0


@pytest.mark.slow
def test_a_node_that_can_take_part_exits_0(pair):
    a, _, run_id = pair
    code, report = doctor_json(run_id, "--data-dir", str(a.data_dir))
    assert code == EXIT_OK and report["ok"] is True, [c for c in report["checks"] if c["status"] == FAIL]
    assert by_name(report)["memory"]["status"] == OK and by_name(report)["run"]["status"] == OK
    bad = a.rpc(timeout=60).call("node.doctor", {"run_id": "not-a-run"})
    run = next(check for check in bad["checks"] if check["name"] == "run")
    assert bad["ok"] is False and run["status"] == FAIL and run["fix"]


# --- the bandwidth probe: bounded per request, per peer and in all -------------------------------------


async def test_the_bandwidth_probe_measures_and_its_bounds_hold(nursery, identity_factory):
    import random

    import trio
    from multiaddr import Multiaddr

    from locomesh.node.doctor import probe
    from locomesh.node.doctor.service import DoctorService
    from locomesh.node.runtime import Node
    from locomesh.node.streams import read_frame_or_eof, write_frame

    loopback = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    server = Node.create(identity_factory(1), listen_addrs=loopback, services=[DoctorService(None, None)],
                         rng=random.Random(1))
    await nursery.start(server.run)
    asker = Node.create(identity_factory(2), listen_addrs=loopback, rng=random.Random(2))
    await nursery.start(asker.run)
    await asker.connect(Multiaddr(server.listen_addresses()[0]))

    assert await probe.measure_download(asker, server.peer_id, 64 * 1024) > 0
    for _ in range(probe.PER_PEER_BURST - 1):
        await probe.measure_download(asker, server.peer_id, 1024)
    with pytest.raises(probe.ProbeBusy):  # over this peer's rate: nothing sent
        await probe.measure_download(asker, server.peer_id, 1024)
    errors = lambda: {labels[0]: value for labels, value in server.metrics["locomesh_protocol_errors_total"].samples()}  # noqa: E731
    assert errors().get("probe-rate") == 1

    stream = await asker.open_stream(server.peer_id, [probe.PROTOCOL_ID])  # asks for more than a probe may be
    await write_frame(stream, (probe.MAX_PROBE_BYTES + 1).to_bytes(4, "big"), timeout=5)
    try:
        reply = await read_frame_or_eof(stream, max_size=16, timeout=5)
    except Exception:  # noqa: BLE001 - the stream is reset: nothing comes back either way
        reply = None
    assert reply is None
    with trio.fail_after(10):
        while errors().get("bad-probe") != 1:
            await trio.sleep(0.02)
    with pytest.raises(ValueError):
        await probe.measure_download(asker, server.peer_id, probe.MAX_PROBE_BYTES + 1)
    asker.request_stop()
    server.request_stop()


class _ProbeStream:
    """A probe request from `peer` as the probe's handler reads it; what it answers, in `answer`."""

    def __init__(self, peer: str, size: int = 1024) -> None:
        self.muxed_conn = SimpleNamespace(peer_id=peer)
        self._request = (4).to_bytes(4, "big") + size.to_bytes(4, "big")
        self.answer = bytearray()

    async def read(self, n: int | None = None) -> bytes:
        chunk, self._request = self._request[:n], self._request[n:]
        return chunk

    async def write(self, data: bytes) -> None:
        self.answer += data

    async def close(self) -> None:
        pass


async def test_strangers_with_many_peer_ids_cannot_use_up_the_probes_of_the_members():
    from locomesh.node.doctor import probe
    from locomesh.node.doctor.service import DoctorService
    from locomesh.protocol import peer_id_from_public_key

    member = peer_id_from_public_key(b"\x01" * 32)
    handlers, refused = {}, []
    node = SimpleNamespace(set_stream_handler=lambda protocol, handler, timeout: handlers.update({protocol: handler}),
                           rpc=SimpleNamespace(register=lambda name, method: None),
                           count_protocol_error=refused.append)
    crdt = SimpleNamespace(has_standing=lambda peer_id: peer_id == member)  # CrdtService's: tests/test_node_crdt.py
    await DoctorService(None, crdt).run(node)
    handle = handlers[probe.PROTOCOL_ID]

    async def answered(peer: str) -> bool:
        stream = _ProbeStream(peer)
        await handle(stream)
        return bool(stream.answer)

    strangers = [await answered(peer_id_from_public_key(bytes([2, i]) * 16)) for i in range(2 * probe.TOTAL_BURST)]
    assert 0 < sum(strangers) < probe.TOTAL_BURST  # one new peer ID a probe, and still only the strangers' share
    assert [await answered(member) for _ in range(probe.PER_PEER_BURST + 1)] == [True] * probe.PER_PEER_BURST + [False]
    assert refused == ["probe-rate"] * (len(strangers) - sum(strangers) + 1)
