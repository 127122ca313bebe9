"""`dispute`: the author's exact recomputation of shard `shard` of set `set` of round `round` differs
from `hash`, which `member` signed as its result (crdt/view.py: disputes from more than a third of
the round's electorate ban the signer)."""

from .base import HASH, KEY, KiB, LIVE_ROUND, OpType, Rule
from .shard_result import SHARD

DISPUTE = OpType(
    "dispute", "the author disputes the result `hash` that `member` signed for shard `shard` of set `set`",
    {"round": LIVE_ROUND, "set": HASH, "shard": SHARD, "member": KEY, "hash": HASH}, 4 * KiB,
    Rule(2, key=("round", "set", "shard", "member"), not_author="member"),  # disputing oneself proves nothing
    referable=True,  # a value names the disputes that ban a result's signer (crdt/value.py)
)
