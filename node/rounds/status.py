"""What a round waits for, and on whom: a read-only view of the round machine for `run status`
(and the warning a node logs when a round passes its deadline); and the run's members by peer ID."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from locomesh.protocol import peer_id_from_public_key
from locomesh.node.rounds.events import Author, Phase
from locomesh.node.rounds.machine import RoundMachine


def waiting_on(machine: RoundMachine, voted: frozenset[Author] = frozenset()) -> tuple[str, frozenset[Author]]:
    """What `machine`'s round waits for now, and on whom; `voted`: who voted in the round so far."""
    work, seen, me = machine.current, machine.last, machine.me
    if seen is None:
        return "the run's state", frozenset()
    if work is None:
        if me not in seen.able:
            return "our join to take effect", frozenset({me})
        return f"{machine.timing.min_peers} contributors ({len(seen.able)} so far)", frozenset()
    missing_payloads = frozenset(work.arrivals) - work.fetched - work.failed
    match machine.phase:
        case Phase.TRAIN:
            return "our inner steps", frozenset({me})
        case Phase.COLLECT:
            return "commits and payloads until the cutoff", (seen.able - set(seen.commits) - {me}) | missing_payloads
        case Phase.PROPOSE if work.chosen is None:
            on_turn = next((proposer for proposer, _starts, ends in machine.turns() if seen.now < ends), None)
            return "the round's proposal", frozenset() if on_turn is None else frozenset({on_turn})
        case Phase.PROPOSE | Phase.REPLAY:
            return "payloads of the proposal we follow", frozenset(work.chosen) - work.fetched - {me}
        case Phase.AGGREGATE:
            return "our outer step", frozenset({me})
        case Phase.VOTED:
            return f"votes of more than two thirds of {len(seen.electorate)}", seen.electorate - voted
        case _:
            return "the certified state", frozenset()


def members_by_peer_id(members: Iterable[Author], me: Author, connected: Callable[[str], bool]) -> list[dict[str, Any]]:
    """The run's `members` as `run status` lists them: each one's peer ID (the name every other
    command and log line uses), its key in hex (what the run state's JSON keys are), whether it is
    this node, and whether `connected(peer ID)` says this node holds a connection to it; by peer ID."""
    rows = []
    for member in members:
        peer_id = peer_id_from_public_key(member)
        rows.append({"peer_id": peer_id, "key": member.hex(), "you": member == me,
                     "connected": member != me and connected(peer_id)})
    return sorted(rows, key=lambda row: row["peer_id"])
