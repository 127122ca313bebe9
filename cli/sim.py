"""`locomesh sim SCENARIO`: run a network simulation in virtual time and write its report.

Progress goes to stderr; the report is written as JSON (``--report FILE``,
default ``netsim-SCENARIO-SEED.json``) and markdown (same name, ``.md``),
and the markdown is printed. ``-o KEY=VALUE`` sets a field of the scenario's
``Config`` (e.g. ``-o byzantine=3 -o churn=2`` for ``train``). Exit codes: 0 done, 2 bad arguments.
No plot is drawn: matplotlib is not a dependency.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sim", help="run a network simulation (real node code, virtual time)")
    parser.add_argument("scenario", help="scenario name (connectivity, dht, checkpoint, train, nat)")
    parser.add_argument("--nodes", type=int, default=100, help="number of nodes, bootstrap/seed nodes included")
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same report")
    parser.add_argument("--report", help="where to write the JSON report (markdown goes beside it)")
    parser.add_argument("--verbose", action="store_true", help="show py-libp2p's own log lines")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario option, e.g. -o byzantine=3 -o churn=2 -o delayed_updates=true for train "
                             "(repeatable; an unknown key lists the scenario's options and defaults)")
    parser.set_defaults(handler=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    from locomesh.netsim import report as reports
    from locomesh.netsim.scenarios import SCENARIOS, parse_options

    scenario = SCENARIOS.get(args.scenario)
    if scenario is None:
        print(f"locomesh sim: no scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    if args.nodes < 3:
        print("locomesh sim: --nodes must be at least 3", file=sys.stderr)
        return 2
    try:
        options = parse_options(args.scenario, args.option)
    except ValueError as error:
        print(f"locomesh sim: {error}", file=sys.stderr)
        return 2
    if not args.verbose:
        logging.disable(logging.WARNING)  # py-libp2p logs each failed dial; the report counts them
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s wall] {line}", file=sys.stderr, flush=True)

    try:
        result = scenario(nodes=args.nodes, seed=args.seed, progress=progress, **options)
    except ValueError as error:
        print(f"locomesh sim: {error}", file=sys.stderr)
        return 2
    path = args.report or f"netsim-{args.scenario}-{args.seed}.json"
    written = reports.write(result, path)
    print(reports.to_markdown(result))
    hashseed = os.environ.get("PYTHONHASHSEED", "random")
    progress(f"wrote {', '.join(map(str, written))} (PYTHONHASHSEED={hashseed})")
    return 0
