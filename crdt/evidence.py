"""Self-verifying evidence of equivocation: two signed statements by one author that conflict.

Evidence is checked with nothing but the two ops it carries and the run ID, so every replica
reaches the same verdict alone, whatever else it holds:

- "fork": two different ops by one author with the same `seq` (an honest author's ops form one
  chain; a second op at the same place in it is a lie told to part of the network);
- "double-vote": two round votes by one author for the same round with different hashes.

The two ops need not be valid in the DAG (their parents may never be released): the signature
alone makes each one the author's statement.
"""

from __future__ import annotations

from locomesh.protocol import ProtocolError

from .ops import Op, decode_op


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
        return (
            a.kind == b.kind == "crdt.vote" and a.body["round"] == b.body["round"] and a.body["hash"] != b.body["hash"]
        )
    return False


def evidence_fields(a: Op, b: Op) -> dict | None:
    """The body fields of an evidence op convicting the author of `a` and `b`, if they conflict."""
    if a.id == b.id or a.author != b.author:
        return None
    for reason in ("fork", "double-vote"):
        if conflict(reason, a, b):
            first, second = sorted((a.data, b.data))
            return {"reason": reason, "a": first, "b": second}
    return None
