"""`node start` refuses what it cannot do in one line on stderr and an exit status, no traceback:
a training device this machine lacks (issue #37, 3), a full disk at the lock, the key or the first
writes of the running node (issue #37, 9). In this process (`main`), with CUDA hidden from torch and
the disk filled by a fake `os.write` (tests/full_disk.py): no root, no GPU, no child process."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from locomesh.cli.main import main
from locomesh.node.datadir import DataDir, save_identity
from locomesh.protocol import Identity

from .full_disk import FullDisk, files_under

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


@pytest.fixture(autouse=True)
def own_logging(monkeypatch):
    """`node start` points the root logger at its stderr; give pytest's handlers back afterwards."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def start(data_dir, *args: str) -> int:
    """`node start` here, on an RPC port already taken: a start that got past what the test expects
    to stop it exits there ("address in use"), rather than run on for ever."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        return main(["node", "start", "--data-dir", str(data_dir), "--listen", LOOPBACK, "--rpc-port", port, *args])


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_device_this_machine_lacks_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert start(tmp_path / "node", "--device", "cuda") == 2
    assert one_line(capsys.readouterr().err) == ("locomesh: device: cuda asked for, this machine has no CUDA device; "
                                                 "start the node with --device auto or cpu, or the device this machine has")
    assert not (tmp_path / "node").exists()  # refused before the data dir was taken


def lock_line() -> int:
    """The bytes the data dir's lock file gets: our PID and a newline."""
    return len(f"{os.getpid()}\n")


@pytest.mark.parametrize("full_at", ["daemon.lock", "identity.key"])
def test_a_full_disk_at_start_is_one_line_and_leaves_no_half_written_file(tmp_path, monkeypatch, capsys, full_at):
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    free = 0 if full_at == "daemon.lock" else lock_line()
    monkeypatch.setattr(os, "write", FullDisk(data_dir, free).write)
    assert start(data_dir) == 2
    where = data_dir / full_at
    assert one_line(capsys.readouterr().err) == (f"locomesh: no space left on device: {where}; free some space or use "
                                                 "--data-dir DIR on another disk")
    assert files_under(data_dir) == {"daemon.lock"}  # no key, no temporary
    assert not DataDir(data_dir).daemon_running()  # the lock was let go


def test_a_full_disk_once_the_node_runs_is_one_line_too(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "node"
    save_identity(Identity.generate(), DataDir(data_dir).identity_path)
    monkeypatch.setattr(os, "write", FullDisk(data_dir, lock_line()).write)  # the lock's line, then nothing
    assert start(data_dir) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"locomesh: no space left on device: {data_dir}")
    assert line.endswith("; free some space or use --data-dir DIR on another disk")
    assert not [name for name in files_under(data_dir) if name.endswith(".tmp")]
