"""Self-verifying evidence of equivocation: two signed statements by one author that conflict.

Evidence is checked with nothing but the two ops it carries and the run ID, so every replica
reaches the same verdict alone, whatever else it holds:

- "fork": two different ops by one author with the same `seq` (an honest author's ops form one
  chain; a second op at the same place in it is a lie told to part of the network);
- "double-<type>": two ops of one type by one author at one place that state different things,
  as the type's `equivocation` says (crdt/ops/): two commits for one round, two proposals,
  prevotes or precommits for one attempt, two recovers for one epoch, two score reports for one
  round, two shard results for one shard of one set.

Evidence proves; a ban takes effect in the electorate once a round's value names the evidence op
(crdt/membership.py). A ban can also come from disputes of a shard result, named by a value with
the result (crdt/value.py): that one is a count of the round's electorate, not self-verifying.

The two ops need not be valid in the DAG (their parents may never be released): the seal alone
(the author's signature over a batch holding the op) makes each one the author's statement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from locomesh.protocol import ProtocolError

from .facts import Facts
from .ops import REGISTRY, Op, decode_op

if TYPE_CHECKING:
    from .chain import Chain

REASONS = ("fork", *(f"double-{name}" for name, entry in REGISTRY.items() if entry.equivocation is not None))


def guilty_author(reason: str, a_bytes: bytes, b_bytes: bytes, run: bytes) -> bytes:
    """The author that the evidence convicts, or `ProtocolError` if it proves nothing."""
    if reason not in REASONS:
        raise ProtocolError("bad-evidence", f"{reason[:32]!r} is no reason evidence can give")
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
    name = reason.removeprefix("double-")
    if a.type != name or b.type != name or REGISTRY[name].equivocation is None:
        return False
    entry = REGISTRY[name]
    row_a, row_b = entry.row(a), entry.row(b)
    return entry.place(row_a) == entry.place(row_b) and entry.statement(row_a) != entry.statement(row_b)


def evidence_fields(a: Op, b: Op) -> dict | None:
    """The body fields of an evidence op convicting the author of `a` and `b`, if they conflict."""
    if a.id == b.id or a.author != b.author:
        return None
    for reason in REASONS:
        if conflict(reason, a, b):
            first, second = sorted((a.data, b.data))
            return {"reason": reason, "a": first, "b": second}
    return None


def ban_reason(facts: Facts, author: bytes, chain: Chain | None = None) -> str | None:
    """Why `author` is banned, or proven to be and banned once a round names the proof, in words;
    None if neither."""
    if author in facts.forked:
        return "fork: two different ops at one place in its chain"
    if author in facts.equivocated:
        return _double_statement(facts, author) or "equivocation: two different statements at one place"
    if author in facts.convicted:
        return "convicted by evidence of an equivocation seen elsewhere"
    if chain is not None and author in chain.tip.membership.banned:
        return ("disputed: more than a third of a round's electorate recomputed a shard it signed the result of "
                "and found the result wrong")
    return None


def _double_statement(facts: Facts, author: bytes) -> str | None:
    """The first place (by type, then key) where `author` made two different statements."""
    for place, said in sorted(facts._said.items(), key=lambda item: repr(item[0])):
        if place[1] == author and len(said) > 1:
            name, _author, *key = place
            fields = REGISTRY[name].equivocation.key
            return f"double {name}: two different ones for " + ", ".join(
                f"{field} {_readable(value)}" for field, value in zip(fields, key))
    return None


def _readable(value: object) -> str:
    """`value` as a ban reason prints it: a 32-byte ID as its first 12 hex digits."""
    return value[:6].hex() if isinstance(value, bytes) else str(value)
