"""Real daemons (child processes) on loopback: a three-node swarm, its RPC, and what it survives.

The three daemons start once for the module (each start costs about a
second). Tests that stop a daemon start their own.
"""

from __future__ import annotations

import http.client
import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from multiaddr import Multiaddr
from prometheus_client.parser import text_string_to_metric_families

from locomesh.cli.client import RpcCallError, RpcClient
from locomesh.cli.daemon_process import DaemonProcess
from locomesh.node.runtime import Node
from .test_node_runtime import send_garbage

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def locomesh(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "locomesh.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def wait_until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    root = tmp_path_factory.mktemp("swarm")
    logs = [open(root / f"node{index}.log", "wb") for index in range(3)]
    first = DaemonProcess(root / "node0", log=logs[0]).start()
    daemons = [first]
    try:
        bootstrap = first.wait_ready()["listen_addrs"][:1]
        daemons += [DaemonProcess(root / f"node{i}", bootstrap=bootstrap, log=logs[i]).start() for i in (1, 2)]
        for daemon in daemons[1:]:
            daemon.wait_ready()
        wait_until(lambda: first.rpc().call("node.status")["peers_connected"] == 2)
        yield daemons
    finally:
        for daemon in daemons:
            daemon.stop()
        for log in logs:
            log.close()


def status_of(daemon: DaemonProcess) -> dict:
    return daemon.rpc().call("node.status")


def raw_http(port: int, data: bytes, *, read: bool = True, half_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        if not read:
            return b""
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_the_nodes_list_each_other(swarm):
    first, second, third = swarm
    ids = [status_of(daemon)["peer_id"] for daemon in swarm]
    result = locomesh("peers", "--json", "--data-dir", str(first.data_dir))
    assert result.returncode == 0, result.stderr
    peers = json.loads(result.stdout)
    assert sorted(peer["peer_id"] for peer in peers) == sorted(ids[1:])
    assert {peer["direction"] for peer in peers} == {"inbound"}
    assert all(peer["addrs"] and peer["connected_since"] > 0 for peer in peers)
    for daemon in (second, third):
        listed = json.loads(locomesh("peers", "--json", "--data-dir", str(daemon.data_dir)).stdout)
        [bootstrap_peer] = [peer for peer in listed if peer["peer_id"] == ids[0]]
        assert bootstrap_peer["direction"] == "outbound"

    def lists_the_others(daemon, own_id) -> bool:
        listed = json.loads(locomesh("peers", "--json", "--data-dir", str(daemon.data_dir)).stdout)
        return {peer["peer_id"] for peer in listed} == set(ids) - {own_id}

    # The second and third know only the first; they find each other through its DHT routing table.
    for daemon, own_id in zip(swarm, ids):
        wait_until(lambda: lists_the_others(daemon, own_id), timeout=30.0)


def test_ping_over_rpc(swarm):
    first_id = status_of(swarm[0])["peer_id"]
    answer = swarm[1].rpc().call("node.ping", {"peer_id": first_id})
    assert answer["peer_id"] == first_id and answer["rtt_ms"] > 0
    with pytest.raises(RpcCallError) as caught:
        swarm[1].rpc().call("node.ping", {"peer": first_id})
    assert caught.value.code == -32602
    with pytest.raises(RpcCallError) as caught:
        swarm[1].rpc().call("node.ping", {"peer_id": "not-a-peer-id"})
    assert caught.value.code == -32000 and "ping failed" in caught.value.message


def test_status_json_and_table(swarm):
    first = swarm[0]
    result = locomesh("status", "--json", "--data-dir", str(first.data_dir))
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["peers_connected"] == 2 and status["runs"] == []
    assert status["peer_id"].startswith("12D3KooW")
    assert status["bytes_in"] > 0 and status["bytes_out"] > 0 and status["uptime_s"] > 0
    assert status["listen_addrs"][0].startswith("/ip4/127.0.0.1/tcp/")
    assert status["bootstrap"] == {"configured": 0, "connected": 0}
    assert status_of(swarm[1])["bootstrap"] == {"configured": 1, "connected": 1}
    table = locomesh("status", "--data-dir", str(first.data_dir))
    assert table.returncode == 0 and status["peer_id"] in table.stdout and "peers connected  2" in table.stdout


def test_peers_connect_by_id(swarm):
    data_dir = str(swarm[1].data_dir)
    target = status_of(swarm[2])["peer_id"]
    answer = locomesh("peers", "connect", target, "--data-dir", data_dir, "--json", timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) == {"peer_id": target, "connection": "direct"}
    plain = locomesh("peers", "connect", target, "--keep", "--data-dir", data_dir, timeout=120)
    assert plain.returncode == 0 and plain.stdout.strip() == f"connected to {target} (direct)"
    wait_until(lambda: status_of(swarm[1])["relay"]["kept_links"] == 1, timeout=10)
    bad = locomesh("peers", "connect", "not-a-peer-id", "--keep", "--data-dir", data_dir)
    assert bad.returncode == 1 and "not a peer ID" in bad.stderr
    listed = locomesh("peers", "--data-dir", data_dir)  # `peers` alone still lists
    assert listed.returncode == 0 and target in listed.stdout


def test_a_mistyped_locomesh_variable_is_named_in_the_log(tmp_path):
    import os

    with open(tmp_path / "node.log", "wb") as log:
        daemon = DaemonProcess(tmp_path / "node", log=log, env={**os.environ, "LOCOMESH_LOG_LEVLE": "debug"}).start()
        try:
            daemon.wait_ready()
        finally:
            daemon.stop()
    text = (tmp_path / "node.log").read_text()
    assert "LOCOMESH_LOG_LEVLE is not a locomesh setting; ignored (did you mean LOCOMESH_LOG_LEVEL?)" in text


def test_a_bootstrap_address_with_the_wrong_peer_id_is_named_in_a_warning(swarm, tmp_path):
    from locomesh.protocol import Identity

    real = status_of(swarm[0])
    wrong = real["listen_addrs"][0].split("/p2p/")[0] + "/p2p/" + Identity.generate().peer_id
    with open(tmp_path / "node.log", "wb") as log:
        daemon = DaemonProcess(tmp_path / "node", bootstrap=[wrong], log=log).start()
        try:
            daemon.wait_ready()
            wait_until(lambda: "peer ID mismatch" in (tmp_path / "node.log").read_text(), timeout=20)
            assert daemon.rpc().call("node.status")["bootstrap"] == {"configured": 1, "connected": 0}
        finally:
            daemon.stop()
    [line] = [line for line in (tmp_path / "node.log").read_text().splitlines() if "peer ID mismatch" in line][:1]
    assert "WARNING" in line and f"the node at this address is {real['peer_id']}" in line
    # py-libp2p's own error about the failed handshake is a DEBUG record now: not a bare line on stderr.
    bare = [line for line in (tmp_path / "node.log").read_text().splitlines() if line and not line.startswith("20")]
    assert bare == []


def test_the_daemon_does_not_load_torch(swarm):
    facts = swarm[0].rpc().call("node.debug")
    assert facts["torch_imported"] is False
    assert facts["pid"] == swarm[0].pid


def test_rpc_needs_the_cookie(swarm):
    client = swarm[0].rpc()
    for cookie in ("", "0" * 64, client.cookie[:-1]):
        with pytest.raises(RpcCallError) as caught:
            RpcClient(client.port, cookie).call("node.status")
        assert caught.value.code != 0
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "node.status"}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", client.port, timeout=10)
    connection.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 401 and response.getheader("WWW-Authenticate")
    assert json.loads(response.read())["error"]["code"] == -32600


def test_metrics_need_no_cookie(swarm):
    client = swarm[0].rpc()
    client.call("node.status")
    text = client.get_metrics()
    gauges = {family.name: family.samples[0].value for family in text_string_to_metric_families(text) if family.samples}
    assert gauges["locomesh_peers_connected"] == 2
    assert 'locomesh_rpc_requests_total{method="node.status"}' in text
    for name in ("locomesh_bytes_in_total", "locomesh_bytes_out_total", "locomesh_uptime_seconds"):
        assert f"# TYPE {name} " in text


def test_garbage_on_the_rpc_port_leaves_the_daemon_up(swarm):
    client = swarm[0].rpc()
    port, rng = client.port, random.Random(11)
    auth = f"Authorization: Bearer {client.cookie}\r\n".encode()
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    answers = {
        "random": raw_http(port, bytes(rng.getrandbits(8) for _ in range(4096))),
        "header": raw_http(port, b"GET / HTTP/1.1\r\n" + host + b"X: " + b"a" * 40_000 + b"\r\n\r\n"),
        # Still connected: a client that half-closes in the middle of its request gets no answer.
        "body": raw_http(port, b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 99999999\r\n\r\n", half_close=False),
        "half": raw_http(port, b"POST / HTTP/1.1\r\n" + host + b"Content-Le"),
        "json": raw_http(port, b"POST / HTTP/1.1\r\n" + host + auth + b"Content-Length: 5\r\n\r\n{nope"),
        "notjsonrpc": raw_http(port, b"POST / HTTP/1.1\r\n" + host + auth + b"Content-Length: 2\r\n\r\n[]"),
        "path": raw_http(port, b"GET /secret HTTP/1.1\r\n" + host + b"\r\n"),
    }
    assert answers["random"].startswith(b"HTTP/1.1 400 ")
    assert answers["header"].startswith(b"HTTP/1.1 431 ")
    assert answers["body"].startswith(b"HTTP/1.1 413 ")
    assert answers["half"].startswith(b"HTTP/1.1 400 ")
    assert answers["path"].startswith(b"HTTP/1.1 404 ")
    assert b'"code":-32700' in answers["json"] and answers["json"].startswith(b"HTTP/1.1 200 ")
    assert b'"code":-32600' in answers["notjsonrpc"]
    # A client that sends half a request and then waits does not block others.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
        stalled.sendall(b"POST / HTTP/1.1\r\n" + host)
        assert status_of(swarm[0])["peers_connected"] == 2
    # Keep-alive: two requests on one connection.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(2):
        connection.request("GET", "/metrics")
        assert connection.getresponse().read().startswith(b"# HELP")
    connection.close()


def test_garbage_on_the_libp2p_port_leaves_the_daemon_up(swarm):
    first = swarm[0]
    host, port = _tcp_of(status_of(first)["listen_addrs"][0])
    rng = random.Random(12)
    for size in (1, 100, 10_000):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(bytes(rng.getrandbits(8) for _ in range(size)))
            sock.settimeout(10)
            try:
                sock.recv(1024)
            except OSError:
                pass
    assert status_of(first)["peers_connected"] == 2


async def test_garbage_frames_on_the_ping_protocol_are_counted(swarm, identity_factory):
    first = swarm[0]
    status = await trio.to_thread.run_sync(status_of, first)
    intruder = Node.create(identity_factory(7), listen_addrs=[Multiaddr(LOOPBACK)])
    async with trio.open_nursery() as nursery:
        await nursery.start(intruder.run)
        await intruder.connect(Multiaddr(status["listen_addrs"][0]))
        for garbage in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"\x00\x00\x00\x10short"):
            await send_garbage(intruder, status["peer_id"], garbage)
        intruder.request_stop()
    after = await trio.to_thread.run_sync(status_of, first)
    assert after["protocol_errors"] >= status["protocol_errors"] + 3
    assert after["peers_connected"] >= 2
    assert "truncated" in await trio.to_thread.run_sync(lambda: first.rpc().get_metrics())


def test_a_second_daemon_on_the_same_data_dir_is_refused(swarm):
    result = locomesh("node", "start", "--data-dir", str(swarm[0].data_dir), "--listen", LOOPBACK)
    assert result.returncode == 2
    assert "another locomesh daemon" in result.stderr and "Traceback" not in result.stderr
    assert status_of(swarm[0])["peers_connected"] == 2


def test_a_bad_configuration_exits_2_with_one_line(tmp_path):
    result = locomesh("node", "start", "--data-dir", str(tmp_path), "--listen", "/ip4/127.0.0.1/udp/1")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not a TCP address" in result.stderr


def test_an_address_it_cannot_listen_on_exits_1_with_one_line(tmp_path):
    result = locomesh("node", "start", "--data-dir", str(tmp_path), "--listen", "/ip4/192.0.2.1/tcp/4001")
    assert result.returncode == 1
    assert "locomesh: cannot listen on /ip4/192.0.2.1/tcp/4001" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "rpc.cookie").exists()


def test_an_rpc_port_in_use_exits_2_with_one_line(swarm, tmp_path):
    port = swarm[0].rpc().port
    result = locomesh("node", "start", "--data-dir", str(tmp_path), "--listen", LOOPBACK, "--rpc-port", str(port))
    assert result.returncode == 2
    assert f"locomesh: address in use: 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


def test_sigterm_exits_0_and_the_peer_id_survives_a_restart(tmp_path):
    with open(tmp_path / "log", "wb") as log:
        daemon = DaemonProcess(tmp_path / "node", log=log, extra_args=["--log-format", "json"]).start()
        first = daemon.wait_ready()
        peer_id = first["peer_id"]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
        assert not (tmp_path / "node" / "rpc.json").exists()
        records = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
        assert {"ts", "level", "logger", "msg"} <= records[0].keys()
        assert any(record["msg"].startswith("ready: peer " + peer_id) for record in records)
        assert records[-1]["msg"] == "stopped cleanly"
        again = DaemonProcess(tmp_path / "node", log=log).start()
        try:
            second = again.wait_ready()
            assert second["peer_id"] == peer_id
            assert second["listen_addrs"] == first["listen_addrs"]  # asked for any port: the last one, still free
            result = locomesh("node", "stop", "--data-dir", str(again.data_dir))
            assert result.returncode == 0, result.stderr
            assert again.wait(timeout=10) == 0
        finally:
            again.stop()
    assert (tmp_path / "log").read_text().count("stopped cleanly") == 2


STUBBORN_DAEMON = """
import sys, trio
from locomesh.node.config import load_config
from locomesh.node.daemon import default_services, run_daemon
from locomesh.node.logs import configure_logging

class Stubborn:  # a service whose clean-up never ends
    name = "stubborn"
    async def run(self, node, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(60)

config = load_config(data_dir=sys.argv[1], flags={"listen": ["/ip4/127.0.0.1/tcp/0"]}, environ={})
configure_logging(level="info", fmt="text")
sys.exit(run_daemon(config, services=lambda config: [*default_services(config), Stubborn()]))
"""


def test_a_second_signal_exits_at_once(tmp_path):
    log_path = tmp_path / "log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", STUBBORN_DAEMON, str(tmp_path / "node")], stderr=log)
        try:
            wait_until(lambda: b"ready: peer" in log_path.read_bytes(), timeout=30)
            process.send_signal(signal.SIGTERM)
            wait_until(lambda: b"shutting down" in log_path.read_bytes())
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 128 + signal.SIGTERM
        finally:
            process.kill()
            process.wait()
    assert "second SIGTERM: exiting at once" in log_path.read_text()


def _tcp_of(address: str) -> tuple[str, int]:
    parts = Path(address).parts  # "/", "ip4", HOST, "tcp", PORT, ...
    return parts[2], int(parts[4])


def test_any_port_means_the_last_one_while_it_is_free():
    from locomesh.node.daemon import _with_last_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        assert [str(a) for a in _with_last_port(["/ip4/127.0.0.1/tcp/0"], busy_port)] == ["/ip4/127.0.0.1/tcp/0"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    listen = ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/4321"]
    assert [str(a) for a in _with_last_port(listen, free_port)] == [f"/ip4/127.0.0.1/tcp/{free_port}", listen[1]]
    assert [str(a) for a in _with_last_port(listen, None)] == listen
