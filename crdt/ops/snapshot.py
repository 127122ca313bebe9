"""`snapshot`: the author computed the facts of the down-set of `frontier` (crdt/snapshot.py), `ops`
ops, whose canonical form hashes to `state`. The frontier must be applied first."""

from locomesh.protocol.schema import Int, List

from .base import HASH, KiB, MAX_PARENTS, OpType, Rule

SNAPSHOT = OpType(
    "snapshot", "the facts of the down-set of `frontier` hash to `state`",
    {"state": HASH, "frontier": List(HASH, max_len=MAX_PARENTS, min_len=1), "ops": Int(1, 2**40)}, 8 * KiB,
    Rule(2, key=()),
    refs=("frontier",),
    sorted_lists=("frontier",),
)
