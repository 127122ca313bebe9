"""`locomesh peers connect PEER_ID`: have the daemon connect to a peer by its ID.

The daemon (RPC ``nat.connect``) looks the peer's signed record up in the DHT
unless addresses are given, dials its direct addresses and, beside them, its
relayed ones; hole punching later upgrades a relayed connection where the
NATs allow. `--keep` has the daemon dial the peer again whenever the link
drops. Exit 0 when connected, 1 when the daemon could not connect (the
message says why), 3 when no daemon runs on the data dir.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_data_dir_argument, show_call

CONNECT_TIMEOUT = 90.0  # a DHT lookup, then direct and relayed dials, each with its own timeout


def add_subcommands(peers: argparse.ArgumentParser) -> None:
    """`peers` alone lists the connected peers; `peers connect` is added here."""
    actions = peers.add_subparsers(dest="peers_action", metavar="ACTION")
    connect = actions.add_parser("connect", help="connect to a peer by ID (found in the DHT, relayed if need be)")
    connect.add_argument("peer_id", metavar="PEER_ID", help="the peer's ID (12D3KooW...)")
    connect.add_argument("--addr", action="append", default=None, metavar="MULTIADDR",
                         help="dial these addresses instead of looking the peer up (repeat)")
    connect.add_argument("--keep", action="store_true", help="dial the peer again whenever the link drops")
    add_data_dir_argument(connect)
    connect.add_argument("--json", action="store_true", help="print JSON")
    connect.set_defaults(handler=connect_peer)


def connect_peer(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"peer_id": args.peer_id, "keep": args.keep}
    if args.addr:
        params["addrs"] = args.addr
    return show_call(args, "nat.connect", _sentence, params=params, timeout=CONNECT_TIMEOUT)


def _sentence(answer: dict[str, Any]) -> str:
    return f"connected to {answer['peer_id']} ({answer['connection']})"
