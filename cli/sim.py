"""`locomesh sim SCENARIO`: run a network simulation in virtual time and write its report.

Progress goes to stderr; the report is written as JSON (``--report FILE``,
default ``netsim-SCENARIO-SEED.json``) and markdown (same name, ``.md``),
and the markdown is printed. A scenario with rounds (``train``) also gets the
plots of `locomesh run report` (`plots`: round timeline, contributions per
member; a simulated model has no loss to plot) as PNG files beside the report
(``STEM-round_timeline.png``, ``STEM-contributions.png``, STEM being the report's
name without ``.json``), linked from its markdown, with or without ``--report``. ``-o KEY=VALUE``
sets a field of the scenario's ``Config`` (e.g. ``-o byzantine=3 -o churn=2`` for
``train``); ``sim --help`` lists every scenario with its options, defaults and what each
sets (from the ``Config`` fields' help), ``sim SCENARIO --help`` that scenario's only.

Every report starts with a plain overview and a verdict, PASS or FAIL, with the criteria it was
judged by (`locomesh.netsim.report`). Exit codes: 0 PASS, 1 FAIL, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from .plots import RoundPoint, Series, draw, markdown_section


class _ScenarioHelp(argparse.Action):
    """``-h``: the usage and flags, then every scenario (or the one named before ``-h``) with its options.

    The scenarios' text is built only when asked for: importing them loads torch and libp2p, which
    every other `locomesh` command would otherwise pay for at start."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from locomesh.netsim.scenarios import SCENARIOS

        named = getattr(namespace, "scenario", None)
        parser.epilog = scenarios_text(named if named in SCENARIOS else None)
        parser.print_help()
        parser.exit()


def scenarios_text(only: str | None = None) -> str:
    """The scenarios (or `only` that one), each with what it shows and its ``-o`` options, defaults
    and help; then the exit codes."""
    from locomesh.netsim.scenarios import SCENARIOS, scenario_help

    lines = ["scenarios and their options (-o KEY=VALUE, default shown):"]
    for name in [only] if only else SCENARIOS:
        lines += ["", *scenario_help(name)]
    lines += ["", "Every report starts with what was simulated, what came out, and a verdict: PASS or FAIL with",
              "the criteria it was judged by. Exit codes: 0 PASS, 1 FAIL, 2 bad arguments."]
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sim", help="run a network simulation (real node code, virtual time)",
                                   add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   description="Run a network simulation of the real node code in virtual time;\n"
                                               "print its report and write it as JSON and markdown.")
    parser.add_argument("-h", "--help", action=_ScenarioHelp,
                        help="show this help, every scenario's options (after a SCENARIO: its own), and exit")
    parser.add_argument("scenario", help="scenario name (listed below, with its options)")
    parser.add_argument("--nodes", type=int, default=100, help="number of nodes, bootstrap/seed nodes included")
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same report")
    parser.add_argument("--report", help="where to write the JSON report (markdown goes beside it)")
    parser.add_argument("--verbose", action="store_true", help="show py-libp2p's own log lines")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario option, e.g. -o byzantine=3 -o churn=2 -o delayed_updates=true for train "
                             "(repeatable; an unknown key lists the scenario's options and defaults)")
    parser.add_argument("--seeds", type=int, help="nat: run seeds SEED .. SEED+N-1, pooled in one report (-o seeds=N)")
    parser.add_argument("--topology", help="nat: homes (default) or cgnat (-o topology=NAME)")
    parser.set_defaults(handler=run_sim)


def _shorthands(args: argparse.Namespace) -> list[str]:
    """`--seeds` and `--topology` as the options of scenario nat they stand for; ValueError for another scenario
    (`dht`'s own option ``seeds`` counts seed nodes)."""
    given = [f"{key}={value}" for key in ("seeds", "topology") if (value := getattr(args, key, None)) is not None]
    if given and args.scenario != "nat":
        raise ValueError("--seeds and --topology are options of scenario nat")
    return given


def run_sim(args: argparse.Namespace) -> int:
    from locomesh.netsim import report as reports
    from locomesh.netsim.scenarios import SCENARIOS, UnknownOption, parse_options, scenario_help

    scenario = SCENARIOS.get(args.scenario)
    if scenario is None:
        print(f"locomesh sim: no scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    if args.nodes < 3:
        print("locomesh sim: --nodes must be at least 3", file=sys.stderr)
        return 2
    try:
        options = parse_options(args.scenario, args.option + _shorthands(args))
    except UnknownOption as error:
        print(f"locomesh sim: scenario {error.scenario!r} has no option {error.key!r}; its options (defaults):",
              file=sys.stderr)
        print("\n".join(scenario_help(args.scenario)), file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"locomesh sim: {error}", file=sys.stderr)
        return 2
    if not args.verbose:
        # py-libp2p logs each failed dial, at ERROR, and the report counts them: shown with --verbose only.
        logging.disable(logging.ERROR)
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s wall] {line}", file=sys.stderr, flush=True)

    try:
        result = scenario(nodes=args.nodes, seed=args.seed, progress=progress, **options)
    except ValueError as error:
        print(f"locomesh sim: {error}", file=sys.stderr)
        return 2
    path = Path(args.report or f"netsim-{args.scenario}-{args.seed}.json")
    appendix, plotted = draw_plots(result, path)
    written = reports.write(result, path, appendix) + plotted
    print(reports.to_markdown(result, appendix))
    hashseed = os.environ.get("PYTHONHASHSEED", "random")
    progress(f"wrote {', '.join(map(str, written))} (PYTHONHASHSEED={hashseed})")
    passed = reports.passed(result)
    progress(f"verdict: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


def draw_plots(report: dict[str, Any], path: Path) -> tuple[list[str], list[Path]]:
    """Draw the plots of a scenario with rounds beside its report at `path` (``STEM-NAME.png``); the
    markdown lines that link them and the files written, none for a scenario without rounds."""
    series = series_from_report(report)
    if series is None:
        return [], []
    written, skipped = draw(series, path.parent, prefix=f"{path.stem}-")
    return markdown_section(written, skipped, path.parent), list(written.values())


def series_from_report(report: dict[str, Any]) -> Series | None:
    """A scenario report with a "Rounds" table (`train`) as a plot `Series`: each round from the
    certificate of the round before (round 1: from the run's creation) until the first node, then
    the last, held it certified, in virtual seconds; each node's payloads in certified sets (the
    "Contributions" table). None for a scenario without rounds."""
    from locomesh.netsim.report import table_rows

    rows = table_rows(report, "Rounds")
    if rows is None:
        return None
    points, previous = [], 0.0
    for row in rows:
        first, last = row["certified at s"], row["last node at s"]
        spans = () if first is None else (("until the first node held it certified", first - previous),
                                          ("until the last node did", last - first))
        points.append(RoundPoint(round=row["round"], start=previous if spans else None, spans=spans))
        previous = first if first is not None else previous
    contributions = {row["node"]: row["in certified set"] for row in table_rows(report, "Contributions") or []}
    return Series(title=f"netsim {report['scenario']}", rounds=tuple(points),
                  time_axis="virtual seconds since the run's creation", contributions=contributions,
                  contribution_rounds=sum(1 for point in points if point.spans),
                  no_loss="the simulator models training time: it trains no model, so there is no loss")
