"""How the simulator runs blocking store work: inline, on the event loop.

The node runs store work (hashing, file writes, fsync) through an `Offload`
(`locomesh.node.transfer.download.Offload`): a worker thread in the daemon
(`trio.to_thread.run_sync`, every default in node/), so the event loop stays
free. A simulation passes `run_inline` instead: a thread's real duration would
let virtual time run ahead by however long the thread happened to take, and the
same seed would not give the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio


async def run_inline(function: Callable[..., Any], *args: Any) -> Any:
    """An `Offload` that runs `function(*args)` on the event loop (it takes no virtual time)."""
    await trio.lowlevel.checkpoint()
    return function(*args)
