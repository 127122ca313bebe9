"""What a round waits for, and on whom: a read-only view of the round machine for `run status`
(and the warning a node logs when a round passes its deadline); and the run's members by peer ID."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from locomesh.crdt.scores import accepted_counts, scores_json
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import format_run_id, short_run_id
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


def round_clock(machine: RoundMachine, now: float) -> dict[str, Any]:
    """How long the round's current attempt has waited here, its deadline, and what this node does
    next, for `run status`, `run watch` and the dashboard: a stuck round says since when, until
    when, and what happens then. Empty between rounds."""
    work = machine.current
    if work is None or machine.phase in (Phase.IDLE, Phase.SYNC):
        return {}
    deadline = machine.deadline()
    waited = max(0.0, now - work.attempt_started)
    usual = max(machine.durations, default=None)  # the longest recent round certified with us
    return {"attempt": work.attempt, "waited_s": round(waited, 1), "deadline_s": round(deadline, 1),
            "usual_s": None if usual is None else round(usual, 1),
            "stuck": usual is not None and now - work.started > 2 * usual,
            "next": _next_step(machine, now, waited, deadline)}


def _next_step(machine: RoundMachine, now: float, waited: float, deadline: float) -> str:
    if waited >= deadline:
        return ("said the attempt passed its deadline; once more than a third of the electorate says so, the next "
                "attempt goes on without whoever did not vote")
    left = f"{deadline - waited:.0f} s"
    match machine.phase:
        case Phase.TRAIN:
            return "commit our payload when the inner steps end"
        case Phase.COLLECT:
            return f"cut the round's set at the cutoff (in {max(0.0, machine.cutoff() - now):.0f} s) and propose or follow"
        case Phase.PROPOSE if machine.current.chosen is None:
            return f"follow the proposal whose turn it is, or propose ours once every turn passed; deadline in {left}"
        case Phase.VOTED:
            return (f"adopt the state once the round is certified; if the votes split, vote again at once; "
                    f"deadline in {left}")
        case _:
            return f"aggregate and vote; deadline in {left}"


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


def participation_status(p: Any) -> dict[str, Any]:
    """What `run status` shows of a `RunParticipation`."""
    state = p.replica.state
    next_round = state.round + 1
    return {
        "next_round": {
            "round": next_round,
            "electorate": len(p.replica.electorate(next_round)),
            "commits": len(p.replica.commits(next_round)),
            "proposals": len(p.replica.proposals(next_round)),
            "votes": sorted(h.hex()[:12] for h in p.replica.votes(next_round).values()),
            "contributors": None if p.work is None else len(set(p.work.arrived) | set(p.work.payloads)),
        },
        "run_id": short_run_id(p.run_id),
        "phase": p.status_phase(),
        "sitting_out": p.sitting_out(),
        "attempt": len(p.replica.attempts(next_round)) - 1,
        "waiting": p._waiting(),
        "exchange": None if p.exchange.last_choice is None else p.exchange.last_choice.to_json(),
        "error": p.failure,
        "banned": p.banned is not None,
        "ban_reason": p.banned,
        "round": p.machine.state_round,
        "certified": state.round,
        "members": len(state.members),
        "peers": len(p.node.host.get_connected_peers()),
        "state_hash": (p.machine.state_hash or b"").hex(),
        "params": p.participant.outer.numel,
        "inner_steps": p.participant.settings.inner_steps,
        "payloads_sent": p.payloads_sent,
        "initial_eval_loss": p.initial_eval.get("loss"),
        "history": [record.to_json() for record in p.history],
        "scores": scores_json(p.replica.facts, state),  # member -> its recent contribution scores
        # member -> how many of the newest certified rounds accepted its contribution
        "contributions": {author.hex(): count for author, count in accepted_counts(state).items()},
        "data": None if p.data is None else p.data.status(),
    }


def kept_status(run_id: bytes, history: Iterable[Any], last: int, state: Any, member_peers: list[dict[str, Any]],
                peers: int) -> dict[str, Any]:
    """`run.status` of a run this node does not train now: its rounds kept in the data dir (`history`),
    the run's `state` where this node still replicates it (else None); `last`: the round to say when no
    round is kept."""
    records = list(history)
    return {
        "run_id": format_run_id(run_id), "training": False,
        "round": max((record.round for record in records), default=last),
        "certified": last if state is None else state.round, "members": 0 if state is None else len(state.members),
        "member_peers": member_peers, "peers": peers, "waiting": None, "error": None, "banned": False,
        "ban_reason": None, "history": [record.to_json() for record in records],
    }
