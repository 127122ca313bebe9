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
  author for the same round that differ.

The two ops need not be valid in the DAG (their parents may never be released): the seal
alone (the author's signature over a batch holding the op) makes each one the author's statement.
"""

from __future__ import annotations

from locomesh.protocol import ProtocolError

from .facts import Facts
from .ops import Op, decode_op

# The order `evidence_fields` tries them in.
REASONS = ("fork", "double-vote", "double-commit", "double-propose", "double-score")


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


def ban_reason(facts: Facts, author: bytes) -> str | None:
    """Why the facts ban `author` (view.py's rule), in words; None if they do not."""
    if author in facts.forked:
        return "fork: two different ops at one place in its chain"
    if author in facts.equivocated:
        for name, rows in (("vote", facts.votes), ("payload commitment", facts.commits), ("proposal", facts.proposals),
                           ("score report", facts.scores)):
            said: dict[tuple[int, int], int] = {}  # (round, attempt of a vote) -> how many different statements
            for row in rows:
                if row[0] == author:
                    at = (row[1], row[4] if name == "vote" else 0)
                    said[at] = said.get(at, 0) + 1
            double = sorted(at for at, count in said.items() if count > 1)
            if double:
                round_, attempt = double[0]
                return f"double {name}: two different ones for round {round_}" + (
                    f", attempt {attempt}" if name == "vote" else "")
        return "equivocation: two different statements for one round"
    if author in facts.convicted:
        return "convicted by evidence of an equivocation seen elsewhere"
    return None
