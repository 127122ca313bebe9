"""Plots of a run's rounds as PNG files: for `locomesh run report` (a daemon's record of a real run)
and `locomesh sim ... --report` (a simulated one).

Both sources are first turned into a `Series` (`report_cmd.series_from_status`,
`sim.series_from_report`), so each plot is drawn by one function whatever the run was:

- ``loss_by_round``: eval loss (and train loss) against the round, with the task's floor;
- ``loss_by_bytes``: eval loss against the payload bytes sent so far;
- ``round_timeline``: each round as a bar on a time axis, split into what its time went to;
- ``contributions``: per member, how many certified rounds held its contribution (and its mean
  contribution score, where the run measures scores).

A plot whose data the series lacks (a simulated model has no loss) is not drawn, and `draw` says
why. matplotlib is imported by `draw` only, with the Agg backend (files, no display), so no
command but these pays for it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZE = (7.5, 4.2)  # inches, at DPI: a plot that reads in a markdown preview
DPI = 100
COLOURS = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979")


@dataclass(frozen=True)
class RoundPoint:
    """One finished round, as far as its source knows it."""

    round: int
    eval_loss: float | None = None
    train_loss: float | None = None
    floor: float | None = None  # the task's best achievable loss, where known
    bytes_sent: int = 0  # payload bytes sent for the round (0: none, or not measured)
    start: float | None = None  # when the round began, on the series' time axis (None: not known)
    spans: tuple[tuple[str, float], ...] = ()  # (what, seconds) the round's time went to, in order


@dataclass(frozen=True)
class Series:
    """A run's rounds and members, ready to plot."""

    title: str
    rounds: tuple[RoundPoint, ...]
    time_axis: str  # what `RoundPoint.start` counts, for the timeline's axis label
    bytes_axis: str = "MiB of payloads sent (cumulative)"
    initial_loss: float | None = None  # the eval loss before round 1, where known
    contributions: dict[str, int] = field(default_factory=dict)  # member -> certified rounds that held its payload
    contribution_rounds: int = 0  # the certified rounds those counts are over
    scores: dict[str, float] = field(default_factory=dict)  # member -> its mean contribution score
    no_loss: str = "no round has an eval loss"  # why, when no round has one


Plot = Callable[[Series, Any], "str | None"]  # draws on a matplotlib Figure; why not, if it cannot


def draw(series: Series, directory: Path, prefix: str = "") -> tuple[dict[str, Path], dict[str, str]]:
    """Write every plot `series` has the data for as ``directory/<prefix><name>.png`` (atomically);
    the paths written by plot name, and for each plot not drawn, why not."""
    import matplotlib

    from locomesh.node.files import atomic_write

    matplotlib.use("Agg")  # files only: no display wanted, no GUI toolkit loaded
    from matplotlib.figure import Figure  # not pyplot: no global figure state to leak between plots

    written: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name, (_title, plot) in PLOTS.items():
        figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
        reason = plot(series, figure)
        if reason is not None:
            skipped[name] = reason
            continue
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        written[name] = directory / f"{prefix}{name}.png"
        atomic_write(written[name], buffer.getvalue())
    return written, skipped


def markdown_section(written: dict[str, Path], skipped: dict[str, str], relative_to: Path) -> list[str]:
    """Markdown lines: a "Plots" heading, each written plot as an image linked relative to
    `relative_to` (the markdown file's folder), and why any plot is missing."""
    lines = ["## Plots", ""]
    for name, path in written.items():
        lines += [f"![{PLOTS[name][0]}]({path.relative_to(relative_to).as_posix()})", ""]
    lines += [f"- not drawn: {PLOTS[name][0].lower()}: {reason}" for name, reason in skipped.items()]
    return lines


# --- the plots -----------------------------------------------------------------------------------


def _loss_by_round(series: Series, figure: Any) -> str | None:
    points = [point for point in series.rounds if point.eval_loss is not None]
    if not points:
        return series.no_loss
    axes = figure.subplots()
    start = [] if series.initial_loss is None else [(0, series.initial_loss)]
    evals = start + [(point.round, point.eval_loss) for point in points]
    axes.plot(*zip(*evals), marker="o", color=COLOURS[0], label="eval loss")
    trains = [(point.round, point.train_loss) for point in series.rounds if point.train_loss is not None]
    if trains:
        axes.plot(*zip(*trains), marker=".", linestyle="--", color=COLOURS[1], label="train loss (this node's inner steps)")
    _floor(axes, series)
    axes.set(xlabel="round" if series.initial_loss is None else "round (0: the initial weights)", ylabel="loss",
             title=f"{series.title}: loss by round")
    _whole_numbers(axes.xaxis)
    axes.legend()
    axes.grid(alpha=0.3)
    return None


def _loss_by_bytes(series: Series, figure: Any) -> str | None:
    if not any(point.eval_loss is not None for point in series.rounds):
        return series.no_loss
    if not any(point.bytes_sent for point in series.rounds):
        return "no round recorded payload bytes sent"
    sent, xs, ys = 0, [], []
    if series.initial_loss is not None:
        xs, ys = [0.0], [series.initial_loss]
    for point in series.rounds:
        sent += point.bytes_sent
        if point.eval_loss is not None:
            xs.append(sent / 2**20)
            ys.append(point.eval_loss)
    axes = figure.subplots()
    axes.plot(xs, ys, marker="o", color=COLOURS[0], label="eval loss")
    _floor(axes, series)
    axes.set(xlabel=series.bytes_axis, ylabel="eval loss", title=f"{series.title}: loss by bytes sent")
    axes.legend()
    axes.grid(alpha=0.3)
    return None


def _round_timeline(series: Series, figure: Any) -> str | None:
    timed = [point for point in series.rounds if point.start is not None and point.spans]
    if not timed:
        return "no round has timings (rounds this node only synced have none)"
    axes = figure.subplots()
    colours: dict[str, str] = {}  # what -> its colour; the first bar of each carries the legend's label
    for point in timed:
        left = point.start
        for what, seconds in point.spans:
            label = None if what in colours else what
            colour = colours.setdefault(what, COLOURS[len(colours) % len(COLOURS)])
            axes.barh(point.round, seconds, left=left, height=0.7, color=colour, label=label)
            left += seconds
    axes.margins(x=0.02)
    axes.invert_yaxis()  # round 1 on top, as a timeline reads
    axes.set(xlabel=series.time_axis, ylabel="round", title=f"{series.title}: round timeline")
    _whole_numbers(axes.yaxis)
    figure.legend(loc="outside lower center", ncols=min(4, len(colours)), fontsize="small")  # off the bars
    axes.grid(axis="x", alpha=0.3)
    return None


def _contributions(series: Series, figure: Any) -> str | None:
    if not series.contributions:
        return "no certified round names its contributors here"
    members = sorted(series.contributions)
    panels = figure.subplots(1, 2 if series.scores else 1, squeeze=False)[0]
    panels[0].bar(members, [series.contributions[m] for m in members], color=COLOURS[2])
    panels[0].set(ylabel=f"rounds (of {series.contribution_rounds} certified)", title="payload in the certified set")
    if series.scores:
        scored = [m for m in members if m in series.scores]
        panels[1].bar(scored, [series.scores[m] for m in scored], color=COLOURS[4])
        panels[1].axhline(0.0, color="black", linewidth=0.8)
        panels[1].set(ylabel="loss removed, alone", title="mean contribution score")
    _whole_numbers(panels[0].yaxis)
    for axes in panels:
        axes.tick_params(axis="x", labelrotation=60 if len(members) > 6 else 0, labelsize="small")
    figure.suptitle(f"{series.title}: contributions per member")
    return None


def _whole_numbers(axis: Any) -> None:
    """Ticks on whole numbers only: rounds and counts have no halves."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _floor(axes: Any, series: Series) -> None:
    """The task's floor (the best achievable loss) as a dashed line, where known."""
    floor = next((point.floor for point in reversed(series.rounds) if point.floor is not None), None)
    if floor is not None:
        axes.axhline(floor, linestyle=":", color="black", label=f"floor {floor:.3f}")


PLOTS: dict[str, tuple[str, Plot]] = {
    "loss_by_round": ("Loss by round", _loss_by_round),
    "loss_by_bytes": ("Loss by bytes sent", _loss_by_bytes),
    "round_timeline": ("Round timeline", _round_timeline),
    "contributions": ("Contributions per member", _contributions),
}
