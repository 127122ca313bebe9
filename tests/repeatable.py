"""Run Python code in a fresh process that repeats itself: what the netsim determinism tests compare.

A simulation is repeatable from a fresh process, not within one: py-libp2p walks sets of objects
hashed by their address, so the order depends on the memory layout. The process therefore gets a
fixed PYTHONHASHSEED and, where util-linux's `setarch` exists, address-space randomisation off;
with it on, a hole punch in netsim `nat` moved by 0.25 virtual s in about half of the runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def output_of_fresh_process(code: str, *, timeout: float = 600) -> str:
    """Standard output of `python -c code` in a process laid out the same way every time."""
    command = [sys.executable, "-c", code]
    if shutil.which("setarch"):
        command = ["setarch", "-R", *command]  # -R: no address-space randomisation
    done = subprocess.run(command, env={**os.environ, "PYTHONHASHSEED": "0"},
                          capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout
