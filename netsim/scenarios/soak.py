"""Scenario `soak`: a run trains for hours while its members crash, restart, leave, join and slow down.

The members are `train`'s (the daemon's services on simulated hosts, modelled training), and so is
the run; what `soak` adds is churn at random moments, drawn from the seed. Each virtual hour,
`churn` x N events hit members other than node 0 (the creator, standing for a bootstrap node
that stays up), each one of:

- **restart**: kill -9, then start again on the same data dir (same identity, its op log and its
  payload on disk) after `down_min` to `down_max` seconds;
- **replace**: kill -9 for good; a newcomer joins the run by its ID at once;
- **leave**: a clean `run leave`, and `run join` again after `down_min` to `down_max` seconds;
- **slow**: the member's inner steps take `slow_factor` times longer for `slow_seconds`.

An event that would take a third of the electorate out at once (down, gone for good while the
rounds have not dropped it yet, or left) is skipped: the round would wait for the recovery
(node/agreement/recovery.py), which `sim train` and the tests measure on their own. Not modelled here: packet loss and
link drops (a link's profile is fixed when a connection opens), relays (the scenario runs no NAT
traversal: `sim nat` covers relays that die and return).

Measured: rounds certified against the rounds the run's median round time allows over the run;
the rounds that took more than twice the median, with the events inside them; honest members
ever banned (every member here is honest); from each join, rejoin or restart to the member's
first payload in a certified set (p50, p90); bytes per member per hour; the simulator trains no
model, so there is no loss curve. The same seed gives the same report.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median

import trio

from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runs.registry import DEFAULT_HPARAMS
from locomesh.protocol.runs import load_manifest, sign_manifest

from .. import clock
from ..report import counted, criterion, glossary, percentile, table, verdict
from ..simulation import Simulation, run_simulation
from . import train
from .options import option

Progress = Callable[[str], None]
EVENTS = ("restart", "replace", "leave", "slow")
JOIN_RETRY = 30.0


@dataclass(frozen=True)
class Config:
    nodes: int = 8
    hours: float = option(1.0, "virtual hours the run trains")
    churn: float = option(0.5, "events per member per hour (restarts, replacements, leaves, slow spells)")
    inner_steps: int = option(100, "training steps each member takes per round (H)")
    step_seconds: float = option(0.2, "virtual seconds one step costs (100 x 0.2: 20 s of compute per round)")
    payload_bytes: int = option(16 * 1024, "bytes of a member's per-round update")
    round_deadline_s: int = option(600, "the run's round deadline, seconds (attempts adapt below it)")
    down_min: float = option(60.0, "shortest time a restarted or departed member stays away, seconds")
    down_max: float = option(900.0, "longest time a restarted or departed member stays away, seconds")
    slow_factor: float = option(3.0, "how much slower a member trains during a slow spell")
    slow_seconds: float = option(300.0, "how long a slow spell lasts, seconds")
    partition_at: float = option(0.0, "virtual seconds after round 1 when the members split into two halves that "
                                      "cannot reach each other (0: never)")
    partition_seconds: float = option(300.0, "how long the split lasts, seconds")
    slow_group: float = option(0.0, "share of the members slowed at once (by slow_factor, for slow_seconds), every "
                                    "slow_every seconds (0: never)")
    slow_every: float = option(1200.0, "seconds between the slow spells of slow_group")


@dataclass
class _Event:
    at: float
    kind: str
    member: str = ""
    until: float = 0.0
    skipped: str = ""


class _Soak(train._Run):
    """`train._Run` with churn instead of a fixed number of rounds."""

    def __init__(self, sim: Simulation, config: Config, directory: Path, progress: Progress) -> None:
        training = train.Config(nodes=config.nodes, rounds=10**6, inner_steps=config.inner_steps,
                                step_seconds=config.step_seconds, payload_bytes=config.payload_bytes,
                                round_deadline_s=config.round_deadline_s)
        super().__init__(sim, training, directory, progress)
        self.soak = config
        self.events: list[_Event] = []
        self.away: set[str] = set()  # members down or left right now
        self.arrivals: list[tuple[str, str, float]] = []  # (member, how, when it joined, rejoined or came back)
        self.banked: dict[str, int] = {}  # bytes of a member's hosts that were killed
        self.first_round_at = 0.0

    async def soak_run(self) -> None:
        team = [self._add("honest") for _ in range(self.soak.nodes)]
        creator = team[0]
        await self._start(creator)
        self._create_run(creator, team)
        await creator.rounds.join(self.manifest)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._note_rounds)
            async with trio.open_nursery() as joins:
                for member in team[1:]:
                    joins.start_soon(self._join, member, creator, self.rng.uniform(0, self.config.join_window))
            while not any(1 in m.done_at for m in self.members):
                await trio.sleep(train.WATCH_SECONDS)
            self.first_round_at = trio.current_time()
            end = self.first_round_at + self.soak.hours * 3600
            for at, kind in self._schedule(self.first_round_at, end):
                nursery.start_soon(self._event, at, kind, creator)
            if self.soak.partition_at:
                nursery.start_soon(self._partition, self.first_round_at + self.soak.partition_at, creator)
            if self.soak.slow_group:
                nursery.start_soon(self._slow_groups, end)
            await trio.sleep_until(end)
            nursery.cancel_scope.cancel()

    def _create_run(self, creator: train._Member, team: list[train._Member]) -> None:
        """`train`'s run (its `team` admitted at genesis), less its `min_peers` = N: a run that waits
        for every member stalls as soon as one is away, by its creator's choice; this one starts
        with whoever is in."""
        config = self.config
        hparams = {**DEFAULT_HPARAMS, "round_deadline_s": config.round_deadline_s, "inner_steps": config.inner_steps}
        self.manifest = sign_manifest(creator.node.identity, task="netsim", name="netsim soak", seed=self.sim.seed,
                                      hparams=hparams, public=True, created=int(clock.wall()),
                                      admitted=[member.node.identity.public_key for member in team])
        self.run_id = load_manifest(self.manifest)[0]
        creator.services.registry.store.add(self.manifest, "created")
        self.started = trio.current_time()

    def _schedule(self, start: float, end: float) -> list[tuple[float, str]]:
        count = round(self.soak.churn * self.soak.nodes * (end - start) / 3600)
        return sorted((self.rng.uniform(start, end), self.rng.choice(EVENTS)) for _ in range(count))

    async def _event(self, at: float, kind: str, creator: train._Member) -> None:
        await trio.sleep_until(at)
        event = _Event(at, kind)
        self.events.append(event)
        candidates = [m for m in self.members[1:] if not m.crashed and m.name not in self.away]
        if not candidates:
            event.skipped = "no member to hit"
            return
        member = self.rng.choice(candidates)
        event.member = member.name
        if kind != "slow" and 3 * (self._out() + 1) >= max(1, self._voters()):
            event.skipped = "a third of the electorate would be out"
            return
        away = self.rng.uniform(self.soak.down_min, self.soak.down_max)
        if kind == "restart":
            await self._restart(member, creator, away)
        elif kind == "replace":
            self._bank(member)
            member.crashed = True
            member.node.crash()
            newcomer = self._add("joiner")
            creator.services.crdt.write(self.run_id, "admit", key=newcomer.node.identity.public_key)
            self.arrivals.append((newcomer.name, "join", trio.current_time()))
            await self._join(newcomer, creator, trio.current_time())
        elif kind == "leave":
            self.away.add(member.name)
            await member.rounds.leave(self.run_id)
            await trio.sleep(away)
            self.away.discard(member.name)
            self.arrivals.append((member.name, "rejoin", trio.current_time()))
            await self._join_again(member)
        else:
            await self._slow_spell(member)
        event.until = trio.current_time()

    async def _partition(self, at: float, creator: train._Member) -> None:
        """Split the members into two halves for `partition_seconds`; then heal, and every member
        dials node 0 again, as a daemon redials its bootstrap peers."""
        await trio.sleep_until(at)
        names = [m.name for m in self.members]
        halves = names[: len(names) // 2], names[len(names) // 2:]
        self.sim.network.partition(*halves)
        event = _Event(at, "partition", member=f"{len(halves[0])} | {len(halves[1])}")
        self.events.append(event)
        await trio.sleep(self.soak.partition_seconds)
        self.sim.network.heal()
        event.until = trio.current_time()
        for member in self.members[1:]:
            if not member.crashed:
                await member.node.connect(creator.node.peer_id, creator.node.listen_addr)

    async def _restart(self, member: train._Member, creator: train._Member, away: float) -> None:
        """kill -9, then the same identity on the same data dir after `away` seconds."""
        self.away.add(member.name)
        self._bank(member)
        member.crashed = True
        member.node.crash()
        await trio.sleep(away)
        member.services, member.compute = self._services(member.node, member.kind)
        await self.sim.restart(member.node)
        await self._start_services(member.node, member.services)
        member.crashed = False
        self.away.discard(member.name)
        self.arrivals.append((member.name, "restart", trio.current_time()))
        await member.node.connect(creator.node.peer_id, creator.node.listen_addr)

    async def _join_again(self, member: train._Member) -> None:
        """`run join` after a leave, tried again every JOIN_RETRY seconds while the run refuses the
        join op for now (a volunteer told "try again later" does so)."""
        while True:
            try:
                await member.rounds.join(self.manifest)
                return
            except RpcError as error:
                self.progress(f"{member.name}: join refused ({error}); trying again in {JOIN_RETRY:g} s")
                await trio.sleep(JOIN_RETRY)

    async def _slow_groups(self, end: float) -> None:
        """Every `slow_every` seconds, a `slow_group` share of the members (the creator aside) trains
        `slow_factor` times slower for `slow_seconds`, all at once."""
        while trio.current_time() + self.soak.slow_every < end:
            await trio.sleep(self.soak.slow_every)
            candidates = [m for m in self.members[1:] if not m.crashed]
            group = self.rng.sample(candidates, min(len(candidates), round(self.soak.slow_group * self.soak.nodes)))
            self.events.append(_Event(trio.current_time(), "slow group", member=f"{len(group)} members",
                                      until=trio.current_time() + self.soak.slow_seconds))
            async with trio.open_nursery() as spells:
                for member in group:
                    spells.start_soon(self._slow_spell, member)

    async def _slow_spell(self, member: train._Member) -> None:
        participation = member.participation(self.run_id)
        if participation is None:
            return
        participant = participation.participant
        cost = participant.cost
        participant.cost = replace(cost, step_seconds=cost.step_seconds * self.soak.slow_factor)
        await trio.sleep(self.soak.slow_seconds)
        participant.cost = cost

    def _voters(self) -> int:
        """The electorate of the round under way, as node 0 sees it."""
        keeper = self._keeper()
        return 0 if keeper is None else len(keeper.replica.chain.tip.electorate)

    def _out(self) -> int:
        """Members of that electorate that are down, gone or left: a crashed member counts until the
        rounds drop it (crdt/membership.py: absence)."""
        keeper = self._keeper()
        if keeper is None:
            return len(self.away)
        electorate = keeper.replica.chain.tip.electorate
        return sum(1 for m in self.members if m.node.identity.public_key in electorate and (m.crashed or m.name in self.away))

    def _bank(self, member: train._Member) -> None:
        node = member.node.node
        if node is not None:
            self.banked[member.name] = self.banked.get(member.name, 0) + node.meter.bytes_in + node.meter.bytes_out

    async def _note_rounds(self) -> None:
        while True:
            await trio.sleep(train.WATCH_SECONDS)
            for member in self.members:
                participation = None if member.crashed else member.participation(self.run_id)
                held = 0 if participation is None else participation.machine.state_round
                if held > 0 and held not in member.done_at:
                    member.done_at[held] = trio.current_time()

    # --- the report -------------------------------------------------------------------------------

    def soak_report(self) -> dict:
        certified_at = self._certified_at()
        rounds = [r for r in sorted(certified_at) if certified_at[r] >= self.first_round_at]
        times = [certified_at[r] - certified_at[r - 1] for r in rounds if r - 1 in certified_at]
        typical = median(times) if times else None
        elapsed = trio.current_time() - self.first_round_at
        # The rounds an undisturbed run certifies between the first certificate and the last; the
        # round in flight at the end is judged apart (`open_s`).
        span = certified_at[rounds[-1]] - certified_at[rounds[0]] if rounds else 0.0
        allowed = 1 + math.floor(span / typical) if typical else len(rounds)
        done = len(rounds)
        open_s = trio.current_time() - certified_at[rounds[-1]] if rounds else elapsed
        slow = [(r, certified_at[r] - certified_at[r - 1]) for r in rounds
                if r - 1 in certified_at and typical and certified_at[r] - certified_at[r - 1] > 2 * typical]
        bans, disagreements = self._honest_bans(), self._disagreements()
        arrivals = self._join_waits(certified_at)
        waits = [wait for _name, _how, _since, wait in arrivals if wait is not None]
        hours = max(elapsed / 3600, 1e-9)
        per_member_hour = sum(self._bytes(m) for m in self.members) / max(1, len(self.members)) / hours
        share = done / allowed if allowed else 0.0
        criteria = [
            criterion("rounds certified: at least 99% of what the median round time allows between the first "
                      "certificate and the last", f"{done} of {allowed}", share >= 0.99),
            criterion("the round in flight at the end: waited at most twice the median", _rounded(open_s),
                      typical is not None and open_s <= 2 * typical),
            criterion("honest members banned: none", bans, bans == 0),
            criterion("rounds whose certified hash differs between two live members: none", disagreements,
                      disagreements == 0),
            criterion("join, rejoin or restart to first contribution: p90 at most 60 virtual seconds",
                      _rounded(percentile(waits, 90)), bool(waits) and percentile(waits, 90) <= 60),
        ]
        happened = [e for e in self.events if not e.skipped]
        overview = (
            f"{self.soak.nodes} simulated members trained one run for {self.soak.hours:g} virtual hours while "
            f"{counted(len(happened), 'churn event')} hit them ({self._kinds_line(happened)}; "
            f"{sum(1 for e in self.events if e.skipped)} skipped). {done} rounds certified of the {allowed} the median "
            f"round time ({_rounded(typical)} s) allows; {counted(len(slow), 'round')} took more than twice the median."
        )
        return {
            "scenario": "soak",
            "overview": overview,
            "verdict": verdict(criteria),
            "config": asdict(self.soak),
            "summary": {
                "seed": self.sim.seed,
                "rounds certified": done,
                "rounds allowed": allowed,
                "median round s": _rounded(typical),
                "rounds over twice the median": len(slow),
                "longest round s": _rounded(max(times, default=None)),
                "round in flight at the end s": _rounded(open_s),
                "honest members banned": bans,
                "join to first contribution p50 s": _rounded(percentile(waits, 50)),
                "join to first contribution p90 s": _rounded(percentile(waits, 90)),
                "bytes per member per hour": round(per_member_hour),
                "loss curve": "not measured: the simulator models training time and trains no model",
                "virtual seconds": round(elapsed, 3),
            },
            "tables": [self._slow_table(slow, certified_at), self._event_table(), self._arrival_table(arrivals)],
            "glossary": glossary({**SOAK_TERMS}),
        }

    def _certified_at(self) -> dict[int, float]:
        """round -> when a member first held it certified."""
        first: dict[int, float] = {}
        for member in self.members:
            for round_number, at in member.done_at.items():
                first[round_number] = min(at, first.get(round_number, math.inf))
        return first

    def _keeper(self):
        return self.members[0].participation(self.run_id)

    def _honest_bans(self) -> int:
        keeper = self._keeper()
        return 0 if keeper is None else len(keeper.replica.state.banned)

    def _disagreements(self) -> int:
        """Rounds for which two live members' run states certify different hashes."""
        seen: dict[int, set[bytes]] = {}
        for member in self.members:
            participation = None if member.crashed else member.participation(self.run_id)
            if participation is not None:
                for round_number, hash_ in participation.replica.state.rounds:
                    seen.setdefault(round_number, set()).add(hash_)
        return sum(1 for hashes in seen.values() if len(hashes) > 1)

    def _join_waits(self, certified_at: dict[int, float]) -> list[tuple[str, str, float, float | None]]:
        """(member, how, when, seconds to its first payload in a certified set) for each join, rejoin
        or restart: to the first round certified after it whose set holds the member (None: none did)."""
        keeper = self._keeper()
        if keeper is None:
            return []
        keys = {m.name: m.node.identity.public_key for m in self.members}
        certificates = keeper.replica.state.certificates
        waits = []
        for name, how, since in self.arrivals:
            accepted = [certified_at[r] for r, c in certificates.items()
                        if r in certified_at and certified_at[r] > since and keys[name] in c.accepted]
            waits.append((name, how, since, min(accepted) - since if accepted else None))
        return waits

    def _bytes(self, member: train._Member) -> int:
        node = member.node.node
        live = 0 if node is None or member.crashed else node.meter.bytes_in + node.meter.bytes_out
        return self.banked.get(member.name, 0) + live

    def _kinds_line(self, events: list[_Event]) -> str:
        kinds = [*EVENTS, *(["slow group"] if any(e.kind == "slow group" for e in events) else [])]
        return ", ".join(f"{sum(1 for e in events if e.kind == kind)} {kind}" for kind in kinds)

    def _slow_table(self, slow: list[tuple[int, float]], certified_at: dict[int, float]) -> dict:
        rows = []
        for round_number, took in slow:
            start, end = certified_at[round_number - 1], certified_at[round_number]
            inside = [f"{e.kind} {e.member}" for e in self.events
                      if not e.skipped and e.at <= end and (e.until or math.inf) >= start]
            rows.append([round_number, _rounded(start - self.first_round_at), _rounded(took), "; ".join(inside) or "none"])
        return table("Rounds over twice the median", ["round", "started at s", "took s", "churn during it"], rows,
                     note="Virtual seconds, from the round before it certified to its own certificate.")

    def _arrival_table(self, arrivals: list[tuple[str, str, float, float | None]]) -> dict:
        rows = [[_rounded(since - self.first_round_at), name, how, _rounded(wait)] for name, how, since, wait in arrivals]
        return table("Joins, rejoins and restarts", ["at s", "member", "how", "to first contribution s"], rows,
                     note="None: no certified round took its payload before the run ended.")

    def _event_table(self) -> dict:
        rows = [[_rounded(e.at - self.first_round_at), e.kind, e.member or "—",
                 _rounded(e.until - e.at) if e.until else None, e.skipped or "—"] for e in self.events]
        return table("Churn events", ["at s", "event", "member", "lasted s", "skipped"], rows)


SOAK_TERMS = {
    "rounds allowed": "the time from the first certificate to the last over the median round time, plus one: "
                      "the rounds an undisturbed run would have certified in that time",
    "restart": "a member killed (kill -9) and started again on its data dir: same identity, same op log",
    "replace": "a member killed for good and a newcomer that joins the run by its ID at once",
    "leave": "a member that leaves the run cleanly and joins again later",
    "slow": "a member whose training runs several times slower for a while",
    "join to first contribution": "from a member's (re)join or restart to the first certified round whose set "
                                  "holds its payload",
}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run(*, nodes: int = 8, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.nodes < 4:
        raise ValueError("need at least 4 members: with 3, one away is a third of them")
    if config.down_max < config.down_min:
        raise ValueError("down_max must be at least down_min")

    async def main(sim: Simulation) -> dict:
        with tempfile.TemporaryDirectory(prefix="locomesh-netsim-") as directory:
            state = _Soak(sim, config, Path(directory), progress)
            await state.soak_run()
            return state.soak_report()

    return run_simulation(seed, main)
