"""When a member signs a `recover`, and what it carries (crdt/ops/recover.py, crdt/chain.py).

Tendermint cannot decide while more than a third of the electorate is gone: by design, a
minority cannot decide for the run. When that lasts (`recover_after`: a few attempt deadlines),
the members still there say so, each once per epoch, naming the newest certified round and its
state and carrying their lock (the attempt they last precommitted a value in, and the value);
more than half of the electorate (exactly half with the creator) start a recovery epoch, whose
first round a majority decides and whose value keeps the signers in the electorate; it must
decide the highest proven lock they carry, so a value that may have been certified in the old
epoch is the one the new epoch decides.

After signing recover(e, c) a member sends nothing in epoch e for rounds past c + 1: were the
recovery to complete late, no round of epoch e past c + 1 may have been certified meanwhile
(crdt/chain.py: that is what keeps a late recovery from taking a certificate back).
"""

from __future__ import annotations

from typing import Any

from locomesh.crdt import Chain, Facts
from locomesh.crdt.chain import Tip

from .tendermint import Machine


def recover_fields(chain: Chain, facts: Facts, me: bytes, machine: Machine) -> dict[str, Any] | None:
    """The fields of our recover op for the tip's epoch; None if we signed one for it already."""
    tip = chain.tip
    if any(row[3] == tip.epoch.number for row in _ours(facts, me)):
        return None
    locked = machine.locked is not None and machine.epoch == tip.epoch.number
    return {"round": tip.round - 1, "epoch": tip.epoch.number, "state": b"" if tip.round == 1 else tip.seed,
            "lock": machine.locked_round + 1 if locked else 0, "value": machine.locked.id if locked else b""}


def abstains(facts: Facts, me: bytes, tip: Tip) -> bool:
    """Did we sign a recover in the tip's epoch naming a round before the tip's round - 1?"""
    return any(row[3] == tip.epoch.number and row[2] + 1 < tip.round for row in _ours(facts, me))


def _ours(facts: Facts, me: bytes) -> list[tuple]:
    """Our recover rows: (op, author, round, epoch, state, lock, value)."""
    return [row for row in facts.rows["recover"] if row[1] == me]
