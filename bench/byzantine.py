"""Byzantine robustness: attacks × aggregators × malicious fraction, final eval loss vs the clean run.

Every cell is a full DiLoCo run (int8 + error feedback, the run default) of N workers of which the
last f are Byzantine and omniscient: they skip training and send what their attack computes from
the round's honest pseudo-gradients. Settings: N=8 with f=1 and f=2 (1/8, 1/4), N=9 with f=3 (1/3).

Each attacked run is compared with two clean runs (all N workers honest): the same aggregator with
the same options ("vs_clean"), and the plain mean ("vs_mean").

The adaptive attacks (training/attacks.py) know the aggregator under test, its centre, radius and
options: the inside-the-radius family ("inside_<direction>_<fraction>", and "_opt" with the
fraction searched every round), min_max and min_sum, mimic, and ALIE and IPM with their scale
searched every round ("alie_opt", "ipm_opt"). Their harm adds up over rounds through the outer
momentum, so runs are 12 rounds long and every row keeps its loss curve; the summary shows the
default's curve against its clean run's.

ALIE runs once at the paper's z_max ("alie") and once at every z of `--alie-z` ("alie_z4", ...):
the omniscient attacker also picks its scale, and the report gives, per aggregator, the z that hurt
most ("alie worst z"). Why: z_max hides the attackers inside the honest spread, which in this
setting (6 rounds of a small order-1 task) moves the plain mean by less than its own noise (see
training/attacks.py), so z_max alone leaves every aggregator, the mean included, close to clean
(docs/measurements.md). ByzFL's optimal ALIE searches the scale per round against the
aggregator (Allouah et al. 2023); here one z is held for a whole run and the grid is searched on
the final loss instead.

Targets: centered_clip (the default) within 1% of its clean run under every attack, every ALIE z
included, at f/N ≤ 1/4 and within 2% at 1/3; clean centered_clip within 0.5% of clean mean; the
mean visibly fails under sign_flip_x100 and under ALIE at its worst z, "visibly" meaning worse than
the default's tolerance at that f/N (the mean would miss the target the default meets).

    .venv/bin/python bench/byzantine.py            # the full grid (its run time: docs/measurements.md)
    .venv/bin/python bench/byzantine.py --quick    # two attacks, two aggregators, one setting
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, markdown_table, report

from locomesh.training import attacks
from locomesh.training.aggregators import AggregatorError
from locomesh.training.simulation import DiLoCoConfig, simulate_diloco
from locomesh.training.inner import InnerConfig
from locomesh.training.scoring import ScoringConfig
from locomesh.training.tasks import get_task

ATTACKS = ["sign_flip", "sign_flip_x100", "gaussian", "alie", "ipm", "nan", "inf", "zero", "replay",
           "inside_random_0.5", "inside_random_0.95", "inside_random_opt", "inside_against_0.95",
           "inside_against_opt", "inside_orthogonal_0.95", "inside_orthogonal_opt",
           "evade_scores_random", "evade_scores_against", "min_max", "min_sum", "mimic", "alie_opt", "ipm_opt"]
AGGREGATORS = ["mean", "coordinate_median", "trimmed_mean", "geometric_median", "krum", "centered_clip"]
SETTINGS = [(8, 1), (8, 2), (9, 3)]  # (N, f)
# A small model on a first-order chain: it learns in a few hundred steps, so the grid stays cheap.
TASK = {"alphabet": 16, "order": 1, "context": 32, "n_layer": 1, "n_head": 2, "d_model": 32,
        "eval_sequences": 512}
DEFAULT = "centered_clip"
# What an aggregator label's "+<lever>" adds to the run: "pm" the momentum aggregated per peer
# (training/outer.py), "score" contribution scores leaving out the low ones (below half the median;
# "score75": below 0.75 of it), "rep" leaving out authors whose relative scores of their last 4
# rounds average below 0.9 ("reputation"), "wscore" shrinking each contribution by its score over
# the median (training/scoring.py).
LEVERS = {"pm": {"peer_momentum": True}, "score": {"scoring": ScoringConfig(policy="exclude")},
          "score75": {"scoring": ScoringConfig(policy="exclude", keep_ratio=0.75)},
          "rep": {"scoring": ScoringConfig(policy="reputation", keep_ratio=0.9)},
          "wscore": {"scoring": ScoringConfig(policy="weight")}}
ALIE_Z = [1, 2, 4, 8, 16, 32, 64]  # the omniscient attacker's choices of z besides the paper's z_max
TARGET_PERCENT = {True: 1.0, False: 2.0}  # keyed by f/N <= 1/4
CURVE_POINTS = 4  # rounds shown per curve in the summary (evenly spaced, the last included)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=1,
                        help="runs per cell (model and data seeds 0..N-1), losses averaged round by round; "
                             "one run moves by about ±1%% between settings that should not matter")
    parser.add_argument("--inner-steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inner-lr", type=float, default=1e-2)
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--alie-z", default=",".join(map(str, ALIE_Z)),
                        help="z values run besides z_max whenever alie is among the attacks ('' for none)")
    parser.add_argument("--aggregators", default=",".join(AGGREGATORS))
    parser.add_argument("--exchange", choices=["allgather", "sharded", "both"], default="allgather",
                        help="both: every cell in each mode, back to back, with sharded's loss over allgather's")
    parser.add_argument("--shard-values", type=int, default=2048,
                        help="values per shard in sharded exchange (the 14K-parameter model: 7 shards)")
    parser.add_argument("--settings", default=",".join(f"{n}/{f}" for n, f in SETTINGS), help="N/f,...")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.inner_steps = 4, 10
        args.attacks, args.aggregators, args.settings = "sign_flip_x100,alie", "mean,centered_clip", "8/2"
    return args


def aggregator_options(name: str, workers: int, byzantine: int) -> dict:
    """What the run's manifest would say for an expected f Byzantine workers out of N."""
    name = name.split("+")[0]
    if name == "krum":
        return {"f": byzantine}
    if name == "trimmed_mean":
        return {"beta": byzantine / workers}
    return {}


class Grid:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.task = get_task("synthetic-lm", TASK)
        self.clean_cache: dict[tuple, Curve] = {}

    def config(self, workers: int, aggregator: str, options: dict, exchange: str, seed: int) -> DiLoCoConfig:
        """An aggregator label may carry levers after "+" (`LEVERS`): "centered_clip+pm+score"."""
        name, *levers = aggregator.split("+")
        inner = InnerConfig(lr=self.args.inner_lr, batch_size=self.args.batch)
        return DiLoCoConfig(
            workers=workers, rounds=self.args.rounds, inner_steps=self.args.inner_steps,
            inner=inner, codec="int8", error_feedback=True,
            aggregator=name, aggregator_options=options,
            exchange=exchange, shard_values=self.args.shard_values, model_seed=seed, run_seed=seed,
            **{key: value for lever in levers for key, value in LEVERS[lever].items()},
        )

    def run(self, workers: int, aggregator: str, options: dict, byzantine: Callable[[], dict],
            exchange: str | None = None) -> Curve:
        """The eval loss after every round, averaged over the seeds (`byzantine()` makes each seed's
        attackers afresh: some attacks keep state), or the error that ended a run."""
        exchange = exchange or self.args.exchange.replace("both", "allgather")
        curves = []
        for seed in range(self.args.seeds):
            try:
                result = simulate_diloco(self.task, self.config(workers, aggregator, options, exchange, seed), byzantine())
            except AggregatorError as error:  # e.g. Krum left with too few accepted contributions
                return f"error: {error}"
            except attacks.AttackNotApplicable:  # e.g. evading scores where nothing scores
                return "n/a"
            curves.append([record.eval_loss for record in result.history])
        return [sum(losses) / len(losses) for losses in zip(*curves)]

    def clean(self, workers: int, aggregator: str, options: dict, exchange: str | None = None) -> Curve:
        key = (workers, aggregator, tuple(sorted(options.items())), exchange)
        if key not in self.clean_cache:
            self.clean_cache[key] = self.run(workers, aggregator, options, dict, exchange)
        return self.clean_cache[key]


Curve = list[float] | str  # eval loss per round, or an error


def final(curve: Curve) -> float | str:
    return curve[-1] if isinstance(curve, list) else curve


def alie_grid(args: argparse.Namespace) -> list[float]:
    return [float(z) for z in args.alie_z.split(",") if z.strip()]


def attack_labels(args: argparse.Namespace) -> list[str]:
    """The attacks to run, in order, with the ALIE z grid ("alie_z<z>") right after "alie"."""
    labels = []
    for name in args.attacks.split(","):
        labels.append(name)
        if name == "alie":
            labels += [f"alie_z{z:g}" for z in alie_grid(args)]
    return labels


def attack_for(label: str) -> attacks.Attack:
    """The attack a row label names: a key of attacks.ATTACKS, or "alie_z<z>" for ALIE at a fixed z."""
    if label.startswith("alie_z"):
        return attacks.alie(float(label.removeprefix("alie_z")))
    return attacks.get_attack(label)


def ratio(loss: float | str, reference: float | str) -> float | str:
    """loss / reference, or "n/a" when either run ended in an error (a string)."""
    return loss / reference if isinstance(loss, float) and isinstance(reference, float) else "n/a"


def shown(value: float | str, spec: str) -> str:
    """A float formatted with `spec`; anything else (an "n/a" cell) as it is."""
    return format(value, spec) if isinstance(value, float) else str(value)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    grid = Grid(args)
    settings = [tuple(int(x) for x in item.split("/")) for item in args.settings.split(",")]
    rows = []
    started = time.process_time()
    for workers, f in settings:
        clean_mean = grid.clean(workers, "mean", {})
        for aggregator in args.aggregators.split(","):
            options = aggregator_options(aggregator, workers, f)
            clean = grid.clean(workers, aggregator, options)
            rows.append(cell(workers, f, "none", aggregator, clean, clean, clean_mean))
            if args.exchange == "both":
                add_sharded(rows[-1], grid.clean(workers, aggregator, options, "sharded"))
            for attack in attack_labels(args):
                byzantine = lambda attack=attack: {workers - 1 - i: attack_for(attack) for i in range(f)}  # noqa: E731
                curve = grid.run(workers, aggregator, options, byzantine)
                rows.append(cell(workers, f, attack, aggregator, curve, clean, clean_mean))
                if args.exchange == "both":
                    add_sharded(rows[-1], grid.run(workers, aggregator, options, byzantine, "sharded"))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress, one row a line
    meta = {
        **machine(),
        "task": {"name": "synthetic-lm", **TASK},
        "floor": grid.task.floor(),
        "rounds": args.rounds,
        "seeds": args.seeds,
        "inner_steps": args.inner_steps,
        "batch": args.batch,
        "inner_lr": args.inner_lr,
        "codec": "int8 + error feedback",
        "outer": "Nesterov lr 0.7 momentum 0.9",
        "byzantine_workers": "the last f indices; omniscient and colluding",
        "alie_z_max": {f"{n}/{f}": round(attacks.alie_z(n, f), 3) for n, f in settings},
        "alie_z_grid": alie_grid(args),
        "cpu_seconds": round(time.process_time() - started, 1),
        "cpu": "2 cores shared with other jobs",
        "quick": args.quick,
        "exchange": args.exchange,
        "shard_values": args.shard_values,
    }
    report("byzantine", rows, meta)
    print()
    print(summary(rows))


def cell(workers, f, attack, aggregator, curve: Curve, clean: Curve, clean_mean: Curve) -> dict:
    """One run's row: its final loss against the clean runs', and its curve against its clean one."""
    return {
        "N": workers,
        "f": f,
        "attack": attack,
        "aggregator": aggregator,
        "loss": final(curve),
        "vs_clean": ratio(final(curve), final(clean)),
        "vs_mean": ratio(final(curve), final(clean_mean)),
        "curve": [round(loss, 5) for loss in curve] if isinstance(curve, list) else curve,
        "curve_vs_clean": ([round(ratio(a, b), 5) for a, b in zip(curve, clean)]
                           if isinstance(curve, list) and isinstance(clean, list) else "n/a"),
    }


def add_sharded(row: dict, curve: Curve) -> None:
    """The same cell in sharded exchange (where "loss" is allgather's): its loss and the ratio."""
    row["sharded_loss"] = final(curve)
    row["sharded_vs_allgather"] = ratio(final(curve), row["loss"])


def summary(rows: list[dict]) -> str:
    """Per setting, attack × aggregator: % above the same aggregator's clean run; then the targets."""
    lines = []
    for workers, f in settings_of(rows):
        table = {}
        for row in rows_of(rows, workers, f):
            value = row["vs_clean"] if row["attack"] != "none" else row["vs_mean"]
            table.setdefault(row["attack"], {"attack (none: vs mean)": row["attack"]})[row["aggregator"]] = percent(value)
        table["alie worst z"] = {"attack (none: vs mean)": "alie worst z"}
        for aggregator in dict.fromkeys(row["aggregator"] for row in rows):
            row = worst(alie_rows(rows_of(rows, workers, f, aggregator)))
            table["alie worst z"][aggregator] = "n/a" if row is None else f"{percent(row['vs_clean'])} ({z_of(row)})"
        lines += [f"N={workers}, f={f}: loss vs the same aggregator's clean run", "",
                  markdown_table(list(table.values())), ""]
    lines += curves(rows) + targets(rows) + exchange_targets(rows)
    return "\n".join(lines)


def curves(rows: list[dict]) -> list[str]:
    """Per setting, the default's (and each of its lever variants') loss against its clean run's at
    a few rounds, worst attacks first: harm that grows round by round shows here before the end."""
    lines = []
    for workers, f in settings_of(rows):
        for label in default_labels(rows):
            attacked = [r for r in rows_of(rows, workers, f, label) if r["attack"] != "none" and isinstance(r["curve"], list)]
            if not attacked:
                continue
            rounds = len(attacked[0]["curve"])
            shown_rounds = sorted({max(1, round(rounds * (k + 1) / CURVE_POINTS)) for k in range(CURVE_POINTS)})
            table = []
            for r in sorted(attacked, key=lambda r: -r["vs_clean"] if isinstance(r["vs_clean"], float) else 0.0):
                entry = {"attack": r["attack"]}
                entry.update({f"round {k}": percent(r["curve_vs_clean"][k - 1]) for k in shown_rounds})
                table.append(entry)
            lines += [f"N={workers}, f={f}: {label} vs its clean run, by round", "", markdown_table(table), ""]
    return lines


def default_labels(rows: list[dict]) -> list[str]:
    """The default aggregator's labels in the rows: itself and with levers ("centered_clip+score")."""
    return list(dict.fromkeys(r["aggregator"] for r in rows if r["aggregator"].split("+")[0] == DEFAULT))


def exchange_targets(rows: list[dict]) -> list[str]:
    """With --exchange both: the cell where sharded exchange lost most against allgather, per
    setting (target: final loss within 0.5%)."""
    out = []
    for workers, f in settings_of(rows):
        compared = [r for r in rows_of(rows, workers, f) if isinstance(r.get("sharded_vs_allgather"), float)]
        if compared:
            top = max(compared, key=lambda r: r["sharded_vs_allgather"])
            met = top["sharded_vs_allgather"] <= 1.005
            out.append(f"- N={workers} f={f}: sharded vs allgather, worst {top['aggregator']} / {top['attack']}: "
                       f"{top['sharded_vs_allgather']:.4f}x (target ≤ 1.005): {'met' if met else 'MISSED'}")
    return out


def targets(rows: list[dict]) -> list[str]:
    """One line per target of the issue, with the numbers and met / MISSED, for the default and
    each of its lever variants."""
    out = []
    for workers, f in settings_of(rows):
        limit = 1 + TARGET_PERCENT[f / workers <= 0.25] / 100
        for label in default_labels(rows):
            attacked = [r for r in rows_of(rows, workers, f, label) if r["attack"] != "none" and r["loss"] != "n/a"]
            if attacked:
                met = all(isinstance(r["vs_clean"], float) and r["vs_clean"] <= limit for r in attacked)
                top = worst(attacked) or attacked[0]
                out.append(f"- N={workers} f={f}: {label} worst {top['attack']} {shown(top['vs_clean'], '.4f')}x "
                           f"clean (target ≤ {limit}): {'met' if met else 'MISSED'}")
            for r in rows_of(rows, workers, f, label):
                if r["attack"] == "none":
                    met = isinstance(r["vs_mean"], float) and r["vs_mean"] <= 1.005
                    out.append(f"- N={workers}: clean {label} {shown(r['vs_mean'], '.4f')}x clean mean (target ≤ 1.005): "
                               f"{'met' if met else 'MISSED'}")
        out += mean_failures(rows_of(rows, workers, f, "mean"), workers, f, limit)
    return out


def mean_failures(cells: list[dict], workers: int, f: int, limit: float) -> list[str]:
    """Whether the plain mean visibly fails (worse than the default's tolerance `limit`) under
    sign_flip_x100, ALIE at z_max and ALIE at its worst z: the evidence that the attacks are live."""
    shown_rows = [r for r in cells if r["attack"] in ("sign_flip_x100", "alie")]
    top = worst(alie_rows(cells))
    if top is not None and top["attack"] != "alie":
        shown_rows.append(top)
    return [f"- N={workers} f={f}: mean under {r['attack']}: {shown(r['vs_clean'], '.3f')}x clean: "
            f"{'visibly fails' if isinstance(r['vs_clean'], float) and r['vs_clean'] > limit else 'does NOT visibly fail'}"
            f" (visibly: > {limit}, the default's tolerance)" for r in shown_rows]


def settings_of(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted({(row["N"], row["f"]) for row in rows})


def rows_of(rows: list[dict], workers: int, f: int, aggregator: str | None = None) -> list[dict]:
    return [r for r in rows if (r["N"], r["f"]) == (workers, f) and aggregator in (None, r["aggregator"])]


def alie_rows(cells: list[dict]) -> list[dict]:
    return [r for r in cells if r["attack"] == "alie" or r["attack"].startswith("alie_z")]


def worst(cells: list[dict]) -> dict | None:
    """The row with the largest vs_clean; rows that ended in an error ("n/a") do not count."""
    finite = [r for r in cells if isinstance(r["vs_clean"], float)]
    return max(finite, key=lambda r: r["vs_clean"]) if finite else None


def z_of(row: dict) -> str:
    return "z_max" if row["attack"] == "alie" else "z=" + row["attack"].removeprefix("alie_z")


def percent(value: float | str) -> str:
    return f"{100 * (value - 1):+.1f}%" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
