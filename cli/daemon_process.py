"""A node daemon as a child process: start it, wait until its RPC answers, drive it, stop it.

`locomesh swarm`, the tests and the start-up benchmark all run daemons this
way, so they share one correct implementation of "start, wait for ready,
stop cleanly, and never leave a process behind"::

    with DaemonProcess(data_dir, listen=["/ip4/127.0.0.1/tcp/0"]) as daemon:
        daemon.wait_ready()
        print(daemon.rpc().call("node.status"))
    # leaving the block stops it: SIGTERM, then SIGKILL if it hangs

It uses no libp2p: it launches ``python -m locomesh.cli.main node start``
and talks to it with `RpcClient`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from .client import DaemonNotRunning, RpcCallError, RpcClient

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
LOOPBACK = "/ip4/127.0.0.1/tcp/0"


class DaemonError(Exception):
    """The daemon process did not start, or did not stop, as it should."""


class DaemonProcess:
    """One `locomesh node start` child process on data dir `data_dir`."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        listen: Sequence[str] = (LOOPBACK,),
        bootstrap: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        log: IO[Any] | int | None = subprocess.DEVNULL,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.args = [sys.executable, "-m", "locomesh.cli.main", "node", "start", "--data-dir", str(self.data_dir)]
        for address in listen:
            self.args += ["--listen", address]
        for address in bootstrap:
            self.args += ["--bootstrap", address]
        self.args += list(extra_args)
        self._log = log
        self._env = env
        self.process: subprocess.Popen | None = None
        self.started_at: float | None = None

    def start(self) -> DaemonProcess:
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=self._env
        )
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Poll until `node.status` answers; return the status. `DaemonError` if the process dies or is too slow."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise DaemonError(f"the daemon exited with status {code} before it was ready")
            try:
                return self.rpc(timeout=2.0).call("node.status")
            except (DaemonNotRunning, RpcCallError):
                if time.monotonic() > deadline:
                    raise DaemonError(f"the daemon was not ready within {timeout:g} s") from None
            time.sleep(0.02)

    def rpc(self, *, timeout: float = 10.0) -> RpcClient:
        return RpcClient.for_data_dir(self.data_dir, timeout=timeout)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise DaemonError(f"the daemon (pid {self.process.pid}) did not exit within {timeout:g} s") from None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait; if it hangs, SIGKILL. Returns the exit status (negative: killed by a signal)."""
        if self.process is None:
            return 0
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()
