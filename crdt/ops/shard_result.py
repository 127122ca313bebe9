"""`shard_result`: sharded exchange (node/exchange/sharded_machine.py): a shard committee member's
signed hash of its bit-exact aggregate of shard `shard` of round `round` over the contributor set
`set` (a round's value names one set; an honest member signs one result per set and shard)."""

from locomesh.protocol.schema import Int

from .base import HASH, KiB, LIVE_ROUND, Equivocation, OpType, Rule

MAX_SHARDS = 4096
SHARD = Int(0, MAX_SHARDS - 1)

SHARD_RESULT = OpType(
    "shard_result", "the author's aggregate of shard `shard` of set `set` of round `round` hashes to `hash`",
    {"round": LIVE_ROUND, "set": HASH, "shard": SHARD, "hash": HASH}, 4 * KiB,
    Rule(2, key=("round", "set", "shard")),
    # The aggregate is bit-exact: two results for one shard of one set are not both honest.
    Equivocation(key=("round", "set", "shard"), statement=("hash",)),
    referable=True,  # a value names a disputed result with its disputes (crdt/value.py)
)
