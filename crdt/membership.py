"""Who takes part in a run and who has a say in it, round by round, as the certified values make it.

Theory of operation
-------------------
Round r has a *roster* (the keys that may commit payloads) and an *electorate* E(r) ⊆ roster (the
keys that propose, prevote and precommit: node/agreement/tendermint.py). Both are a function of
the genesis and the certified values of rounds 1 .. r-1 (crdt/value.py), so every replica that
holds the certified history computes the same E(r) (`next_membership`), and nothing that arrives
later changes them: a ban removes a key's future say, never a certificate.

- **Genesis.** Round 1's roster and electorate are the creator alone.
- **Joining.** A `join` op asks; a round's value admits it (at most MAX_CHANGES changes a value:
  joins beyond wait for later rounds, so thousands of joins cost each replica nothing per op). A
  join naming a round more than JOIN_FRESH before the round under way is stale: a key gone that
  long joins again.
  In a run whose `admission` is not "open", only admitted keys are admitted at all.
- **Admission.** Keys the genesis names, and keys an `admit` named by a value vouches for: the
  creator's (admission "creator", and "open" too), or more than two thirds of E's (admission
  "electorate"), have a say from the round their join is admitted in; their payloads count from
  that round already.
- **Earning a say** (open runs). A fresh key (on the roster, no say) may commit only in the rounds
  whose *slate* draws it: the first max(1, |E|/2) fresh keys in an order drawn from the round's
  seed (the certified hash before it), so nobody picks which; and a value takes fresh payloads
  under a third of its inputs (crdt/value.py: `fresh_cap`; at least one may always be taken: a
  run of one can grow). After `earn_rounds`
  rounds whose certified set held its payload a fresh key earns a say, at most max(1, |E|/8) keys
  a round, in a drawn order; and the keys that earned a say in the last 3 x `earn_rounds` rounds
  stay under a third of E (one may always be such a key). That last rule is stricter than a rate
  alone: at |E|/8 a round, keys that join together outnumber the members they joined within a
  few rounds of work, while this rule keeps the members that were there more than two thirds of
  E for 3 x `earn_rounds` rounds however many keys join.
- **Absence.** A member with a say whose payload counted in no certified set and that no value
  names as a precommitter of a certificate (`last`) for `absent_rounds` rounds leaves E. It keeps
  its say on the roster, and is back in E from the round after a certified set holds its payload
  again. A key absent ROSTER_KEEP rounds leaves the roster: it must join again.
- **Leaving and bans.** A `leave` named by a value takes the key out of E from the next round on,
  as an absence would (a node stopped gracefully comes back by committing); evidence named by a
  value (crdt/evidence.py) bans its author for good, and disputes of a shard result signed by
  more than a third of the round's electorate ban the result's signer.
- **Recovery.** When more than a third of E is gone at once, a `recover` quorum starts a recovery
  epoch (crdt/chain.py) whose first round's value names the signers it counts: the members of E
  it names (and whose payloads it holds) stay in E, the others leave it at once; they keep their
  say on the roster and come back by committing, as an absent member does.

Invariant (tests/test_agreement_membership.py): fresh keys, however many, hold under a third of E
and of every set's inputs until each has done `earn_rounds` rounds of counted work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .genesis import Genesis
from .quorum import drawn_order, is_quorum

ROSTER_KEEP = 100  # certified rounds a key without a sign of life stays on the roster
JOIN_FRESH = 16  # a join naming a round further back than this before the round under way is stale


@dataclass(frozen=True)
class Member:
    say: bool  # admitted, or earned by counted work: in the electorate while present
    joined: int  # the round whose value admitted its join (0: the creator)
    seen: int  # the newest round its payload counted in, or it precommitted a certificate of
    counted: int = 0  # rounds its payload counted in while it had no say
    earned: int = 0  # the round from which a say it earned by work holds (0: admitted, or none)


@dataclass(frozen=True)
class Changes:
    """What one certified value changes (crdt/value.py reads it out of the value's ops)."""

    counted: frozenset[bytes] = frozenset()  # authors whose payloads the set holds
    joins: tuple[bytes, ...] = ()
    leaves: tuple[bytes, ...] = ()
    admits: tuple[tuple[bytes, bytes], ...] = ()  # (who vouches, for whom)
    bans: tuple[bytes, ...] = ()
    present: frozenset[bytes] = frozenset()  # precommitters of the certificate of the round before
    survivors: frozenset[bytes] | None = None  # a recovery's: the members of E it keeps (None: no recovery)


@dataclass(frozen=True)
class Membership:
    """The membership in force for round `round`."""

    round: int
    roster: Mapping[bytes, Member]
    electorate: frozenset[bytes]
    banned: frozenset[bytes] = frozenset()
    admitted: frozenset[bytes] = frozenset()
    vouched: Mapping[bytes, frozenset[bytes]] = field(default_factory=dict)  # electorate admission: key -> by whom

    @property
    def fresh(self) -> list[bytes]:
        """Roster keys without a say, in key order."""
        return sorted(key for key, member in self.roster.items() if not member.say)

    def slate(self, seed: bytes) -> list[bytes]:
        """The fresh keys round `round` may take payloads of, in drawn order (module docstring)."""
        order = drawn_order(b"locomesh fresh", self.round, seed, 0, self.fresh)
        return order[:max(1, len(self.electorate) // 2)]

    def earning(self, genesis: Genesis) -> dict[bytes, int]:
        """Fresh key -> counted rounds it still needs for a say (0: waits for its turn)."""
        return {key: max(0, genesis.earn_rounds - member.counted)
                for key, member in sorted(self.roster.items()) if not member.say}

    def may_admit(self, key: bytes, genesis: Genesis) -> bool:
        """May a value admit `key`'s join: not banned, not on the roster, and admitted where the
        run admits only those."""
        if key in self.banned or key in self.roster:
            return False
        return genesis.admission == "open" or key in self.admitted or key in genesis.trusted


def first_membership(genesis: Genesis) -> Membership:
    """Round 1's: the creator alone."""
    creator = Member(say=True, joined=0, seen=0)
    return Membership(1, {genesis.creator: creator}, frozenset({genesis.creator}),
                      admitted=frozenset(genesis.trusted))


def next_membership(m: Membership, changes: Changes, genesis: Genesis, seed: bytes) -> Membership:
    """Round `m.round` + 1's membership, once round `m.round` was certified with `changes`;
    `seed`: the hash certified for round `m.round` (what the next round's draws use)."""
    r, after = m.round, m.round + 1
    roster, electorate = dict(m.roster), set(m.electorate)
    banned, admitted, vouched = set(m.banned), set(m.admitted), dict(m.vouched)
    for key in changes.bans:
        banned.add(key)
        roster.pop(key, None)
        electorate.discard(key)
    for voucher, key in changes.admits:
        _vouch(genesis, m, voucher, key, admitted, vouched)
    for key in changes.joins:
        if key not in banned and key not in roster:
            say = key in admitted or key in genesis.trusted
            roster[key] = Member(say=say, joined=r, seen=r)
            if say:
                electorate.add(key)
    for key in changes.leaves:  # out of E now; back by committing again, until the roster lets it go
        electorate.discard(key)
    for key in changes.counted:
        member = roster.get(key)
        if member is None:
            continue
        roster[key] = replace(member, seen=r, counted=member.counted + (0 if member.say else 1))
        if member.say:
            electorate.add(key)  # back from an absence, if it was away
    for key in changes.present:
        if key in roster and roster[key].seen < r - 1:
            roster[key] = replace(roster[key], seen=r - 1)
    if changes.survivors is not None:  # a recovery: who was not there leaves E now, back by committing
        electorate -= (m.electorate - changes.survivors)
    _drop_absent(roster, electorate, after, genesis.absent_rounds)
    _earn(roster, electorate, genesis, seed, r)
    for key in [key for key, member in roster.items() if key not in electorate and member.seen < after - ROSTER_KEEP]:
        del roster[key]
    return Membership(after, roster, frozenset(electorate), frozenset(banned), frozenset(admitted), vouched)


def _vouch(genesis: Genesis, m: Membership, voucher: bytes, key: bytes, admitted: set[bytes],
           vouched: dict[bytes, frozenset[bytes]]) -> None:
    """Count one admission: the creator's admits (admission "creator" or "open"), or more than two
    thirds of the electorate's (admission "electorate")."""
    if genesis.admission == "electorate":
        if voucher in m.electorate:
            vouched[key] = vouched.get(key, frozenset()) | {voucher}
            if is_quorum(len(vouched[key] & m.electorate), len(m.electorate)):
                admitted.add(key)
    elif voucher == genesis.creator:
        admitted.add(key)


def _drop_absent(roster: dict[bytes, Member], electorate: set[bytes], after: int, absent_rounds: int) -> None:
    """Members of E not seen in the last `absent_rounds` rounds leave it (never the last one)."""
    since = after - absent_rounds
    absent = {key for key in electorate if roster[key].seen < since and roster[key].joined < since}
    if absent and absent < electorate:
        electorate -= absent


def _earn(roster: dict[bytes, Member], electorate: set[bytes], genesis: Genesis, seed: bytes, r: int) -> None:
    """Fresh keys with `earn_rounds` counted rounds earn a say, at the rates of the module docstring."""
    ready = [key for key, member in roster.items() if not member.say and member.counted >= genesis.earn_rounds]
    if not ready:
        return
    window = 3 * genesis.earn_rounds
    young = sum(1 for key in electorate if roster[key].earned > max(0, r + 1 - window))  # 0: admitted, not earned
    rate = max(1, len(electorate) // 8)
    for key in drawn_order(b"locomesh earn", r, seed, 0, ready)[:rate]:
        if young and 3 * (young + 1) >= len(electorate) + 1:
            return
        roster[key] = replace(roster[key], say=True, earned=r + 1, seen=r)
        electorate.add(key)
        young += 1
