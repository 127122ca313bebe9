"""`precommit`: Tendermint's PRECOMMIT for attempt `attempt` of round `round` in epoch `epoch`: the
value's ID and `state`, the hash of the state its aggregate gives (the outer step is bit-exact,
so honest precommits for one value agree); b"" and b"" for nil. More than two thirds of the
round's electorate precommitting one (value, state) in one attempt certify the round
(crdt/chain.py). Referable: the next round's value names the precommits that certified this one."""

from .base import ATTEMPT, EPOCH, KiB, LIVE_ROUND, NIL_OR_HASH, Equivocation, OpType, Rule

PRECOMMIT = OpType(
    "precommit", "the author precommits value `value` with state hash `state` in attempt `attempt` of round `round`",
    {"round": LIVE_ROUND, "epoch": EPOCH, "attempt": ATTEMPT, "value": NIL_OR_HASH, "state": NIL_OR_HASH}, 4 * KiB,
    Rule(2, key=("round", "epoch", "attempt")),
    Equivocation(key=("round", "epoch", "attempt"), statement=("value", "state")),
    referable=True,
)
