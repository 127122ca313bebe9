"""Scenario `nat`'s report: what one run measured (`RunRecord`), and the report of one run or of several seeds pooled.

A run hands over plain records: one `PairRecord` per pair it connected,
one `RestartRecord` for the relay it killed and restarted, the verdicts
table and the error counts. `report` pools any number of runs (one per seed)
into the scenario's report: a plain overview and the verdict (the issue's
targets as `netsim.report` criteria), the summary (the targets' line and the
verdict again, for scripts); the pair table by (dialer kind, target kind, what they
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

from ..report import criterion, glossary, percentile, table, verdict

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


GLOSSARY = {
    "NAT": "a router that shares one public address among machines behind it and decides which connections "
           "from outside it lets in; what often stops two volunteers' machines from connecting",
    "NAT kinds": "public: no NAT; full-cone, restricted, port-restricted: home routers that let in more or fewer "
                 "outside hosts; symmetric: a new outside port per destination (hard to get through); cgnat: "
                 "behind a carrier-grade NAT shared by many customers; home+cgnat: a home router behind one (double "
                 "NAT); /random: a router that does not keep the inside port",
    "relay": "a public node that passes traffic between two nodes that cannot connect directly; a node reserves "
             "a slot on a relay so that others can reach it through it",
    "hole punch": "both nodes dial each other at the same moment, coordinated through a relay, so that each "
                  "NAT sees an outgoing connection and lets the other in",
    "direct, hole-punched, relayed, none": "how a pair ended up connected: a plain dial worked; relayed first, then "
                                           "a hole punch made it direct; only through a relay; not at all",
    "NATed pairs": "pairs with at least one node behind a NAT",
    "peer record": "what a node publishes (in the DHT; here a directory standing for it) so that others can "
                   "reach it: its listen address, addresses a dial-back proved, and its relay addresses",
    "listen address, observed address": "the address a node listens on inside its own network; the public "
                                        "address and port its NAT gave it, as another node sees it",
    "simultaneous open": "two dials that cross on the wire and make one connection: what a hole punch relies on",
    "model says": "what the simulator's NAT model says is the best possible path for the pair (see the pair table's "
                  "note); 'relay' means no direct path exists",
    "direct share": "of the NATed pairs the model says can go direct, the share that did",
    "to direct": "virtual seconds from a pair's first (relayed) connection to its direct one",
    "reachability verdict": "what a node concluded about itself from peers dialling it back: public (reachable "
                            "from outside), private (not), unknown (too little evidence yet)",
    "relay slots": "reservations a node holds on relays; two or more keep it reachable when one relay dies",
    "relayed links, cut, back": "pairs connected only through relays when a relay was killed; those that lost "
                                "every connection; those connected again by the end (by the nodes themselves)",
    "targets (#25)": "the goals of issue #25 that the verdict judges",
}


def report(config: dict, runs: list[RunRecord], kind_order: list[str]) -> dict:
    """The scenario's report for `runs` (one per seed)."""
    tables = [_pair_table(runs, kind_order), _verdict_table(runs), _restart_table(runs)]
    if len(runs) > 1:
        tables.append(_seed_table(runs))
    tables.append(_error_table(runs))
    pairs = _pooled(runs)
    return {"scenario": "nat", "overview": _overview(config, runs), "verdict": verdict(_criteria(pairs)),
            "config": config, "summary": _summary(runs), "tables": tables,
            "glossary": glossary(GLOSSARY, common=("seed", "virtual seconds", "p50, p90, p99",
                                                   "errors counted by nodes"))}


def _overview(config: dict, runs: list[RunRecord]) -> str:
    pairs = _pooled(runs)
    natted = [pair for pair in pairs if pair.natted]
    connected = _share(sum(pair.outcome != "none" for pair in natted), len(natted))
    share, p90 = direct_share(pairs), percentile(to_direct_times(pairs), 90)
    seeds = f"{len(runs)} seeds" if len(runs) > 1 else f"seed {runs[0].seed}"
    cut = sum(run.restart.cut for run in runs)
    back = sum(len(run.restart.back_after) for run in runs)
    text = (
        f"{config.get('nodes', '?')} simulated nodes ({runs[0].relays} public relays, the others behind NATs of "
        f"topology {config.get('topology', '?')}) ran the daemon's NAT traversal (reachability check, relays, hole "
        f"punching), and {len(pairs)} pairs of them connected as members of a run do ({seeds}). "
        f"{_percent(connected)} of the NATed pairs connected at all, and {_percent(share)} of those the NAT model "
        f"says can go direct did"
        + ("." if p90 is None else f"; 90% of those that needed a hole punch were direct within {p90:.1f} s of "
           "their first connection.")
    )
    if any(run.restart.killed_at is not None for run in runs):
        text += (f" Then the busiest relay died and came back: {cut} relayed links were cut and {back} of them "
                 "came back on their own.")
    return text


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{share:.1%}"


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
        "verdict": verdict(_criteria(pairs))["result"],  # kept here too, for scripts that read the summary
        "virtual seconds": round(max(run.virtual_seconds for run in runs), 3),
    }


def _share_ok(share: float | None) -> bool:
    return share is None or share >= TARGET_DIRECT_SHARE  # None: no pair the model lets go direct


def _p90_ok(p90: float | None) -> bool:
    return p90 is None or p90 <= TARGET_TO_DIRECT_P90  # None: no pair needed a hole punch


def _criteria(pairs: list[PairRecord]) -> list[dict]:
    """The targets of issue #25, as the verdict's criteria."""
    share, p90 = direct_share(pairs), percentile(to_direct_times(pairs), 90)
    return [
        criterion(f"at least {TARGET_DIRECT_SHARE:.0%} of the NATed pairs the NAT model lets go direct did",
                  share, _share_ok(share)),
        criterion(f"hole-punched pairs went direct within {TARGET_TO_DIRECT_P90:.0f} s of their first connection "
                  "(p90, seconds)", "no pair needed one" if p90 is None else _rounded(p90), _p90_ok(p90)),
    ]


def _targets_line(share: float | None, p90: float | None) -> str:
    return (
        f"direct where the model allows it {_cell(share)} (target {TARGET_DIRECT_SHARE:.0%}): "
        f"{'pass' if _share_ok(share) else 'FAIL'}; first connection to direct p90 {_cell(p90)} s "
        f"(target <= {TARGET_TO_DIRECT_P90:.0f} s): {'pass' if _p90_ok(p90) else 'FAIL'}"
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

