"""The dashboard as a part of the daemon's local HTTP side (a `locomesh.node.rpc.server.Site`).

`Dashboard(node)` registers two RPC methods: ``dashboard.login`` (for the
cookie holder: a one-time login URL, what ``locomesh ui`` prints) and
``node.traffic`` (the node's traffic over time, per-peer bytes and round
trips: `telemetry`). Its pages read the node through the node's own RPC
methods, a read-only few of them (`READ_METHODS`), with the browser's
session in place of the cookie: one data model for the CLI and the pages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio
from starlette.routing import BaseRoute

from locomesh.node.dashboard.auth import TOKEN_TTL, LoginTokens, Sessions
from locomesh.node.dashboard.routes import Assets, Routes
from locomesh.node.dashboard.telemetry import Pinger, Telemetry
from locomesh.node.rpc.dispatch import RegistryView, RpcDispatcher, RpcError
from locomesh.node.runtime import Node

# What a browser session may call: reading only. Never the cookie holder's own (run.create,
# node.shutdown, dashboard.login...): a session must not be able to act, nor mint more sessions.
READ_METHODS = frozenset({
    "node.status", "node.peers", "node.traffic", "run.list", "run.info", "run.status", "run.state",
    "checkpoint.list", "checkpoint.progress", "checkpoint.peers",
})
NOT_SERVING = -32010


class Dashboard:
    """The dashboard of `node`: sessions, login tokens, telemetry (round trips through `ping`), routes."""

    def __init__(
        self,
        node: Node,
        *,
        ping: Pinger | None = None,
        on_call: Callable[[str], None] | None = None,
        on_reject: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.tokens = LoginTokens()
        self.sessions = Sessions()
        self.telemetry = Telemetry(node, ping=ping)
        self.dispatcher = RpcDispatcher(RegistryView(node.rpc, READ_METHODS), on_call=on_call)
        self.port: int | None = None
        self._routes = Routes(self, Assets.load(), on_reject)
        node.rpc.register("dashboard.login", self._rpc_login)
        node.rpc.register("node.traffic", self.telemetry.rpc_traffic)

    def routes(self) -> Sequence[BaseRoute]:
        return self._routes.all()

    async def run(self, port: int, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve at `port` (for login URLs) and keep the telemetry going until cancelled."""
        self.port = port
        await self.telemetry.run(task_status=task_status)

    async def _rpc_login(self) -> dict[str, Any]:
        """``dashboard.login``: a login URL that works once, within ``expires_in_s`` seconds."""
        if self.port is None:
            raise RpcError(NOT_SERVING, "the dashboard is not served yet")
        token = self.tokens.issue()
        return {"url": f"http://127.0.0.1:{self.port}/login?token={token}", "expires_in_s": TOKEN_TTL}
