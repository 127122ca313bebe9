"""What a node service is: one long-running task inside the node, with handlers and RPC methods.

The node (`locomesh.node.runtime.Node`) runs a list of services, in order,
inside its nursery. A service is any object with a `name` and::

    async def run(self, node, task_status=trio.TASK_STATUS_IGNORED) -> None

Its contract:

1. Set up first: register stream handlers with `node.set_stream_handler`
   (which guards them, see `locomesh.node.streams.guarded`), RPC methods with
   `node.rpc.register`, metrics with `node.metrics`, status fields with
   `node.add_status_field`.
2. Call ``task_status.started()`` once it is ready to serve. The node starts
   the next service only then, and answers RPC only when all have started.
3. Then do its background work (or just return if it has none; its handlers
   stay registered). Every network wait has a timeout.
4. On shutdown the node first awaits, for every service that has one, its
   ``async def drain(self) -> None`` (all at once, within DRAIN_SECONDS: what a
   service must still say to its peers before it goes, a run's leave), then
   cancels the nursery. A service that must persist something does it in a
   ``finally`` under
   ``trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_GRACE)``
   so shutdown stays bounded.

An exception escaping `run` is a bug: it stops the whole node (loudly),
rather than leaving it up with a dead part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    from .runtime import Node

SHUTDOWN_GRACE = 3.0
DRAIN_SECONDS = 30.0  # what the services' drains may take at most, together


class Service(Protocol):
    name: str

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...
