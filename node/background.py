"""Work nobody waits for, on a thread that yields the CPU to work others wait for.

A round's critical path is fetch, outer step, vote: every peer waits for the slowest. Writing the
new state as a checkpoint is not on it (a peer that needs the state downloads it later), yet it
is the heaviest step of a round (compressing and hashing three copies of the model). Run on an
ordinary thread it competes for the cores with the next round's training, and on a machine that
hosts several daemons with their outer steps. `run_in_background` runs it on a single worker
thread whose scheduling priority is lowered (nice +10, where the OS allows it), so it fills idle
time instead.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import trio

BACKGROUND_NICENESS = 10

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _lower_priority() -> None:
    """On Linux, niceness is per thread: this lowers the calling worker thread only."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
    except (OSError, AttributeError):  # not permitted, or not a platform with per-thread priorities
        pass


def _background_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="locomesh-background",
                                           initializer=_lower_priority)
        return _executor


async def run_in_background(function: Callable[..., Any], *args: Any) -> Any:
    """Run `function(*args)` on the low-priority background thread and return its result (or
    raise its exception). Calls run one at a time, in order. Like `trio.to_thread.run_sync`, a
    cancelled caller still waits for the function to finish: a half-written file is not left
    behind by a cancellation."""
    future = _background_executor().submit(function, *args)
    return await trio.to_thread.run_sync(future.result)
