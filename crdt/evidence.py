"""Self-verifying evidence of equivocation: two signed statements by one author that conflict.

Evidence is checked with nothing but the two ops it carries and the run ID, so every replica
reaches the same verdict alone, whatever else it holds:

- "fork": two different ops by one author with the same `seq` (an honest author's ops form one
  chain; a second op at the same place in it is a lie told to part of the network);
- "double-vote": two votes by one author for the same attempt of the same round that differ (in
  the hash, or in the proposer whose set they say they aggregated);
- "double-commit": two payload commitments by one author for the same round that differ (in
  hash or size: one payload cannot match both);
- "double-propose", "double-score": two proposals, or two contribution score reports, by one
  author for the same round that differ;
- "double-result": two shard results by one author for the same shard of the same contributor
  set of the same round that differ in hash (the aggregate is bit-exact: one of them is not what
  it computed). Results for two different sets of one round are two aggregates, no conflict.

A ban can also come from disputes of a shard result (view.py: `dispute_bans`); that one is not
self-verifying evidence but a count of the round's electorate, so `ban_reason` reads it from the
run state.

The two ops need not be valid in the DAG (their parents may never be released): the seal
alone (the author's signature over a batch holding the op) makes each one the author's statement.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from locomesh.protocol import ProtocolError

from .facts import Facts
from .ops import Op, decode_op

if TYPE_CHECKING:
    from .view import RunState

# The order `evidence_fields` tries them in.
REASONS = ("fork", "double-vote", "double-commit", "double-propose", "double-score", "double-result")


def guilty_author(reason: str, a_bytes: bytes, b_bytes: bytes, run: bytes) -> bytes:
    """The author that the evidence convicts, or `ProtocolError` if it proves nothing."""
    a, b = decode_op(a_bytes, run), decode_op(b_bytes, run)
    if a.id == b.id:
        raise ProtocolError("bad-evidence", "the two statements are the same op")
    if a.author != b.author:
        raise ProtocolError("bad-evidence", "the two statements have different authors")
    if not conflict(reason, a, b):
        raise ProtocolError("bad-evidence", f"the two statements do not conflict as {reason!r}")
    return a.author


def conflict(reason: str, a: Op, b: Op) -> bool:
    """Do two distinct ops by one author conflict in the way `reason` names?"""
    if reason == "fork":
        return a.seq == b.seq
    if reason == "double-vote":
        return _same_round(a, b, "crdt.vote") and _attempt(a) == _attempt(b) and _vote(a) != _vote(b)
    if reason == "double-commit":
        return _same_round(a, b, "crdt.commit") and (a.body["hash"], a.body["size"]) != (b.body["hash"], b.body["size"])
    if reason == "double-propose":
        return _same_round(a, b, "crdt.propose") and a.body["authors"] != b.body["authors"]
    if reason == "double-score":
        return _same_round(a, b, "crdt.score") and _report(a) != _report(b)
    if reason == "double-result":
        return (_same_round(a, b, "crdt.shard_result") and a.body["set"] == b.body["set"]
                and a.body["shard"] == b.body["shard"] and a.body["hash"] != b.body["hash"])
    return False


def _vote(op: Op) -> tuple[bytes, bytes]:
    return op.body["hash"], op.body.get("proposer", b"")


def _attempt(op: Op) -> int:
    return op.body.get("attempt", 0)


def _report(op: Op) -> tuple[list[bytes], list[int]]:
    return op.body["authors"], op.body["scores"]


def _same_round(a: Op, b: Op, kind: str) -> bool:
    return a.kind == b.kind == kind and a.body["round"] == b.body["round"]


def evidence_fields(a: Op, b: Op) -> dict | None:
    """The body fields of an evidence op convicting the author of `a` and `b`, if they conflict."""
    if a.id == b.id or a.author != b.author:
        return None
    for reason in REASONS:
        if conflict(reason, a, b):
            first, second = sorted((a.data, b.data))
            return {"reason": reason, "a": first, "b": second}
    return None


# The statements an author can contradict itself in: (name, the facts' rows, the row's place:
# round first, then what else one statement is made for).
_STATEMENTS = (
    ("vote", "votes", lambda row: (row[1], row[4]), ("attempt",)),
    ("payload commitment", "commits", lambda row: (row[1],), ()),
    ("proposal", "proposals", lambda row: (row[1],), ()),
    ("score report", "scores", lambda row: (row[1],), ()),
    ("shard result", "shard_results", lambda row: (row[1], row[2], row[3]), ("set", "shard")),
)


def _readable(value: object) -> str:
    """`value` as a ban reason prints it: a contributor set (32 bytes) as its first 12 hex digits."""
    return value[:6].hex() if isinstance(value, bytes) else str(value)


def ban_reason(facts: Facts, author: bytes, state: RunState | None = None) -> str | None:
    """Why the facts ban `author` (view.py's rule), in words; None if they do not. A ban by
    disputes is seen only with the run `state` derived from these facts (its `disputed`)."""
    if author in facts.forked:
        return "fork: two different ops at one place in its chain"
    if author in facts.equivocated:
        return _double_statement(facts, author) or "equivocation: two different statements for one round"
    if author in facts.convicted:
        return "convicted by evidence of an equivocation seen elsewhere"
    if state is not None and author in state.disputed:
        round_, set_id, shard = state.disputed[author]
        return (f"disputed: more than a third of round {round_}'s electorate recomputed shard {shard} "
                f"of set {_readable(set_id)} and found its signed result wrong")
    return None


def _double_statement(facts: Facts, author: bytes) -> str | None:
    """The first place (by kind, then round) where `author` made two different statements."""
    for name, rows, place, labels in _STATEMENTS:
        said = Counter(place(row) for row in getattr(facts, rows) if row[0] == author)
        double = sorted(at for at, count in said.items() if count > 1)  # rows are distinct: counts are statements
        if double:
            round_, *more = double[0]
            return f"double {name}: two different ones for round {round_}" + "".join(
                f", {label} {_readable(value)}" for label, value in zip(labels, more))
    return None
