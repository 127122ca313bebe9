"""What one author may write: members only, a few ops per round and window, rounds others back.

In an open run anyone may write, so without these rules one key could write any number of valid
ops, for any round, without ever joining, and every replica would keep them for good. The rules
(each op is checked against them when it is applied, replica.py):

1. **Members only.** An op other than `join`, `evidence` and `hparams` is valid only if its
   author's own chain (below) holds a `join`. A `leave` does not take that back: a member that
   leaves votes until a round's value puts the leave into effect, and comes back by committing
   (crdt/membership.py). `evidence` may come from
   anyone: it is self-verifying (evidence.py), convicts the same author whoever publishes it, and a
   node that only replicates a run (its creator before it joins, an observer) must be able to
   spread the proof of a fork to replicas that saw one side only. `hparams` comes only from keys
   named at genesis (genesis.py), which the manifest trusts and which need not train.
2. **Caps per author and round** (`RULES`, from each op type's file in crdt/ops/): at most `cap`
   ops of a type per author per key (the round, and for the agreement's messages the epoch and
   attempt too) along the author's own chain. The caps are above what an honest node writes: one
   commit a round, one proposal, prevote and precommit per attempt, one recover per epoch, each
   capped at 2 so that a second, different one is let in and shows as an equivocation (a ban),
   and a third is refused; a checkpoint or two and a few attestations a round; a join and a
   leave after a quick change of mind; a shard result per committee seat; a dispute per wrong
   result; an evidence op per equivocator it sees. A dispute never names its own author
   (`not_author`): disputing oneself proves nothing. Round-less types (`admit`, `snapshot`,
   `evidence`) count against the newest round the author's own chain named.
3. **Not past the backed round**: an op may name a round at most `AHEAD` past the round its
   causal past *backs* for its author: the highest round named by a precommit of a value by
   another author, or by any such precommit when the author is trusted at genesis (the creator
   and the keys admitted at genesis). A certified round was precommitted by a quorum, so an
   honest member always finds it backed by someone else's precommit (a lone member that is not
   trusted excepted: Known limits), and honest nodes name at most the certified round + 2. One
   key's own precommits back nothing for itself: it cannot climb alone, whatever it writes.
4. **Not too far behind**: an op may name a round at most `BEHIND` below the highest round its
   author's own chain named before. Honest nodes write a state's checkpoint a round or two after
   its round (storing runs while the next round trains) and leave naming at least the certified
   round. This rule is what bounds the walk that counts rule 2 (below).
5. **A budget per window of rounds** (`WINDOW`, `WINDOW_OPS`, `WINDOW_BYTES`): the ops an
   author's chain holds since its highest round (`top`) reached `top - WINDOW + 1` number at
   most `WINDOW_OPS` and their contents at most `WINDOW_BYTES`. Rule 2 caps each kind in each
   round; this caps what all kinds together weigh, so the big kinds (proposals, scores,
   evidence: tens of KiB each) cannot fill a replica either. An honest member writes a commit,
   a prevote and a precommit per attempt, a proposal now and then, a checkpoint or two, a few
   attestations and a score in a round (in sharded exchange, a shard result per committee seat
   too): a few KiB, a few hundred ops in a round that runs through many attempts.
   Content bytes are counted, not wire bytes: the same op under two seals is one op. Evidence
   is left out (`UNBUDGETED`): it is written on others' misdeeds, so counting it would let
   equivocating Sybils spend an honest member's budget; rule 2 caps it per round.

`hparams` (the genesis writers' schedule: a change may be set for any later round) is exempt
from rules 2 to 5, and its round backs nothing.

Agreement. Replicas must agree on which ops are valid, or an honest op that builds on an op some
replicas refused would never apply there. So every rule reads only the op and its causal past:
the *own chain* of an op is its chain predecessor (the dependency by the same author with the
largest `seq`, ties broken by the smaller ID: an honest author always lists its own newest op,
replica.py), that op's predecessor, and so on. A count over the chain is a count over the causal
past, whatever else a replica holds or in which order ops came; a fork gives two chains, each
counted on its own (and the fork is a ban anyway). The backing of rule 3 is a maximum over the
causal past, so it too is the same on every replica.

Cost. Per applied op one `Link` is kept (its chain predecessor's link, whether the author is a
member, the highest round its chain named, the backing of its causal past, its key and count,
the ops and content bytes its chain holds so far), computed from the links of its dependencies,
never by walking the DAG. Counting rule 2 walks back the own chain only over links whose chain
already named the op's round: by rule 4 those name rounds within 2 * BEHIND of it, so the walk
is bounded by the caps of that many rounds (a few links for an honest author). Rule 5 jumps back
the chain one `top` at a time (`Link.since`): at most `WINDOW` jumps.

Known limits. The backing is a precommit by another key, not a certificate: a certificate needs
the electorate of the op's causal past, which would cost a replay of that past per op. So keys
that collude can still climb, each on the other's precommits, `AHEAD` rounds per op; rules 2 and 5 bound
what each key writes per window of rounds it climbs, and the node's gossip rate limit per peer
(node/replication/service.py) how fast. A lone member that is not trusted at genesis (a run
whose trusted members all left, down to one member) finds no other precommit, and cannot name a
round more than `AHEAD` past the last one another member precommitted until a second member joins.
A replica started from a snapshot does not know the chain links of the ops the snapshot covers;
it takes them as permissive (a member, no counts, no top round, the highest round the snapshot's votes name as
backed by anyone) until snapshots carry the chain state.
"""

from __future__ import annotations

from typing import Any, Mapping

from locomesh.protocol import ProtocolError

from .facts import Facts
from .ops import REGISTRY, Op, OpId
from .ops.base import Rule, freeze

AHEAD = 4  # honest nodes name at most the certified round + 2 (rule 3)
BEHIND = 8  # honest nodes name at least a round or two below their newest (rule 4)
# Rule 5. An honest member writes some ten ops and a few KiB in a round, a few hundred ops in a
# round that runs through many attempts; the budget leaves it many times that.
WINDOW = 8  # rounds
WINDOW_OPS = 1024
WINDOW_BYTES = 1024 * 1024
# Evidence is written on others' misdeeds, as many as equivocators show up: were it budgeted,
# Sybils equivocating in bulk would spend an honest member's budget and silence it. Rule 2 caps it.
UNBUDGETED = frozenset({"evidence"})
# One rule per op type, from the registry (crdt/ops/: each type's file says why its cap is what it is).
RULES: dict[str, Rule | None] = {name: entry.rule for name, entry in REGISTRY.items()}
LIMIT_CODES = frozenset({"not-member", "over-cap", "too-far-ahead", "too-far-behind", "no-rule", "over-budget",
                         "names-self"})

# The highest round a precommit of a value names in a causal past, with its author, and the
# highest by any other author (rule 3): enough to say, for every author, the highest round someone
# else precommitted. The author None stands for the precommits a snapshot covers, which back a
# round for everyone.
Backing = tuple[int, bytes | None, int]
NO_VOTES: Backing = (0, None, 0)


def merge_backing(a: Backing, b: Backing) -> Backing:
    """The backing of the union of two causal pasts."""
    if b[0] > a[0]:
        a, b = b, a  # a: the one with the highest vote (on a tie either: both rounds are then backed)
    second = b[0] if b[1] != a[1] else b[2]
    return (a[0], a[1], max(a[2], second))


def backed_round(backing: Backing, author: bytes, trusted: bool) -> int:
    """The highest round `backing` says was voted for by someone other than `author` (by anyone,
    when `author` is `trusted`)."""
    top, voter, other = backing
    return top if trusted or voter != author else other


class Link:
    """One applied op's place in its author's own chain, and what the rules need to know of it."""

    __slots__ = ("prev", "member", "top", "backing", "kind", "at", "count", "ops", "size", "since")

    def __init__(self, prev: Link | None, member: bool, top: int, backing: Backing, kind: str | None, at: Any,
                 count: int, ops: int = 0, size: int = 0):
        self.prev = prev  # the chain predecessor's link
        self.member = member  # the chain holds a join, this op included
        self.top = top  # the highest round the chain named, this op included
        self.backing = backing  # the votes of the causal past, this op included (rule 3)
        # Rule 2 counts this op under (kind, at): its rule's key (its round, with epoch and attempt
        # for the agreement's messages), or for a round-less kind the chain's newest round; kind
        # None: not counted.
        self.kind, self.at = kind, at
        self.count = count  # ops on the chain under (kind, at), this one included
        self.ops, self.size = ops, size  # ops and content bytes on the chain so far (rule 5)
        # The first link of the chain with this top: rule 5 jumps from top to top, not op to op.
        self.since: Link = prev.since if prev is not None and prev.top == top else self


class Limits:
    """The links of a replica's applied ops, and the rules checked with them."""

    def __init__(self, trusted: frozenset[bytes] = frozenset(), covered_round: int = 0) -> None:
        self._links: dict[OpId, Link] = {}
        self._trusted = trusted
        # Ops covered by the snapshot a replica started from have no links (module docstring).
        self._covered = Link(None, True, 0, (covered_round, None, 0), None, None, 0)

    @classmethod
    def covering(cls, facts: Facts, trusted: frozenset[bytes] = frozenset()) -> Limits:
        """Limits for a replica that starts from the facts of a snapshot: the precommits it covers
        back their highest round for everyone (rule 3; other types back nothing, as on a full replica)."""
        return cls(trusted, max((row[2] for row in facts.rows["precommit"] if row[5]), default=0))

    def check(self, op: Op, index: Mapping[OpId, tuple[bytes, int, int]]) -> Link:
        """The link `op` would get, or `ProtocolError` if it breaks a rule. `index` maps each
        applied op to (author, seq, depth): `Facts.ops`. Every dependency must be applied."""
        backing, own, own_seq = NO_VOTES, None, 0
        for dep in op.dependencies:
            link = self.link(dep)
            backing = merge_backing(backing, link.backing)
            author, seq, _depth = index[dep]
            if author == op.author and (seq > own_seq or (seq == own_seq and dep < own)):
                own, own_seq = dep, seq
        prev = None if own is None else self.link(own)
        return self.next_link(op.type, op.body, prev, backing, op.author, content_size(op.data))

    def record(self, op_id: OpId, link: Link) -> None:
        self._links[op_id] = link

    def link(self, op_id: OpId) -> Link:
        """The link of an applied op (ops covered by a snapshot share a permissive one)."""
        return self._links.get(op_id, self._covered)

    def backing(self, op_ids: list[OpId]) -> Backing:
        """The votes of the causal past of `op_ids` (rule 3)."""
        backing = NO_VOTES
        for op_id in op_ids:
            backing = merge_backing(backing, self.link(op_id).backing)
        return backing

    def next_link(self, op_type: str, body: Mapping[str, Any], prev: Link | None, backing: Backing,
                  author: bytes, size: int) -> Link:
        """The link of an op by `author` of `op_type` with `body` and `size` content bytes, whose
        chain predecessor has link `prev` and whose dependencies hold the votes `backing`;
        `ProtocolError` if it breaks a rule."""
        if op_type not in RULES:
            raise ProtocolError("no-rule", f"no limits are defined for {op_type!r} ops")
        rule = RULES[op_type]
        member, top = (prev.member, prev.top) if prev is not None else (False, 0)
        ops, total = (prev.ops, prev.size) if prev is not None else (0, 0)
        if rule is None:
            return Link(prev, member, top, backing, None, None, 0, ops, total)
        if rule.members_only and not member:
            raise ProtocolError("not-member", f"only members may write {op_type} ops: join the run first")
        for name, most in rule.bounds:
            if body.get(name, 0) > most:
                raise ProtocolError("over-cap", f"{op_type} {name} {body[name]} is over the cap of {most}")
        if rule.not_author is not None and body[rule.not_author] == author:
            raise ProtocolError("names-self", f"a {op_type} op may not name its own author as {rule.not_author}")
        if "round" in rule.key:
            round_ = body["round"]
            backed = backed_round(backing, author, author in self._trusted)
            if round_ > backed + AHEAD:
                raise ProtocolError("too-far-ahead", f"round {round_} is more than {AHEAD} past round {backed}, "
                                                     "the highest another member voted for in its causal past")
            if round_ < top - BEHIND:
                raise ProtocolError("too-far-behind", f"round {round_} is more than {BEHIND} below round {top}, "
                                                      "the highest its author named before")
            top = max(top, round_)
            if op_type == "precommit" and body["value"]:
                backing = merge_backing(backing, (round_, author, 0))
        else:
            round_ = top
        kind = _KINDS[op_type]  # one str object per kind: compared by identity on the walk
        at = _counted_at(rule, body, top)
        count = _count_on_chain(prev, kind, at, round_) + 1
        if count > rule.cap:
            raise ProtocolError("over-cap", f"{op_type} op number {count} for {at} by one author: at most {rule.cap}")
        if op_type not in UNBUDGETED:
            link_ops, link_size = _window(prev, top - WINDOW + 1)
            if link_ops + 1 > WINDOW_OPS or link_size + size > WINDOW_BYTES:
                raise ProtocolError("over-budget", f"one author's ops since round {top - WINDOW + 1}: at most "
                                                   f"{WINDOW_OPS} ops and {WINDOW_BYTES} bytes ({link_ops} ops and "
                                                   f"{link_size} bytes before this one of {size})")
            ops, total = ops + 1, total + size
        if op_type == "join":
            member = True
        return Link(prev, member, top, backing, kind, at, count, ops, total)


_KINDS = {name: name for name in RULES}


def _counted_at(rule: Rule, body: Mapping[str, Any], top: int) -> Any:
    if not rule.key:
        return top
    if len(rule.key) == 1:
        return body[rule.key[0]]
    return tuple(body.get(name, 0) for name in rule.key)  # an optional key field (a vote's attempt) is 0


def _count_on_chain(link: Link | None, kind: str, at: Any, round_: int) -> int:
    """How many ops under (`kind`, `at`) the chain ending at `link` holds. Only links whose chain
    had named `round_` (top >= round_) can hold one, and the top only grows along a chain, so the
    walk stops at the first link below it."""
    while link is not None and link.top >= round_:
        if link.kind is kind and link.at == at:
            return link.count
        link = link.prev
    return 0


def _window(link: Link | None, start: int) -> tuple[int, int]:
    """The ops and content bytes of the links of the chain ending at `link` whose top is at least
    `start`. Tops only grow along a chain, so those links are its tail: jump back one top at a
    time to the newest link below it, and subtract."""
    newest = link
    while link is not None and link.top >= start:
        link = link.since.prev
    if newest is None:
        return 0, 0
    if link is None:
        return newest.ops, newest.size
    return newest.ops - link.ops, newest.size - link.size


def content_size(data: bytes) -> int:
    """The length of the content of the op whose (already checked) bytes are `data`: an array of
    five whose first item is the content, a msgpack bin of one, two or four length bytes."""
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}[data[1]]
    return int.from_bytes(data[2:2 + width], "big")


def earlier_statement(facts: Facts, author: bytes, op_type: str, fields: Mapping[str, Any]) -> str | None:
    """What `author` already said that an op of `op_type` with `fields` would say again: "same"
    (the same statement, or the same checkpoint, attestation or dispute: writing it again adds
    nothing), "conflict" (a different statement at one place, crdt/ops/: writing it is an
    equivocation, a ban), or None. For the node's own writes after a restart
    (node/replication/service.py)."""
    entry = REGISTRY[op_type]
    if entry.custom_row is not None:
        return None
    row = (b"",) * entry.referable + (author, *(freeze(fields[name]) for name in entry.fields))
    if entry.equivocation is not None:
        said = facts.statements_at(entry.place(row))
        if not said:
            return None
        return "same" if said == {entry.statement(row)} else "conflict"
    if op_type in ("checkpoint", "attest"):
        return "same" if row in facts.rows[op_type] else None
    if "round" in entry.fields and entry.referable:
        held = facts.in_round(op_type, fields["round"]).get(author, ())
        return "same" if any(other[1:] == row[1:] for other in held) else None
    return None
