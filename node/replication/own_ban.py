"""Whether the runs we replicate ban our own key, and why: logged once, asked by the round service.

A self-verifying ban (a fork, an equivocation, a conviction) is seen from the op records alone,
so it is looked for after every op. A ban by disputes needs the derived run state, so it is
looked for only when asked (`reason`): deriving after every op is quadratic in a backlog."""

from __future__ import annotations

import logging

from locomesh.crdt import Replica
from locomesh.crdt.evidence import ban_reason
from locomesh.protocol.runs import short_run_id

logger = logging.getLogger(__name__)


class OwnBans:
    """Why our key (`me`) is banned, per run."""

    def __init__(self) -> None:
        self._reasons: dict[bytes, str] = {}  # run -> why our own key is banned there

    def watch(self, replica: Replica, me: bytes) -> None:
        """Note a self-verifying ban of `me` as soon as an op of `replica` brings it."""

        def check() -> None:
            if replica.run_id not in self._reasons:
                self._note(replica, ban_reason(replica.facts, me))

        check()
        replica.listeners.append(check)

    def reason(self, replica: Replica | None, run_id: bytes, me: bytes | None) -> str | None:
        """Why `me` is banned in `run_id` (disputes included), or None."""
        if run_id not in self._reasons and replica is not None and me is not None:
            self._note(replica, replica.ban_reason(me))
        return self._reasons.get(run_id)

    def _note(self, replica: Replica, reason: str | None) -> None:
        if reason is not None and replica.run_id not in self._reasons:
            self._reasons[replica.run_id] = reason
            logger.warning("run %s: this node's key is banned: %s. It can take no further part in this run "
                           "(a new data dir gives a new key)", short_run_id(replica.run_id), reason)
