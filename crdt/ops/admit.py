"""`admit`: the author vouches for `key`. Which admissions count is the run's `admission` setting
(crdt/genesis.py): the creator's (`creator`, and `open` too), or more than two thirds of the
electorate's (`electorate`). An admitted key has a say from the round its join is admitted in, and
in a run that is not open only admitted keys are admitted at all (crdt/membership.py)."""

from .base import KEY, KiB, OpType, Rule

ADMIT = OpType(
    "admit", "the author vouches for `key`",
    {"key": KEY}, 4 * KiB,
    Rule(64, key=(), not_author="key"),  # a few dozen a round: a team added at once
    referable=True,
)
