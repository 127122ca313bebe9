"""The `locomesh` client commands without a daemon, their tables, and `locomesh swarm` end to end."""

from __future__ import annotations

import subprocess
import sys
import time

from locomesh.cli.client import EXIT_NO_DAEMON
from locomesh.cli.main import main
from locomesh.cli.status_cmd import format_peers, format_status
from locomesh.node.datadir import DataDir, RpcInfo


def locomesh(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "locomesh.cli.main", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_status_without_a_daemon_says_so_and_exits_3(tmp_path, capsys):
    for command in (["status"], ["status", "--json"], ["peers"], ["node", "stop"]):
        assert main([*command, "--data-dir", str(tmp_path)]) == EXIT_NO_DAEMON
        err = capsys.readouterr().err
        assert "no locomesh daemon is running" in err and "locomesh node start" in err
        assert err.count("\n") == 1


def test_stale_files_of_a_crashed_daemon_are_not_trusted(tmp_path, capsys):
    datadir = DataDir(tmp_path)
    datadir.new_cookie()
    datadir.write_rpc_info(RpcInfo(port=1, pid=999_999, peer_id="gone"))
    assert main(["status", "--data-dir", str(tmp_path)]) == EXIT_NO_DAEMON
    assert "no locomesh daemon is running" in capsys.readouterr().err


def test_the_data_dir_comes_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCOMESH_DATA_DIR", str(tmp_path / "from-env"))
    assert main(["status"]) == EXIT_NO_DAEMON
    assert str(tmp_path / "from-env") in capsys.readouterr().err


def test_the_client_imports_neither_libp2p_nor_torch(tmp_path):
    code = (
        "import sys; from locomesh.cli.main import main; "
        f"assert main(['status', '--data-dir', {str(tmp_path)!r}]) == 3; "
        "heavy = sorted(name for name in ('libp2p', 'torch', 'trio') if name in sys.modules); "
        "print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_status_table():
    status = {
        "peer_id": "12D3KooWX",
        "version": "0.1.0",
        "uptime_s": 3725.2,
        "peers_connected": 2,
        "bytes_in": 1536,
        "bytes_out": 10,
        "protocol_errors": 0,
        "services": ["ping"],
        "runs": [],
        "listen_addrs": ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWX", "/ip4/10.0.0.1/tcp/1/p2p/12D3KooWX"],
        "observed_addrs": [],
        "bootstrap": {"configured": 2, "connected": 0},
    }
    assert format_status(status).splitlines() == [
        "peer id          12D3KooWX",
        "version          0.1.0",
        "uptime           1h 02m 05s",
        "peers connected  2",
        "bootstrap        0/2 connected",
        "bytes in / out   1.5 KiB / 10 B",
        "protocol errors  0",
        "services         ping",
        "runs             -",
        "listening on     /ip4/127.0.0.1/tcp/1/p2p/12D3KooWX",
        "                 /ip4/10.0.0.1/tcp/1/p2p/12D3KooWX",
        "observed as      -",
    ]


def test_peers_table():
    assert format_peers([]) == "no peers connected"
    since = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    peer = {"peer_id": "12D3KooWA", "direction": "inbound", "connected_since": since}
    peers = [peer | {"connection_addrs": ["/ip4/1.2.3.4/tcp/5"]}]
    assert format_peers(peers).splitlines() == [
        "PEER ID    DIRECTION  CONNECTED SINCE      ADDRESS",
        "12D3KooWA  inbound    2026-01-02 03:04:05  /ip4/1.2.3.4/tcp/5",
    ]


def test_the_swarm_trains_together_and_ends_with_one_parameters_hash():
    result = locomesh("swarm", "--nodes", "2", "--rounds", "2", "--inner-steps", "5", timeout=240)
    assert result.returncode == 0, result.stderr
    assert "round   1  eval loss" in result.stdout and "round   2  eval loss" in result.stdout
    assert "summary: 2 rounds by 2 daemons" in result.stdout
    assert "the same hash on every node" in result.stdout
    assert "2 daemons trained 2 rounds together and stopped cleanly" in result.stderr


def test_help_lists_the_commands():
    result = locomesh("--help")
    assert result.returncode == 0
    for command in ("node", "status", "peers", "swarm"):
        assert command in result.stdout
