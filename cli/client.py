"""The RPC client the `locomesh` commands use to talk to a running daemon.

It finds the daemon through the data dir (``rpc.json`` for the port,
``rpc.cookie`` for the secret, the lock to know a daemon is alive; see
`locomesh.node.datadir`) and speaks JSON-RPC 2.0 over `http.client` with a
timeout. It imports neither libp2p nor torch, so a command like
``locomesh status`` answers in a fraction of a second.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
from pathlib import Path
from typing import Any

from locomesh.node.datadir import DataDir, DataDirError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
DEFAULT_TIMEOUT = 10.0


class DaemonNotRunning(Exception):
    """No daemon runs on this data dir, or it does not answer."""


class RpcCallError(Exception):
    """The daemon answered a call with an error (a JSON-RPC error object or an HTTP status)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


class RpcClient:
    """Calls methods of the daemon at 127.0.0.1:`port` with `cookie`."""

    def __init__(self, port: int, cookie: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.port = port
        self.cookie = cookie
        self.timeout = timeout
        self._ids = itertools.count(1)

    @classmethod
    def for_data_dir(cls, path: str | os.PathLike, *, timeout: float = DEFAULT_TIMEOUT) -> RpcClient:
        """A client for the daemon using data dir `path`, or `DaemonNotRunning`."""
        datadir = DataDir(path)
        try:
            if not datadir.daemon_running():
                raise DaemonNotRunning(f"no locomesh daemon is running on data dir {Path(path)}")
            info, cookie = datadir.read_rpc_info(), datadir.read_cookie()
        except DataDirError as error:
            raise DaemonNotRunning(str(error)) from None
        if info is None or not cookie:
            raise DaemonNotRunning(f"the daemon on data dir {Path(path)} is starting or stopping; try again")
        return cls(info.port, cookie, timeout=timeout)

    def call(self, method: str, params: dict[str, Any] | list | None = None) -> Any:
        """The method's result; `RpcCallError` if the daemon refused, `DaemonNotRunning` if it is gone."""
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            request["params"] = params
        status, body = self._post(json.dumps(request).encode("utf-8"))
        try:
            response = json.loads(body)
        except ValueError:
            raise RpcCallError(status, f"the daemon answered HTTP {status} with a body that is not JSON") from None
        if not isinstance(response, dict):
            raise RpcCallError(status, "the daemon's answer is not a JSON-RPC response")
        if "error" in response:
            error = response["error"] if isinstance(response["error"], dict) else {}
            raise RpcCallError(int(error.get("code", status)), str(error.get("message", "unknown error")))
        return response.get("result")

    def get_metrics(self) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            connection.request("GET", "/metrics")
            return connection.getresponse().read().decode("utf-8")
        except (OSError, http.client.HTTPException) as error:
            raise DaemonNotRunning(f"the daemon's RPC on port {self.port} does not answer: {error}") from None
        finally:
            connection.close()

    def _post(self, body: bytes) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.cookie}"}
        try:
            connection.request("POST", "/", body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as error:  # timeouts and refusals are OSErrors
            raise DaemonNotRunning(f"the daemon's RPC on port {self.port} does not answer: {error}") from None
        finally:
            connection.close()
