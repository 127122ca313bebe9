"""The bounded waiting room for ops whose dependencies have not arrived yet.

An op can arrive before its parents (gossip has no order). It waits here until its last
missing dependency is applied. A peer can send ops whose parents never come, so the room is
bounded twice, by count and by bytes; when a new op would overflow it, the ops that have
waited longest are evicted first (arrival order, so the choice is deterministic for a given
delivery) and `park` returns their IDs so the caller can say so. An evicted op is not lost
for good: anti-entropy fetches it again once its parents are here.
"""

from __future__ import annotations

from collections import defaultdict

from .ops import Op, OpId


class PendingBuffer:
    def __init__(self, max_ops: int, max_bytes: int) -> None:
        if max_ops < 1 or max_bytes < 1:
            raise ValueError("the pending buffer needs room for at least one op")
        self.max_ops, self.max_bytes = max_ops, max_bytes
        self._ops: dict[OpId, Op] = {}  # in arrival order
        self._missing: dict[OpId, set[OpId]] = {}
        self._waiters: defaultdict[OpId, set[OpId]] = defaultdict(set)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, op_id: OpId) -> bool:
        return op_id in self._ops

    def get(self, op_id: OpId) -> Op | None:
        return self._ops.get(op_id)

    def park(self, op: Op, missing: set[OpId]) -> list[OpId]:
        """Hold `op` until every ID in `missing` is applied; return the IDs evicted to make room."""
        self._ops[op.id] = op
        self._missing[op.id] = set(missing)
        for dep in missing:
            self._waiters[dep].add(op.id)
        self.bytes += len(op.data)
        evicted = []
        while len(self._ops) > self.max_ops or self.bytes > self.max_bytes:
            oldest = next(iter(self._ops))
            self._remove(oldest)
            evicted.append(oldest)
        return evicted

    def resolve(self, dep: OpId) -> list[Op]:
        """`dep` was applied: the ops that waited for it and for nothing else, now ready."""
        ready = []
        for waiter in sorted(self._waiters.pop(dep, ())):
            missing = self._missing[waiter]
            missing.discard(dep)
            if not missing:
                ready.append(self._ops[waiter])
                self._remove(waiter)
        return ready

    def reject_waiters(self, dep: OpId) -> list[Op]:
        """`dep` is invalid: remove and return every op that waited for it."""
        dropped = [self._ops[w] for w in sorted(self._waiters.pop(dep, ()))]
        for op in dropped:
            self._remove(op.id)
        return dropped

    def wanted(self) -> set[OpId]:
        """Dependencies that some waiting op lacks and that are not waiting here themselves."""
        return {dep for dep in self._waiters if dep not in self._ops}

    def _remove(self, op_id: OpId) -> None:
        op = self._ops.pop(op_id)
        self.bytes -= len(op.data)
        for dep in self._missing.pop(op_id):
            waiters = self._waiters.get(dep)
            if waiters is not None:
                waiters.discard(op_id)
                if not waiters:
                    del self._waiters[dep]
