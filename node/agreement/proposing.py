"""getValue(): the value a proposer proposes, from what it holds.

An honest proposer proposes the commits whose payloads it holds by its cut (the node decides when
that is and what it holds: node/rounds/), leaving out authors the facts prove equivocated (their
ban is named with the evidence), within the rules every member checks (crdt/value.py):
fresh keys' payloads in the slate's order up to their cap, and nothing when its set would not
hold payloads of more than a third of the electorate (a later proposer, or a later attempt, may
hold more). Beside the set it names the membership changes waiting (joins the membership may
admit, in an order drawn from the round's seed, so a flood of joins cannot choose who waits;
leaves; admissions; evidence against members; disputes of a shard result by more than a third
of the electorate, with the result), at most MAX_CHANGES, and the precommits that
certified the round before (`last`; in a recovery epoch's first round, the recovers too). In a
recovery epoch that carries a value (crdt/chain.py), the value is that one.
"""

from __future__ import annotations

from collections.abc import Collection

from locomesh.crdt import Chain, Facts, InvalidValue, Value
from locomesh.crdt.value import fresh_cap
from locomesh.crdt.membership import JOIN_FRESH
from locomesh.crdt.ops.base import MAX_CHANGES, MAX_LAST, MAX_SET
from locomesh.crdt.quorum import drawn_order, is_more_than_a_third


def own_value(chain: Chain, facts: Facts, held: Collection[bytes]) -> Value | None:
    """The value we propose for the chain's tip round with the payloads of `held` (authors) in
    hand; None if the rules leave no valid one."""
    tip = chain.tip
    carried = chain.carried()
    if carried is not None:  # a recovery epoch decides what the old one may have decided
        return _proposed_value(facts, tip.round, carried)
    membership = tip.membership
    commits = {author: next(iter(rows))[0] for author, rows in facts.in_round("commit", tip.round).items()
               if len(rows) == 1 and author in held and not facts.proven(author)}
    changes = _changes(chain, facts)
    joining = _joining_with_say(chain, facts, changes)
    say = sorted(author for author in commits
                 if (author in membership.roster and membership.roster[author].say) or author in joining)
    if not is_more_than_a_third(len(set(say) & membership.electorate), len(membership.electorate)):
        return None
    room = fresh_cap(len(say))
    fresh = [author for author in membership.slate(tip.seed) if author in commits and author not in say][:room]
    chosen = (say + fresh)[:MAX_SET]
    value = Value(tip.round, tuple(sorted(commits[a] for a in chosen)), tuple(sorted(changes)), _last(chain, facts))
    try:
        chain.read(value)
    except InvalidValue:
        return _without_changes(chain, value)
    return value


def _without_changes(chain: Chain, value: Value) -> Value | None:
    """`value` without its membership changes, if those made it invalid (a join raced another's)."""
    bare = Value(value.round, value.set, (), value.last)
    try:
        chain.read(bare)
    except InvalidValue:
        return None
    return bare


def _changes(chain: Chain, facts: Facts) -> list[bytes]:
    """The op IDs of the membership changes waiting, at most MAX_CHANGES (module docstring)."""
    tip = chain.tip
    m, genesis = tip.membership, chain.genesis
    changes: list[bytes] = []
    keys: set[bytes] = set()
    for op, author, convicted in sorted(facts.rows["evidence"]):
        if convicted in m.roster and convicted not in keys:
            changes.append(op)
            keys.add(convicted)
    for op, author, _round in sorted(facts.rows["leave"]):
        if author in m.roster and author not in keys:
            changes.append(op)
            keys.add(author)
    for verdict in _dispute_verdicts(chain, facts, keys):
        if len(changes) + len(verdict) <= MAX_CHANGES // 2:
            changes += verdict
    admits = [(op, author, key) for op, author, key in sorted(facts.rows["admit"])
              if key not in m.admitted and (author == genesis.creator or author in m.electorate)]
    changes += [op for op, _author, _key in admits][:MAX_CHANGES // 4]
    creator_admits = {key for _op, author, key in admits if author == genesis.creator and genesis.admission != "electorate"}
    joins = {author: op for op, author, round_ in sorted(facts.rows["join"])
             if author not in keys and round_ >= tip.round - JOIN_FRESH and not facts.proven(author)
             and (m.may_admit(author, genesis) or author in creator_admits)}
    for author in drawn_order(b"locomesh joins", tip.round, tip.seed, 0, joins):
        if len(changes) >= MAX_CHANGES:
            break
        changes.append(joins[author])
    return changes[:MAX_CHANGES]


DISPUTE_ROUNDS = 8  # rounds back a proposer looks for disputes that ban a result's signer


def _dispute_verdicts(chain: Chain, facts: Facts, keys: set[bytes]) -> list[list[bytes]]:
    """For each roster key not yet named whose signed shard result more than a third of the
    electorate disputed (in the last DISPUTE_ROUNDS rounds): the result op and the disputes, the
    ops that put the ban into effect (crdt/value.py: a dispute verdict). Adds the keys to `keys`."""
    tip = chain.tip
    m = tip.membership
    verdicts = []
    for round_ in facts.disputed_rounds():
        if round_ < tip.round - DISPUTE_ROUNDS:
            continue
        results = {(row[2], row[3], row[4], row[1], row[5]): row[0]  # (round, set, shard, member, hash) -> op
                   for rows in facts.in_round("shard_result", round_).values() for row in rows}
        disputes: dict[tuple, list[tuple[bytes, bytes]]] = {}
        for rows in facts.in_round("dispute", round_).values():
            for op, author, _round, set_, shard, member, hash_ in rows:
                disputes.setdefault((round_, set_, shard, member, hash_), []).append((author, op))
        for place, said in sorted(disputes.items()):
            signer = place[3]
            counted = {author: op for author, op in sorted(said) if author in m.electorate}
            if signer in keys or signer not in m.roster or place not in results:
                continue
            if is_more_than_a_third(len(counted), len(m.electorate)):
                verdicts.append([results[place], *counted.values()])
                keys.add(signer)
    return verdicts


def _joining_with_say(chain: Chain, facts: Facts, changes: list[bytes]) -> set[bytes]:
    """The keys whose joins `changes` admit with a say (admitted keys): their payloads count this round."""
    genesis, m = chain.genesis, chain.tip.membership
    admitted = set(m.admitted) | set(genesis.trusted)
    named = [facts.refs[op] for op in changes]
    if genesis.admission != "electorate":
        admitted |= {row[2] for kind, row in named if kind == "admit" and row[1] == genesis.creator}
    return {row[1] for kind, row in named if kind == "join" and row[1] in admitted}


def _proposed_value(facts: Facts, round_: int, value_id: bytes) -> Value | None:
    """The value `value_id` as some proposal of round `round_` proposed it."""
    for rows in facts.in_round("proposal", round_).values():
        for row in rows:
            value = Value.of_proposal(row)
            if value.id == value_id:
                return value
    return None


def _last(chain: Chain, facts: Facts) -> tuple[bytes, ...]:
    """The precommits of the round before's certified (value, state) by its electorate (one each),
    and in a recovery epoch's first round the recovers it counts (crdt/value.py, rule 4)."""
    tip = chain.tip
    recovers: list[bytes] = []
    if tip.recovering is not None:
        state = b"" if tip.round == 1 else tip.seed
        for author, rows in sorted(facts.in_round("recover", tip.round - 1).items()):
            found = [row[0] for row in rows if row[3] == tip.recovering and row[4] == state]
            if author in tip.electorate and found:
                recovers.append(min(found))
    previous = tip.previous
    if previous is None:
        return tuple(sorted(recovers))
    chosen: dict[bytes, bytes] = {}
    for author, rows in facts.in_round("precommit", chain.tip.round - 1).items():
        if author not in previous.electorate:
            continue
        for op, _author, _round, _epoch, _attempt, value, state in sorted(rows):
            if (value, state) == (previous.value, previous.state):
                chosen.setdefault(author, op)
    precommits = sorted(chosen.values())[:MAX_LAST - len(recovers)]
    return tuple(sorted(recovers + precommits))
