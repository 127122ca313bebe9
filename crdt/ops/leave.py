"""`leave`: the author stops taking part after round `round`. It takes effect at the round
boundary after a round whose value names it (crdt/value.py); until then the author keeps its say,
and an honest one keeps voting (node/rounds: a graceful stop costs the run no deadline)."""

from .base import KiB, ROUND, OpType, Rule

LEAVE = OpType(
    "leave", "the author stops taking part after round `round`",
    {"round": ROUND}, 4 * KiB,
    Rule(2),
    referable=True,
)
