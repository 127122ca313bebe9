"""The `train` scenario's report: the run's overview, its verdict and the tables of rounds, nodes and
contributions, read off the nodes' histories (`TrainReporting`, which `train._Run` inherits, as
the round machine inherits its replay handlers)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict
from typing import Any

import trio

from locomesh.crdt.scores import accepted_counts

from ..report import counted, criterion, glossary, percentile, table, verdict
from . import glossaries

MEGABIT = 1_000_000 / 8
HOSTILE = frozenset({"byzantine", "withholding", "liar"})  # members whose payloads or service are hostile


class TrainReporting:
    """The report of `train._Run` (which sets `sim`, `config`, `members`, `intruders`, `run_id`, `started`)."""

    def _records(self, round_number: int, *, honest_only: bool = False) -> list:
        """The history records of `round_number` on every member (`honest_only`: on honest members)."""
        records = []
        for member in self.members:
            if honest_only and member.kind in HOSTILE:
                continue
            participation = member.participation(self.run_id)
            if participation is not None:
                records += [r for r in participation.history if r.round == round_number]
        return records

    def final_hashes(self) -> dict[str, str]:
        """The state hash each live node holds at the end."""
        hashes = {}
        for member in self.members:
            participation = member.participation(self.run_id)
            if not member.crashed and participation is not None:
                hashes[member.name] = (participation.machine.state_hash or b"").hex()
        return hashes

    def report(self) -> dict:
        return {
            "scenario": "train",
            "overview": self._overview(),
            "verdict": verdict(self._criteria()),
            "config": asdict(self.config),
            "summary": self._summary(),
            "tables": [self._round_table(), self._node_table(), self._contribution_table()],
            "glossary": glossary(glossaries.TRAIN),
        }

    def _certified_rounds(self) -> int:
        return sum(1 for r in range(1, self.config.rounds + 1) if any(r in m.done_at for m in self.members))

    def _hostile(self) -> str:
        """The hostile members and keys of the run, in words ("" when none)."""
        config = self.config
        counts = {"byzantine": config.byzantine, "withholding": config.withholding, "liar": config.liars,
                  "sybil": config.sybils,
                  "bomber": config.bombers, "spammer": config.spammers}
        return ", ".join(f"{count} {name}" for name, count in counts.items() if count)

    def _overview(self) -> str:
        config = self.config
        live = [m for m in self.members if not m.crashed]
        extras = [f"hostile: {self._hostile()}"] if self._hostile() else []
        waves = f" every {config.churn_every} rounds" if config.churn_every else ""
        extras += [f"{config.churn} crashed and replaced{waves}"] if config.churn else []
        extras += [f"{config.slow} slow"] if config.slow else []
        shares = self._shares()
        return (
            f"{config.nodes} simulated nodes trained one run together for {counted(config.rounds, 'round')} with the "
            "daemon's real round protocol" + (f" ({'; '.join(extras)})" if extras else "")
            + f"; training is modelled as {config.inner_steps} steps of {config.step_seconds:g} virtual seconds per "
            f"round, and each node's update is {config.payload_bytes} bytes. "
            f"{self._certified_rounds()} of {counted(config.rounds, 'round')} certified, and "
            f"{sum(1 for m in live if config.rounds in m.done_at)} of {len(live)} live nodes reached the last one "
            f"after {trio.current_time() - self.started:.0f} virtual seconds"
            + (f"; the median node spent {percentile(shares, 50):.0%} of its time training." if shares else ".")
        )

    def _criteria(self) -> list[dict]:
        config = self.config
        live = [m for m in self.members if not m.crashed]
        reached = sum(1 for m in live if config.rounds in m.done_at)
        hashes = self.final_hashes()
        held = [hashes.get(m.name) or "" for m in live if m.kind not in HOSTILE]  # "": no state yet
        states, without = {h for h in held if h}, held.count("")
        holding = counted(len(states), "distinct state") + (f", {counted(without, 'node')} with none" if without else "")
        computed = sum(1 for r in range(1, config.rounds + 1)
                       if any(not record.synced for record in self._records(r, honest_only=True)))
        despite = f" despite the hostile nodes ({self._hostile()})" if self._hostile() else ""
        return [
            criterion(f"every round was certified{despite}", f"{self._certified_rounds()} of {config.rounds}",
                      self._certified_rounds() == config.rounds),
            criterion("every live node reached the last round", f"{reached} of {len(live)}", reached == len(live)),
            criterion("the live honest nodes hold one and the same model state", holding,
                      len(states) == 1 and not without),
            criterion("each round's certified state is one an honest node computed itself (no state was imposed "
                      "by hostile votes)", f"{computed} of {config.rounds} rounds", computed == config.rounds),
        ]

    def _shares(self) -> list[float]:
        return [share for member in self.members if (share := self._share(member)) is not None]

    def _share(self, member: Any) -> float | None:
        """Training that went into the payloads the node committed in rounds 1..`rounds`, over the
        virtual seconds from its first training to the last round. Training thrown away before its
        commit (stopped for a replay or a sync; with delayed updates, a round trained ahead whose
        base was lost) is not counted, nor the next round trained ahead when the last one ends."""
        participation = member.participation(self.run_id)
        if (member.crashed or participation is None or self.config.rounds not in member.done_at
                or member.compute.first_train_at is None):
            return None
        start, end = member.compute.first_train_at, member.done_at[self.config.rounds]
        used = sum(record.train_seconds or 0.0 for record in participation.history
                   if record.round <= self.config.rounds)
        return used / (end - start) if end > start else None

    def _summary(self) -> dict:
        config = self.config
        shares = self._shares()
        hashes = self.final_hashes()
        honest_hashes = {h for m in self.members if m.kind not in HOSTILE and (h := hashes.get(m.name))}
        return {
            "seed": self.sim.seed,
            "nodes": config.nodes,
            "link": f"{config.uplink / MEGABIT:g} Mbit/s up, {config.downlink / MEGABIT:g} down, "
                    f"{config.latency * 1000:g} ms one way",
            "stands for": (f"a model of {config.payload_bytes} parameters (int8 payload of {config.payload_bytes} bytes), "
                           f"{config.inner_steps} inner steps of {config.step_seconds:g} s per round"),
            "nodes that reached the last round": sum(1 for m in self.members if config.rounds in m.done_at),
            "live nodes holding the same state": len(hashes) if len(honest_hashes) == 1 else 0,
            "compute share min": _rounded(min(shares, default=None)),
            "compute share p50": _rounded(percentile(shares, 50)),
            "target": "compute share >= 0.95" if config.delayed_updates else "compute share >= 0.9",
            "virtual seconds": round(trio.current_time() - self.started, 3),
        }

    def _round_table(self) -> dict:
        rows, previous = [], None
        for r in range(1, self.config.rounds + 1):
            times = [m.done_at[r] - self.started for m in self.members if r in m.done_at]
            records = self._records(r)
            computed = [record for record in records if not record.synced]
            contributors = Counter(record.contributors for record in computed).most_common(1)
            exchange = Counter((record.exchange or {}).get("mode", "allgather") for record in computed).most_common(1)
            fetched = [record.bytes_fetched for record in computed if record.bytes_fetched is not None]
            first = min(times, default=None)
            rows.append([
                r, _rounded(first), _rounded(max(times, default=None)),
                _rounded(None if first is None or previous is None else first - previous),
                contributors[0][0] if contributors else None, sum(1 for record in records if record.synced),
                exchange[0][0] if exchange else None, _rounded(statistics.median(fetched) / 1024) if fetched else None,
                len(times),
            ])
            previous = first
        return table(
            "Rounds",
            ["round", "certified at s", "last node at s", "round time s", "contributors", "splits (synced)", "exchange",
             "down KiB p50", "nodes done"],
            rows,
            note="Virtual seconds from the run's creation until the first (last) node held the round's certified state. "
                 "Contributors: payloads combined by the nodes that computed the round. Splits (synced): nodes that "
                 "finished the round by downloading the certified state instead of computing it (see the glossary). "
                 "Exchange: allgather or sharded (node/exchange/mode.py). Down: payload bytes (shards and shard "
                 "results in sharded exchange) a node that computed the round downloaded, median over nodes.",
        )

    def _node_table(self) -> dict:
        rows = []
        for member in self.members:
            share = self._share(member)
            participation = member.participation(self.run_id)
            synced = sum(1 for r in (participation or _Empty()).history if r.synced)
            banned = participation is not None and participation.banned is not None
            rows.append([member.name, member.kind, "crashed" if member.crashed else "up", len(member.done_at), synced,
                         round(member.compute.seconds_between(0.0, trio.current_time()), 3), _rounded(share),
                         round(self._held_bytes(member) / 1024, 1), banned])
        return table(
            "Nodes",
            ["node", "kind", "end", "rounds done", "synced", "compute s", "compute share", "held KiB", "banned"],
            rows,
            note="Compute s: all modelled training, thrown-away rounds included. Compute share: the training "
                 "of the payloads the node committed in the run's rounds over the virtual seconds from its "
                 "first training to the last round. Held: what the node keeps of the run that peers sent or "
                 "made it keep (CRDT ops applied and waiting, checkpoint store files, payloads held in memory). "
                 "Banned: the run banned the node (evidence of an equivocation, or a disputed shard result).",
        )

    def _contribution_table(self) -> dict:
        """Per node (intruders too), how many certified rounds' certified sets held its payload, in the run state of
        the first live honest member (certificates are the same on every honest peer)."""
        keeper = next((p for m in self.members if not m.crashed and m.kind not in HOSTILE
                       and (p := m.participation(self.run_id)) is not None), None)
        state = None if keeper is None else keeper.replica.state
        counts = {} if state is None else accepted_counts(state, last=state.round)
        everyone = [(m.name, m.kind, m.node.identity.public_key) for m in self.members]
        everyone += [(x.node.name, x.kind, x.node.identity.public_key) for x in self.intruders]
        return table(
            "Contributions",
            ["node", "kind", "in certified set"],
            [[name, kind, counts.get(key, 0)] for name, kind, key in everyone],
            note=f"Certified rounds (of {0 if state is None else state.round}) whose certified set holds the node's "
                 "payload: the set the round agreed to aggregate, before the aggregation leaves out invalid payloads.",
        )

    def _held_bytes(self, member: Any) -> int:
        replica = member.services.crdt.replicas.get(self.run_id)
        ops = 0 if replica is None else sum(len(replica.get(op) or b"") for op in replica.op_ids()) + replica.pending.bytes
        checkpoints = member.services.checkpoints
        files = sum(path.stat().st_size for path in checkpoints.directory.rglob("*") if path.is_file())
        return ops + files + checkpoints.held.bytes_held


class _Empty:
    history: tuple = ()


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
