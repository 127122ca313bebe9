"""`prevote`: Tendermint's PREVOTE for attempt `attempt` of round `round` in epoch `epoch`: the ID of
the value the author found valid and holds (crdt/value.py), or b"" (nil)."""

from .base import ATTEMPT, EPOCH, KiB, LIVE_ROUND, NIL_OR_HASH, Equivocation, OpType, Rule

PREVOTE = OpType(
    "prevote", "the author prevotes value `value` (b'': nil) in attempt `attempt` of round `round`",
    {"round": LIVE_ROUND, "epoch": EPOCH, "attempt": ATTEMPT, "value": NIL_OR_HASH}, 4 * KiB,
    Rule(2, key=("round", "epoch", "attempt")),
    Equivocation(key=("round", "epoch", "attempt"), statement=("value",)),
)
