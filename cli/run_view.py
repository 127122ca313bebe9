"""How a run's rounds read in the terminal: one line or one table row per finished round (a
``run.status`` history record, node/rounds/work.py `RoundRecord`), and what a round under way is
doing. `run status`, `run watch` and `run join` all show rounds through these, so a round looks
the same wherever it appears."""

from __future__ import annotations

import time
from typing import Any

from locomesh.node.rounds.outcome import CONTRIBUTED, COUNTED, NOT_COUNTED, SYNCED_ONLY

from .common import TextTable, emit, human_size, peer_name, plural

ROUND_COLUMNS = ("ROUND", "DONE AT", "EVAL LOSS", "FLOOR", "TRAIN LOSS", "OUR PART", "PAYLOADS", "SENT", "FETCHED",
                 "TRAIN (s)", "FETCH (s)", "OUTER (s)", "EXCHANGE (s)", "ROUND (s)")
# What the table's columns hold, under it: the terms are this project's, the reader's may differ.
ROUND_LEGEND = (
    "DONE AT: local time the round finished here; FLOOR: the lowest loss the task allows; OUR PART: what became of "
    "this node's part (counted: our payload is in the certified set; not counted: sent but left out, why under the "
    "table; sat out: paused, outside the schedule or not a member yet; synced only: not trained here); PAYLOADS: "
    "contributions aggregated here (-: the state was downloaded instead); TRAIN: our inner steps; FETCH: from the "
    "last commit to the last payload in hand; OUTER: the outer step (decode, aggregate, Nesterov); EXCHANGE: fetch "
    "and outer step; ROUND: from the start of our training to the round's certificate"
)
SHOWN_PEERS = 3  # peers a "waiting for" line names; the rest are counted
# node/rounds/outcome.py's kinds as a line says them: "synced" alone read as "my work was discarded".
OUTCOME_WORDS = {COUNTED: f"{CONTRIBUTED}, {COUNTED}", NOT_COUNTED: f"{CONTRIBUTED}, {NOT_COUNTED}"}

# Round machine phases (node/rounds/events.py `Phase`) in a user's words.
PHASE_WORDS = {
    "idle": "waiting to start", "train": "training (inner steps)",
    "committed": "payload sent: agreeing on the round's set", "replay": "computing the certified set's outer step",
    "sync": "syncing the run's state", "leaving": "leaving: voting until the leave takes effect",
    "paused": "paused: sitting rounds out, keeping the state current",
    "sitting out": "sitting rounds out (its schedule or limits), keeping the state current",
    "rejoining": "rejoining the run after the restart",
}


def round_line(record: dict[str, Any]) -> str:
    """One finished round: eval loss (and the floor), train loss, what became of our part, payloads
    aggregated here, bytes sent and fetched, then each time labelled (training, exchange, fetch,
    outer step, round)."""
    parts = [f"eval loss {_loss(record['eval_loss'])}" + ("" if record["floor"] is None else f" (floor {record['floor']:.4f})")]
    if record.get("train_loss") is not None:
        parts.append(f"train loss {record['train_loss']:.4f}")
    parts.append(outcome_text(record))
    if record["contributors"]:
        parts.append(f"{plural(record['contributors'], 'payload')} aggregated")
    if record.get("payload_bytes"):
        parts.append(f"{_size(record['payload_bytes'])} sent")
    if record.get("bytes_fetched"):
        parts.append(f"{_size(record['bytes_fetched'])} fetched")
    return f"round {record['round']:>4}: " + ", ".join(parts) + "; " + ", ".join(_times(record))


def outcome_text(record: dict[str, Any]) -> str:
    """What became of this node's part in the round, and why where it knows: "contributed, counted",
    "contributed, not counted (committed after the cut)", "sat out (paused)", "synced only"."""
    words = OUTCOME_WORDS.get(outcome_kind(record), outcome_kind(record))
    return words + (f" ({record['outcome_why']})" if record.get("outcome_why") else "")


def outcome_kind(record: dict[str, Any]) -> str:
    """The record's outcome (node/rounds/outcome.py); for one kept before outcomes were, what it
    still tells: a payload sent (a train loss) or a state computed here means we contributed."""
    if record.get("outcome"):
        return record["outcome"]
    return SYNCED_ONLY if record["synced"] and record.get("train_loss") is None else CONTRIBUTED


def _times(record: dict[str, Any]) -> list[str]:
    """The round's times, each named: "train 1.6 s", "exchange 0.3 s (fetch 0.1 s, outer step 0.0 s)", "round 2.4 s"."""
    times = []
    if record.get("train_seconds") is not None:
        times.append(f"train {record['train_seconds']:.1f} s")
    if record.get("exchange_seconds") is not None:
        inside = [f"{name} {record[key]:.1f} s" for name, key in (("fetch", "fetch_seconds"), ("outer step", "aggregate_seconds"))
                  if record.get(key) is not None]
        times.append(f"exchange {record['exchange_seconds']:.1f} s" + (f" ({', '.join(inside)})" if inside else ""))
    times.append(f"round {record['seconds']:.1f} s")
    return times


# Columns a narrow terminal leaves out first (cli/table_fit.py): the floor (one figure a run), the
# exchange's parts, bytes, then times.
ROUND_OPTIONAL = ("FLOOR", "FETCH (s)", "OUTER (s)", "FETCHED", "SENT", "TRAIN (s)", "EXCHANGE (s)", "DONE AT", "TRAIN LOSS")


def round_table(records: list[dict[str, Any]]) -> TextTable:
    """Finished rounds as a table, one row each (`ROUND_COLUMNS`)."""
    return TextTable.columns(ROUND_COLUMNS, [_cells(record) for record in records], optional=ROUND_OPTIONAL)


def _cells(record: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(record["round"]), _clock(record.get("finished_at")), _loss(record["eval_loss"]), _loss(record["floor"]),
        _loss(record.get("train_loss")), outcome_kind(record), str(record["contributors"] or "-"),
        _size(record.get("payload_bytes")), _size(record.get("bytes_fetched")), _seconds(record.get("train_seconds")),
        _seconds(record.get("fetch_seconds")), _seconds(record.get("aggregate_seconds")),
        _seconds(record.get("exchange_seconds")), _seconds(record["seconds"]),
    )


def phase_text(status: dict[str, Any]) -> tuple[str, str]:
    """What the round under way does (``run.status``), as (what, waiting for what and whom): the
    first part changes with the phase, the second with every commit or vote that arrives."""
    phase = status["phase"]
    if phase == "rejoining":  # no round of ours under way yet
        return PHASE_WORDS[phase], ""
    if phase == "sync":
        return f"syncing the run's state (certified round {status['certified']})", ""
    return f"round {status['round'] + 1}: {PHASE_WORDS.get(phase, phase)}", waiting_text(status.get("waiting"))


def waiting_text(waiting: dict[str, Any] | None) -> str:
    """"waiting for precommits of ... from 12D3KooW..., 12D3KooW... and 2 more": what the round waits
    for and the peers (by peer ID) it waits on, then where its agreement stands (attempt, epoch,
    step, the time waited against the recover deadline) and what this node does next; "" when it
    waits for nothing."""
    if not waiting or not waiting.get("for"):
        return ""
    peers = list(waiting.get("on") or [])
    unreachable = set(waiting.get("unreachable") or ())
    named = [f"{peer} (not connected)" if peer in unreachable else peer for peer in peers[:SHOWN_PEERS]]
    more = f" and {len(peers) - SHOWN_PEERS} more" if len(peers) > SHOWN_PEERS else ""
    text = f"waiting for {waiting['for']}" + (f" from {', '.join(named)}{more}" if peers else "")
    if "waited_s" in waiting:
        epoch = f", recovery epoch {waiting['epoch']}" if waiting.get("epoch") else ""
        usual = "" if waiting.get("usual_s") is None else f", a round usually takes {waiting['usual_s']:.0f} s"
        text += (f" (attempt {waiting['attempt']}{epoch}, {waiting['step']} step: {waiting['waited_s']:.0f} s of the "
                 f"{waiting['deadline_s']:.0f} s before a recover{usual}); next: {waiting['next']}")
    return text


def stuck_lines(waiting: dict[str, Any] | None) -> list[str]:
    """The round under way cannot advance (``waiting.stuck``): why, and what fixes it, as `locomesh
    doctor` says a failed check (a FAIL line, a "fix:" line under it); none while it may advance."""
    stuck = (waiting or {}).get("stuck")
    if not stuck:
        return []
    return [f"  FAIL  stuck: {stuck['cause']}", f"        fix: {stuck['fix']}"]


def say_text(status: dict[str, Any]) -> str:
    """Whether this node has a say in the run's rounds (it votes on them), or how many counted rounds
    it still needs to earn one; "" for a status that does not tell."""
    say = status.get("say")
    if not say:
        return ""
    if say["has"]:
        return f"say: yes, this node votes on the rounds ({say['why']})"
    me = next((member["peer_id"] for member in status.get("member_peers") or [] if member["you"]), None)
    needed = (status.get("earning") or {}).get(me)
    if needed is not None:
        return (f"say: none yet, earning one: {plural(needed, 'more counted round')} (rounds whose certified set "
                "counts our payload), then a place in the rounds' draw of new voters")
    return f"say: none ({say['why']})"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _size(count: int | None) -> str:
    """A byte count as `human_size` writes it; "-" for none or 0 (a synced round sends nothing)."""
    return "-" if not count else human_size(count)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _clock(when: float | None) -> str:
    """A Unix time as the local time of day; "-" for none."""
    return "-" if not when else time.strftime("%H:%M:%S", time.localtime(when))


def joined_text(result: dict[str, Any]) -> str:
    """`run.join`'s answer in a line: the first round it trains, unless it sits rounds out now
    (then a round number would promise what its schedule or a pause will not keep)."""
    if result.get("outside_schedule"):
        return f"joined; outside this node's schedule ({result['outside_schedule']}): training from the next window"
    if result.get("sitting_out"):
        return f"joined; sitting rounds out for now: {result['sitting_out']}"
    return f"joined; training from round {result['joins_at']}"


# --- `run status` ------------------------------------------------------------------------------


def format_status(status: dict[str, Any]) -> str:
    """`run.status` as plain lines: what the node does in the run and what the round waits for, its
    members by peer ID, then one line per finished round (each time named) and the scores."""
    return "\n".join([*status_head(status), *_round_lines(status), *_score_lines(status)])


def show_status(status: dict[str, Any]) -> None:
    """`run.status` on a terminal: as `format_status`, the rounds drawn as a rich table with a legend."""
    print("\n".join(status_head(status)))
    if status["history"]:
        emit(round_table(status["history"]))
        for line in _left_out_lines(status["history"]):
            print(line)
        print(f"  ({ROUND_LEGEND})")
    if status.get("scores"):
        print("\n".join(_score_lines(status)))


def status_head(status: dict[str, Any]) -> list[str]:
    """The lines above the rounds: the run, this node's phase in it, what the round under way waits
    for (and on whom; why it is stuck, with the fix, once it is), whether this node has a say, the
    device, the dataset, the members; for a run left, only that."""
    if status.get("phase") == "rejoining":
        return [f"rejoining run {status['run_id']} after the restart: it trains again once its model is built and "
                f"its participants met; {plural(len(status['history']), 'round')} it finished here kept",
                *_member_lines(status)]
    if status.get("training") is False:
        return [f"run {status['run_id']}: not training (left after round {status.get('left_after')}); "
                f"{plural(len(status['history']), 'round')} it finished here kept", *_member_lines(status)]
    lines = [
        f"run {status['run_id']}: {status['phase']}, state of round {status['round']} "
        f"(certified {status['certified']}), {plural(status['members'], 'member')}, "
        f"{plural(status['peers'], 'peer')} connected"
    ]
    if status.get("error"):
        lines.append(f"  stopped: {status['error']}")
    elif status.get("phase") not in ("banned", "failed"):
        lines.append("  now: " + "; ".join(part for part in phase_text(status) if part))
        lines += stuck_lines(status.get("waiting"))
    if say_text(status):
        lines.append(f"  {say_text(status)}")
    if status.get("device"):
        lines.append(f"  training on: {status['device']}")
    data = status.get("data")
    if data:
        lines.append(f"  dataset {data['dataset'][:16]}: {data['shards_per_member']} of its {data['train_shards']} "
                     "train shards a round")
    return lines + _member_lines(status)


def _member_lines(status: dict[str, Any]) -> list[str]:
    """A line per member: its peer ID, whether it is this node or connected, how many of the newest
    certified rounds aggregated its payload, and for a fresh key, the counted rounds it still needs
    for a say."""
    members = status.get("member_peers") or []
    accepted = status.get("contributions") or {}
    earning = status.get("earning") or {}
    lines = ["  members (peer ID; payloads aggregated in the newest certified rounds):"] if members else []
    for member in members:
        where = "this node" if member["you"] else "connected" if member["connected"] else "not connected"
        needs = earning.get(member["peer_id"])
        say = "" if needs is None else f", earning a say ({plural(needs, 'more counted round')})"
        lines.append(f"    {member['peer_id']}  {where}, {accepted.get(member['key'], 0)} aggregated{say}")
    return lines


def _round_lines(status: dict[str, Any]) -> list[str]:
    if not status["history"]:
        return []
    return ["  rounds finished here:", *(f"  {round_line(record)}" for record in status["history"])]


def _left_out_lines(records: list[dict[str, Any]]) -> list[str]:
    """Why each round that left our payload out did so, under the table (its cell has no room)."""
    return [f"  round {record['round']}: {outcome_text(record)}" for record in records
            if outcome_kind(record) == NOT_COUNTED and record.get("outcome_why")]


def _score_lines(status: dict[str, Any]) -> list[str]:
    scores = status.get("scores") or {}
    lines = ["  contribution scores (loss change applied alone; newest rounds):"] if scores else []
    for member, history in sorted(scores.items()):
        rounds = ", ".join(f"r{row['round']} {score_text(row['score'])}" for row in history["rounds"])
        lines.append(f"    {peer_name(member)}  mean {score_text(history['mean'])}  {rounds}")
    return lines


def score_text(score: float | None) -> str:
    """A contribution score as shown: signed, or "—" while it is not known (crdt/scores.py)."""
    return "—" if score is None else f"{score:+.4f}"
