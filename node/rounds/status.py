"""What a round waits for, and on whom, and whether it is stuck: a read-only view of a
participation for `run status` (and the warning a node logs when a round passes its deadline);
and the run's members by peer ID."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from locomesh.crdt.scores import accepted_counts, scores_json
from locomesh.node.agreement.log import Log
from locomesh.node.agreement.tendermint import Step
from locomesh.node.rounds.events import Author, Phase
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import format_run_id, short_run_id


def waiting_on(p: Any) -> dict[str, Any]:
    """What participation `p`'s round waits for, on whom (peer IDs), its clock, and whether it is
    stuck (with the cause and a fix)."""
    reason = p.sitting_out()
    if reason is not None and p.machine.phase is Phase.IDLE and p.seat.machine is None:
        return {"for": f"nothing: this node sits rounds out, {reason}", "on": []}
    what, on = _what(p)
    peers = sorted(p._peer_id(author) for author in on if author != p.me)
    return {"for": what, "on": peers, "unreachable": [peer for peer in peers if peer not in p.node.peers],
            **round_clock(p, trio.current_time())}


def _what(p: Any) -> tuple[str, frozenset[Author]]:
    machine, chain, me = p.machine, p.replica.chain, p.me
    match machine.phase:
        case Phase.TRAIN:
            return "our inner steps", frozenset({me})
        case Phase.SYNC:
            return "the certified state", frozenset()
        case Phase.REPLAY:
            return "our outer step of the certified value", frozenset({me})
    seat = p.seat.machine
    tip = chain.tip
    if seat is None:
        if me not in p.replica.contributors(tip.round) and me not in tip.electorate:
            if me in tip.membership.roster:
                return "our turn among the keys without a say (the round's draw)", frozenset()
            return "our join to take effect", frozenset({me})
        if len(p.replica.contributors(tip.round)) < machine.timing.min_peers:
            return f"{machine.timing.min_peers} contributors ({len(p.replica.contributors(tip.round))} so far)", frozenset()
        return f"the first commit of round {tip.round}", frozenset()
    log = Log.of(chain, p.replica.facts, me)
    attempt = seat.attempt
    if seat.step is Step.PROPOSE:
        proposer = chain.proposer(attempt)
        return f"the proposal of attempt {attempt}", frozenset({proposer})
    voters = log.prevotes if seat.step is Step.PREVOTE else log.precommits
    said = set().union(*voters.get(attempt, {}).values())
    kind = "prevotes" if seat.step is Step.PREVOTE else "precommits"
    return f"{kind} of more than two thirds of {len(tip.electorate)}", tip.electorate - said


def round_clock(p: Any, now: float) -> dict[str, Any]:
    """How long the round's agreement has waited here, when a recover is due, the attempt and
    epoch, and what this node does next, for `run status`, `run watch` and the dashboard; with
    `stuck` (cause and fix) once the round has gone its recover deadline uncertified. Empty while
    no agreement runs here."""
    seat = p.seat
    if seat.machine is None or seat.started_at is None:
        return {}
    waited = max(0.0, now - seat.started_at)
    recover = p.recover_after()
    usual = p.machine.pace()
    return {"attempt": seat.machine.attempt, "epoch": seat.machine.epoch, "step": seat.machine.step.value,
            "waited_s": round(waited, 1), "deadline_s": round(recover, 1),
            "usual_s": None if usual is None else round(usual, 1),
            "stuck": stuck(p, waited, recover),
            "next": _next_step(p, waited, recover)}


def stuck(p: Any, waited: float, recover: float) -> dict[str, str] | None:
    """Why the round under way cannot advance, and what fixes it; None while it may."""
    if waited < recover:
        return None
    chain = p.replica.chain
    tip = chain.tip
    log = Log.of(chain, p.replica.facts, p.me)
    heard = set().union(*log.senders.values()) if log.senders else set()
    silent = sorted(p._peer_id(key) for key in tip.electorate - heard - {p.me})
    signed = len(chain.signers())
    if silent and 3 * len(silent) >= len(tip.electorate):
        cause = (f"round {tip.round} has had no certificate for {waited:.0f} s: {len(silent)} of the "
                 f"{len(tip.electorate)} members of its electorate sent nothing ({', '.join(silent)}), more than a "
                 "third, so no two thirds can agree")
        fix = (f"the run recovers once more than half of the electorate signed a recover ({signed} of "
               f"{len(tip.electorate)} so far): start the silent members' nodes (locomesh node start), or wait for "
               "the others' recovers")
    else:
        cause = (f"round {tip.round} has had no certificate for {waited:.0f} s although the members vote "
                 f"(attempt {p.seat.machine.attempt}): proposals name payloads that members cannot fetch")
        fix = "check that the members can reach each other (locomesh peers, locomesh doctor)"
    return {"cause": cause, "fix": fix}


def _next_step(p: Any, waited: float, recover: float) -> str:
    if waited >= recover:
        return ("signed a recover: once more than half of the electorate has, the run goes on with those that are "
                "there")
    left = f"{recover - waited:.0f} s"
    step = p.seat.machine.step
    if step is Step.PROPOSE:
        return f"prevote the attempt's proposal once its payloads are here; a recover is due in {left}"
    if step is Step.PREVOTE:
        return f"precommit once two thirds prevote one value; a recover is due in {left}"
    return f"adopt the state once the round is certified; a recover is due in {left}"


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
    chain = p.replica.chain
    tip = chain.tip
    log = Log.of(chain, p.replica.facts, p.me)
    attempt = None if p.seat.machine is None else p.seat.machine.attempt
    return {
        "next_round": {
            "round": tip.round,
            "epoch": tip.epoch.number,
            "electorate": len(tip.electorate),
            "commits": len(p.replica.commits(tip.round)),
            "proposals": sum(len(proposals) for proposals in log.proposals.values()),
            "prevotes": 0 if attempt is None else len(set().union(*log.prevotes.get(attempt, {}).values())),
            "precommits": 0 if attempt is None else len(set().union(*log.precommits.get(attempt, {}).values())),
            "contributors": None if p.work is None else len(set(p.work.arrived) | set(p.work.payloads)),
        },
        "run_id": short_run_id(p.run_id),
        "phase": p.status_phase(),
        "sitting_out": p.sitting_out(),
        "attempt": attempt or 0,
        "epoch": tip.epoch.number,
        "say": _say(p),
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
        # fresh key (peer ID) -> counted rounds it still needs for a say
        "earning": {peer_id_from_public_key(key): rounds for key, rounds in state.earning.items()},
        "data": None if p.data is None else p.data.status(),
    }


def _say(p: Any) -> dict[str, Any]:
    """This node's say in the run: in the electorate, earning one (how many counted rounds it still
    needs), or none (not on the roster)."""
    tip = p.replica.chain.tip
    member = tip.membership.roster.get(p.me)
    if p.me in tip.electorate:
        return {"has": True, "why": "in the electorate"}
    if member is None:
        return {"has": False, "why": "not on the run's roster: a join waits for a round to admit it"}
    if member.say:
        return {"has": False, "why": "away from the electorate: back once a certified round counts our payload"}
    needed = max(0, p.replica.genesis.earn_rounds - member.counted)
    return {"has": False, "why": f"earning a say: {needed} more counted round(s), then a place in the rounds' "
                                 "draw of new voters"}


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
