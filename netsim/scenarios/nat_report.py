"""Scenario `nat`'s report: what one run measured (`RunRecord`), and the report of one run or of several seeds pooled.

A run hands over plain records: one `PairRecord` per pair it connected,
one `RestartRecord` for the relay it killed and restarted, the verdicts
table and the error counts. `report` pools any number of runs (one per seed)
into the scenario's report: the summary, with the issue's targets and a
PASS/FAIL line; the pair table by (dialer kind, target kind, what they
share); reachability; the relay restart; a row per seed when there are
several; errors. Everything comes from the simulation (virtual seconds,
counts), so the same seeds give the same report.

The targets (issue #25): among NATed pairs the NAT model says can end up
directly connected, the share that did (`TARGET_DIRECT_SHARE`), and the time
from their first connection to the direct one, p90 over the pairs that
upgraded (`TARGET_TO_DIRECT_P90`); a pair connected directly at once counts
0 s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..report import percentile, table

OUTCOMES = ("direct", "hole-punched", "relayed", "none")
TARGET_DIRECT_SHARE = 1.0
TARGET_TO_DIRECT_P90 = 30.0


@dataclass
class PairRecord:
    dialer: str  # kind labels
    target: str
    shared: str  # "cgnat": behind one CGNAT; "lan": one LAN; "": nothing
    model: str  # the NAT model's word (`nat_model.pair_verdict`): direct, lan, punch, "... from the target", relay
    outcome: str = "none"
    first_connection: float | None = None  # seconds from the start of the connect
    direct_at: float | None = None  # seconds from the start of the connect

    @property
    def natted(self) -> bool:
        return (self.dialer, self.target) != ("public", "public")

    @property
    def direct_possible(self) -> bool:
        return self.model != "relay"

    @property
    def went_direct(self) -> bool:
        return self.outcome in ("direct", "hole-punched")

    @property
    def to_direct(self) -> float | None:
        """Seconds from the first connection to the direct one (0 for a direct dial); None if never direct."""
        if self.direct_at is None or self.first_connection is None:
            return None
        return max(0.0, self.direct_at - self.first_connection)


@dataclass
class RestartRecord:
    relay: str = ""  # the relays killed, by name
    killed_at: float | None = None  # virtual s of the run
    outage: float = 0.0
    relayed_links: int = 0  # relayed-only pairs when it was killed
    through_it: int = 0  # of those, with a relayed connection through a killed relay
    cut: int = 0  # links seen without any connection after the kill
    back_after: list[float] = field(default_factory=list)  # seconds from the kill to back, per cut link back
    with_two_slots_before: int = 0  # members holding >= 2 relay reservations
    with_two_slots_after: int = 0
    members: int = 0


@dataclass
class RunRecord:
    seed: int
    relays: int
    pairs: list[PairRecord]
    verdicts: list[list]  # rows of the reachability table
    errors: Counter[str]
    restart: RestartRecord
    virtual_seconds: float


def report(config: dict, runs: list[RunRecord], kind_order: list[str]) -> dict:
    """The scenario's report for `runs` (one per seed)."""
    tables = [_pair_table(runs, kind_order), _verdict_table(runs), _restart_table(runs)]
    if len(runs) > 1:
        tables.append(_seed_table(runs))
    tables.append(_error_table(runs))
    return {"scenario": "nat", "config": config, "summary": _summary(runs), "tables": tables}


def _pooled(runs: list[RunRecord]) -> list[PairRecord]:
    return [pair for run in runs for pair in run.pairs]


def direct_share(pairs: list[PairRecord]) -> float | None:
    """Among NATed pairs the model says can go direct, the share that did."""
    possible = [pair for pair in pairs if pair.natted and pair.direct_possible]
    return _share(sum(pair.went_direct for pair in possible), len(possible))


def to_direct_times(pairs: list[PairRecord], *, upgraded_only: bool = True) -> list[float]:
    """Seconds from first connection to direct, over pairs that hole-punched (or all that went direct)."""
    kept = [pair for pair in pairs if pair.outcome == "hole-punched" or not upgraded_only]
    return [time for pair in kept if (time := pair.to_direct) is not None]


def _summary(runs: list[RunRecord]) -> dict:
    pairs = _pooled(runs)
    natted = [pair for pair in pairs if pair.natted]
    firsts = [pair.first_connection for pair in pairs if pair.first_connection is not None]
    upgrades = to_direct_times(pairs)
    share, p90 = direct_share(pairs), percentile(upgrades, 90)
    backs = [time for run in runs for time in run.restart.back_after]
    cut = sum(run.restart.cut for run in runs)
    return {
        "seeds": [run.seed for run in runs] if len(runs) > 1 else runs[0].seed,
        "relays": runs[0].relays,
        "pairs tried": len(pairs),
        "outcomes": dict(Counter(pair.outcome for pair in pairs)),
        "NATed pairs connected (share)": _share(sum(pair.outcome != "none" for pair in natted), len(natted)),
        "direct where the model allows it (share)": share,
        "time to first connection p50 (s)": _rounded(percentile(firsts, 50)),
        "time to first connection p90 (s)": _rounded(percentile(firsts, 90)),
        "time to first connection max (s)": _rounded(max(firsts, default=None)),
        "hole-punched: first connection to direct p50 (s)": _rounded(percentile(upgrades, 50)),
        "hole-punched: first connection to direct p90 (s)": _rounded(p90),
        "relay restarts": sum(run.restart.killed_at is not None for run in runs),
        "relayed links cut by the relay's death, back (of cut)": f"{len(backs)} of {cut}",
        "relayed links back: time from the kill p50 (s)": _rounded(percentile(backs, 50)),
        "relayed links back: time from the kill p90 (s)": _rounded(percentile(backs, 90)),
        "targets (#25)": _targets_line(share, p90),
        "verdict": "PASS" if _passes(share, p90) else "FAIL",
        "virtual seconds": round(max(run.virtual_seconds for run in runs), 3),
    }


def _passes(share: float | None, p90: float | None) -> bool:
    return (share is None or share >= TARGET_DIRECT_SHARE) and (p90 is None or p90 <= TARGET_TO_DIRECT_P90)


def _targets_line(share: float | None, p90: float | None) -> str:
    share_ok = share is None or share >= TARGET_DIRECT_SHARE
    p90_ok = p90 is None or p90 <= TARGET_TO_DIRECT_P90
    return (
        f"direct where the model allows it {_cell(share)} (target {TARGET_DIRECT_SHARE:.0%}): "
        f"{'pass' if share_ok else 'FAIL'}; first connection to direct p90 {_cell(p90)} s "
        f"(target <= {TARGET_TO_DIRECT_P90:.0f} s): {'pass' if p90_ok else 'FAIL'}"
    )


def _pair_table(runs: list[RunRecord], kind_order: list[str]) -> dict:
    pairs = _pooled(runs)
    rank = {label: index for index, label in enumerate(kind_order)}
    keys = sorted({(p.dialer, p.target, p.shared) for p in pairs},
                  key=lambda key: (rank.get(key[0], 99), rank.get(key[1], 99), key[2]))
    rows = []
    for dialer, target, shared in keys:
        group = [p for p in pairs if (p.dialer, p.target, p.shared) == (dialer, target, shared)]
        outcomes = Counter(pair.outcome for pair in group)
        upgrades = to_direct_times(group)
        rows.append([
            dialer, target, shared or "—", len(group), *(outcomes[outcome] for outcome in OUTCOMES),
            group[0].model, direct_share(group) if group[0].natted else None,
            _rounded(percentile(upgrades, 50)), _rounded(percentile(upgrades, 90)),
        ])
    return table(
        "Pair connectivity by NAT type (dialer -> target)",
        ["dialer", "target", "shares", "pairs", *OUTCOMES, "model says", "direct share",
         "to direct p50 (s)", "to direct p90 (s)"],
        rows,
        note="direct: a dial to an address in the target's peer record worked; hole-punched: relayed first, then "
        "a hole punch made a direct connection; relayed: through a relay only. shares: cgnat, both behind one CGNAT. "
        "'model says' is the NAT model's best path (direct: a plain dial to the observed address; lan: to the "
        "listen address; punch: a simultaneous open at the observed addresses; '... from the target': only the "
        "target has such a path to the dialer; relay: none of those). direct "
        "share: of the pairs, those that ended direct, where the model says they can. to direct: seconds from "
        "the first (relayed) connection to the direct one, hole-punched pairs.",
    )


def _verdict_table(runs: list[RunRecord]) -> dict:
    summed: dict[str, list] = {}
    for run in runs:
        for row in run.verdicts:
            if row[0] not in summed:
                summed[row[0]] = list(row)
            else:
                summed[row[0]][1:] = [a + b for a, b in zip(summed[row[0]][1:], row[1:])]
    return table(
        "Reachability verdicts and relay reservations (at the end)",
        ["nat type", "nodes", "public", "private", "unknown", "with relay slots", "with 2+ relay slots"],
        list(summed.values()),
    )


def _restart_table(runs: list[RunRecord]) -> dict:
    rows = []
    for run in runs:
        restart = run.restart
        if restart.killed_at is None:
            continue
        backs = restart.back_after
        rows.append([
            run.seed, restart.relay, _rounded(restart.killed_at), restart.outage, restart.relayed_links,
            restart.through_it, restart.cut, len(backs), _rounded(percentile(backs, 50)),
            _rounded(max(backs, default=None)),
            f"{restart.with_two_slots_before} -> {restart.with_two_slots_after} of {restart.members}",
        ])
    return table(
        "A relay dies and returns with the same identity and address",
        ["seed", "relay", "killed at (s)", "down for (s)", "relayed links", "through it", "cut", "back",
         "back p50 (s)", "back max (s)", "members with 2+ slots (before -> after)"],
        rows,
        note="relayed links: pairs connected only through relays when it was killed; through it: of those, with a "
        "connection through it; cut: seen without any connection after the kill; back: connected again (any path) "
        "by the end; times from the kill. members with 2+ slots: nodes holding two relay reservations or more, "
        "before the kill and at the end. The scenario re-dials nothing: what comes back, the node code brought back.",
    )


def _seed_table(runs: list[RunRecord]) -> dict:
    rows = []
    for run in runs:
        upgrades = to_direct_times(run.pairs)
        rows.append([
            run.seed, len(run.pairs), direct_share(run.pairs), _rounded(percentile(upgrades, 90)),
            run.restart.cut, len(run.restart.back_after),
        ])
    return table("Per seed", ["seed", "pairs", "direct share", "to direct p90 (s)", "links cut", "links back"], rows)


def _error_table(runs: list[RunRecord]) -> dict:
    errors: Counter[str] = Counter()
    for run in runs:
        errors.update(run.errors)
    return table("Errors counted by nodes", ["code", "count"], sorted(errors.items()))


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"

