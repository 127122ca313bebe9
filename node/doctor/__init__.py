"""The daemon's part of ``locomesh doctor``: what this node can tell about taking part, and why not.

- `memory`: a run's footprint against the node's ``memory_limit`` and the memory available (the
  check a join runs too);
- `network`: plain-words checks of bootstrap, reachability, NAT behaviour, port mapping and relays,
  from what ``node.status`` already shows;
- `run_checks`: for one run, its members' reachability from here, round trips and bandwidth to a
  few of them, and whether this machine would finish a round within the run's deadline;
- `service`: the ``node.doctor`` RPC method that gathers them.

Every check is a `Check`: a name, ``ok``/``warn``/``fail``, what was found, and the fix. A check
that stops the node from taking part fails; one that warns leaves it able to (`checks.verdict`).
"""

from .checks import FAIL, OK, WARN, Check, takes_part, verdict

__all__ = ["FAIL", "OK", "WARN", "Check", "takes_part", "verdict"]
