"""`score`: a scoring committee member's measurement of round `round`'s accepted contributions
(crdt/scores.py): `authors` sorted and distinct, `scores[i]` the score of `authors[i]` in SCORE_UNIT
units (fixed point: one encoding per value, and bounded)."""

from locomesh.protocol.schema import Int, List

from .base import KEY, LIVE_ROUND, MAX_OP_SIZE, MAX_SET, Equivocation, OpType, Rule

SCORE_UNIT = 1_000_000  # one unit = 1e-6 of a loss (nats)
MAX_SCORE = 1_000_000_000  # |score| <= 1000: a loss change beyond that is clipped by the measurer

SCORE = OpType(
    "score", "the author's scores of round `round`'s contributions",
    {
        "round": LIVE_ROUND,
        "authors": List(KEY, max_len=MAX_SET, min_len=1),
        "scores": List(Int(-MAX_SCORE, MAX_SCORE), max_len=MAX_SET, min_len=1),
    },
    MAX_OP_SIZE,
    Rule(2),
    Equivocation(key=("round",), statement=("authors", "scores")),
    sorted_lists=("authors",),  # one score per author, in one order
    paired=(("authors", "scores"),),
)
