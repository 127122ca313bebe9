"""A round's value, what the agreement decides: the commits it aggregates and the membership changes
it makes, and the rules every member checks alike before it prevotes one.

A `proposal` op carries the value as three sorted lists of op IDs it depends on (so a replica that
holds the proposal holds what it names): `set`, the round's commits; `members`, the joins,
leaves, admissions and evidence it puts into effect, and disputes of a shard result with that
result; `last`, precommits that certified the round before (who was there: crdt/membership.py's
absence rule). Its ID is the hash of the three lists and the round, so the same value proposed
again in a later attempt (Tendermint's validValue) has the same ID.

`read` checks a value against the round's membership and the facts and says what it changes
(`Reading`), or why it is invalid (`InvalidValue`). Every rule reads only the value's own ops and
the certified history (the round's membership, the electorate of the round before and its
certificate), so every replica that holds the value reaches the same verdict:

1. the set names at least one commit, every one for this round, at most one per author, each by
   a key that may contribute: on the roster with a say (in the electorate or back from an
   absence), a fresh key on the round's slate, or an admitted key whose join this value admits;
2. it holds payloads of more than a third of the round's electorate, so a Byzantine proposer
   (under a third) cannot make a round out of Byzantine payloads alone, and payloads of fresh
   keys under a third of its inputs (at least one may always be taken: `fresh_cap`);
3. every change is of its kind (a join, not stale, of a key the membership may admit; a leave of a
   roster key; an admission; evidence or a dispute verdict against a roster key) and names each
   key once;
4. every precommit of `last` is by a member of the round before's electorate, for the (value,
   state) that certified it; in the first round of a recovery epoch (crdt/chain.py) `last` may
   name recovers too, of the epoch it recovers from, for the round before and its state, by
   members of the electorate, and if it names any, it names a majority of the electorate (more
   than half, or exactly half with the creator): the members a recovery keeps (a member whose
   payload it holds but that did not sign may have crashed since; if not, it is back by committing).

Whether a member holds what the value names (every payload, or in sharded exchange every shard
at a member other than its author) is the other half of validity, the node's (node/exchange/).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from .facts import Facts
from .genesis import Genesis
from .membership import JOIN_FRESH, Changes, Membership
from .ops import OpId
from .quorum import is_more_than_a_third

VALUE_DOMAIN = b"locomesh/value/v1\x00"


class InvalidValue(ValueError):
    """A value breaks a rule of the module docstring; the message says which."""


@dataclass(frozen=True)
class Value:
    round: int
    set: tuple[OpId, ...]
    members: tuple[OpId, ...] = ()
    last: tuple[OpId, ...] = ()

    @cached_property
    def id(self) -> bytes:
        """SHA-256 over the domain, the round and the three lists, each led by its length."""
        parts = [VALUE_DOMAIN, self.round.to_bytes(8, "big")]
        for ids in (self.set, self.members, self.last):
            parts += [len(ids).to_bytes(2, "big"), *ids]
        return hashlib.sha256(b"".join(parts)).digest()

    def fields(self) -> dict[str, list[OpId]]:
        """The proposal op's fields for it."""
        return {"set": sorted(self.set), "members": sorted(self.members), "last": sorted(self.last)}

    @classmethod
    def of_proposal(cls, row: tuple) -> Value:
        """The value of a proposal's facts row (id, author, round, epoch, attempt, valid, set, members, last)."""
        return cls(row[2], row[6], row[7], row[8])


@dataclass(frozen=True)
class Payload:
    """One payload a value aggregates: its author's commit."""

    author: bytes
    hash: bytes  # the payload's checkpoint ID
    size: int
    commit: OpId


@dataclass(frozen=True)
class Reading:
    """What a valid value means: its payloads, by author, and the membership changes it makes."""

    payloads: Mapping[bytes, Payload]
    changes: Changes
    fresh: frozenset[bytes]  # authors of its payloads without a say

    @property
    def authors(self) -> tuple[bytes, ...]:
        return tuple(sorted(self.payloads))


@dataclass(frozen=True)
class Previous:
    """What a value of round r checks its `last` against: round r-1's electorate and certificate."""

    electorate: frozenset[bytes]
    value: bytes  # the certified value's ID
    state: bytes  # the certified state hash


def read(value: Value, facts: Facts, membership: Membership, genesis: Genesis, seed: bytes,
         previous: Previous | None, recovering: int | None = None) -> Reading:
    """The meaning of `value` for round `membership.round`, or `InvalidValue` (module docstring).
    `recovering`: the epoch whose recovers the value may name (the round is a recovery epoch's
    first). Every op the value names must be applied (it is, once its proposal is)."""
    if value.round != membership.round:
        raise InvalidValue(f"the value is for round {value.round}, not {membership.round}")
    changes = _changes(value, facts, membership, genesis)
    payloads = _payloads(value, facts)
    joining = {key for key in changes.joins if key in membership.admitted or key in genesis.trusted
               or _admitted_here(key, list(changes.admits), genesis)}
    slate = set(membership.slate(seed))
    say, fresh = set(), set()
    for author in payloads:
        member = membership.roster.get(author)
        if member is not None and member.say or author in joining:
            say.add(author)
        elif member is not None and author in slate:
            fresh.add(author)
        else:
            raise InvalidValue(f"{author.hex()[:12]} may not contribute to round {value.round}: "
                               "not on the roster, or fresh and not drawn for this round")
    if not say:
        raise InvalidValue("the set holds no payload of a key with a say")
    if not is_more_than_a_third(len(say & membership.electorate), len(membership.electorate)):
        raise InvalidValue(f"the set holds payloads of {len(say & membership.electorate)} of the "
                           f"{len(membership.electorate)} members of the electorate: a third or fewer")
    if len(fresh) > fresh_cap(len(say)):
        raise InvalidValue(f"{len(fresh)} payloads of keys without a say beside {len(say)} with one: over the cap "
                           f"of {fresh_cap(len(say))}")
    present, recovered = _present(value, facts, previous, recovering, seed)
    if recovered and not _majority(recovered, membership.electorate, genesis.creator):
        raise InvalidValue(f"the value names recovers of {len(recovered)} of the {len(membership.electorate)} members "
                           "of the electorate: not a majority")
    survivors = frozenset(recovered) if recovered else None
    changes = Changes(frozenset(payloads), changes.joins, changes.leaves, changes.admits, changes.bans, present,
                      survivors)
    return Reading(payloads, changes, frozenset(fresh))


def fresh_cap(say: int) -> int:
    """The most payloads of keys without a say a set with `say` payloads of keys with one may take:
    under a third of its inputs, and one at least (so a run of one can grow)."""
    return max(1, (say - 1) // 2)


def _majority(signers: set[bytes], electorate: frozenset[bytes], creator: bytes) -> bool:
    counted = signers & electorate
    return 2 * len(counted) > len(electorate) or (2 * len(counted) == len(electorate) and creator in counted)


def _payloads(value: Value, facts: Facts) -> dict[bytes, Payload]:
    payloads: dict[bytes, Payload] = {}
    for op in value.set:
        op_type, row = _ref(facts, op)
        if op_type != "commit":
            raise InvalidValue(f"the set names a {op_type} op, not a commit")
        _id, author, round_, hash_, size = row
        if round_ != value.round:
            raise InvalidValue(f"the set names a commit for round {round_}")
        if author in payloads:
            raise InvalidValue(f"the set names two commits of {author.hex()[:12]}")
        payloads[author] = Payload(author, hash_, size, op)
    return payloads


def _changes(value: Value, facts: Facts, m: Membership, genesis: Genesis) -> Changes:
    joins: list[bytes] = []
    leaves: list[bytes] = []
    bans: list[bytes] = []
    named: set[bytes] = set()

    def once(key: bytes, what: str) -> None:
        if key in named:
            raise InvalidValue(f"the value changes {key.hex()[:12]} twice ({what})")
        named.add(key)

    ops = [_ref(facts, op) for op in value.members]
    # Vouching changes no key's place: an admission may come with its join, whichever ID sorts first.
    admits = [(row[1], row[2]) for op_type, row in ops if op_type == "admit"]
    for op_type, row in ops:
        if op_type == "admit":
            continue
        if op_type == "join":
            once(row[1], "join")
            if row[2] < value.round - JOIN_FRESH:
                raise InvalidValue(f"the join of {row[1].hex()[:12]} names round {row[2]}: stale")
            if not m.may_admit(row[1], genesis) and not _admitted_here(row[1], admits, genesis):
                raise InvalidValue(f"the join of {row[1].hex()[:12]} cannot be admitted")
            joins.append(row[1])
        elif op_type == "leave":
            once(row[1], "leave")
            if row[1] not in m.roster:
                raise InvalidValue(f"the leave of {row[1].hex()[:12]}, not on the roster")
            leaves.append(row[1])
        elif op_type == "evidence":
            once(row[2], "ban")
            if row[2] not in m.roster:
                raise InvalidValue(f"evidence against {row[2].hex()[:12]}, not on the roster")
            bans.append(row[2])
        elif op_type not in ("shard_result", "dispute"):
            raise InvalidValue(f"a value's changes cannot name a {op_type} op")
    for signer in _dispute_verdicts(value, facts, m):
        once(signer, "dispute verdict")
        bans.append(signer)
    return Changes(joins=tuple(joins), leaves=tuple(leaves), admits=tuple(admits), bans=tuple(bans))


def _admitted_here(key: bytes, admits: list[tuple[bytes, bytes]], genesis: Genesis) -> bool:
    """Does an admission this value names by the creator admit `key` (its join may come in the same
    value)? Electorate admissions take effect once certified."""
    return genesis.admission != "electorate" and (genesis.creator, key) in admits


def _dispute_verdicts(value: Value, facts: Facts, m: Membership) -> list[bytes]:
    """The signers of the shard results this value names, each disputed by more than a third of
    the electorate among the disputes it names (crdt/ops/dispute.py)."""
    results: dict[tuple, bytes] = {}
    disputers: dict[tuple, set[bytes]] = {}
    for op in value.members:
        op_type, row = facts.refs[op]
        if op_type == "shard_result":
            _id, author, round_, set_, shard, hash_ = row
            results[(round_, set_, shard, author, hash_)] = author
        elif op_type == "dispute":
            _id, author, round_, set_, shard, member, hash_ = row
            disputers.setdefault((round_, set_, shard, member, hash_), set()).add(author)
    verdicts = []
    for place, signer in sorted(results.items()):
        if signer not in m.roster:
            raise InvalidValue(f"a dispute verdict against {signer.hex()[:12]}, not on the roster")
        if not is_more_than_a_third(len(disputers.get(place, set()) & m.electorate), len(m.electorate)):
            raise InvalidValue("a shard result named without disputes by more than a third of the electorate")
        verdicts.append(signer)
    if set(disputers) - set(results):
        raise InvalidValue("disputes named without the result they dispute")
    return verdicts


def _present(value: Value, facts: Facts, previous: Previous | None, recovering: int | None,
             seed: bytes) -> tuple[frozenset[bytes], set[bytes]]:
    """(members `last` names as precommitters of the round before's certificate, members it names
    as signers of the recovery of this round)."""
    present: set[bytes] = set()
    recovered: set[bytes] = set()
    for op in value.last:
        op_type, row = _ref(facts, op)
        if op_type == "recover" and recovering is not None:
            _id, author, round_, epoch, state, _lock, _value = row
            if (round_, epoch, state) != (value.round - 1, recovering, b"" if value.round == 1 else seed) or author in recovered:
                raise InvalidValue("`last` names a recover of another epoch or round, or two of one member")
            recovered.add(author)
            continue
        if op_type != "precommit" or previous is None:
            raise InvalidValue("`last` names precommits of the round before's certificate only (and recovers, "
                               "in a recovery)")
        _id, author, round_, _epoch, _attempt, value_id, state = row
        if round_ != value.round - 1 or (value_id, state) != (previous.value, previous.state):
            raise InvalidValue("`last` names a precommit that is not for the round before's certified value")
        if author not in previous.electorate or author in present:
            raise InvalidValue("`last` names a precommit from outside the round before's electorate, or two of one member")
        present.add(author)
    return frozenset(present), recovered


def _ref(facts: Facts, op: OpId) -> tuple[str, tuple]:
    found = facts.refs.get(op)
    if found is None:
        raise InvalidValue(f"the value names op {op.hex()[:12]}, which is not held (or not of a kind a value names)")
    return found
