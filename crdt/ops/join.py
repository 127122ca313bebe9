"""`join`: the author asks to take part in the run from round `round` on.

A join alone gives nothing: a round's value admits it (names it, crdt/value.py), at most
MAX_CHANGES a round, and only then may the key commit payloads; a say in the agreement is earned
after that (crdt/membership.py), or given at once to a key the run admitted (genesis, `admit`)."""

from .base import KiB, ROUND, OpType, Rule

JOIN = OpType(
    "join", "the author asks to take part from round `round` on",
    {"round": ROUND}, 4 * KiB,
    Rule(2, members_only=False),  # a join, and a join again after a quick change of mind
    referable=True,
)
