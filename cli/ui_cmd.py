"""`locomesh ui`: a one-time login URL for the running daemon's dashboard (and, with --open, a browser).

The daemon serves the dashboard beside its RPC, on 127.0.0.1 only. Whoever
can read the data dir's cookie asks the daemon for a login URL
(``dashboard.login``); opened in a browser, it logs that browser in once.
Exits 0 with the URL printed, 3 when no daemon runs on the data dir, 1 when
the daemon refuses.
"""

from __future__ import annotations

import argparse
import webbrowser

from .client import EXIT_ERROR, EXIT_OK, DaemonNotRunning, RpcCallError, RpcClient
from .common import add_data_dir_argument, data_dir_of, fail, no_daemon


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ui", help="print a one-time login URL for the daemon's dashboard")
    add_data_dir_argument(parser)
    parser.add_argument("--open", action="store_true", help="also open it in the default web browser")
    parser.set_defaults(handler=show_login_url)


def show_login_url(args: argparse.Namespace) -> int:
    try:
        login = RpcClient.for_data_dir(data_dir_of(args)).call("dashboard.login")
    except DaemonNotRunning as error:
        return no_daemon(error)
    except RpcCallError as error:
        return fail(f"dashboard.login failed: {error.message}", EXIT_ERROR)
    minutes = round(login["expires_in_s"] / 60)
    print(f"Open the dashboard (this URL logs one browser in, once, within {minutes} minutes):")
    print(f"    {login['url']}")
    if args.open and not webbrowser.open(login["url"]):
        return fail("no web browser could be opened here; open the URL above yourself", EXIT_ERROR)
    return EXIT_OK
