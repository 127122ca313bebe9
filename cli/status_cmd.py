"""`locomesh status` and `locomesh peers`: what the running daemon says, as a table or as JSON.

Both exit 0 with the answer, 3 when no daemon runs on the data dir, 1 when
the daemon answers with an error.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from locomesh.node.dial_addrs import PUBLIC, RELAYED

from .common import TextTable, add_data_dir_argument, human_size, show_call
from .peers_cmd import add_subcommands


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    for name, help_text, handler in (
        ("status", "show the running daemon's status", show_status),
        ("peers", "list the peers the daemon is connected to", show_peers),
    ):
        parser = subparsers.add_parser(name, help=help_text)
        add_data_dir_argument(parser)
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.set_defaults(handler=handler)
        if name == "peers":
            add_subcommands(parser)


def show_status(args: argparse.Namespace) -> int:
    return show_call(args, "node.status", format_status)


def show_peers(args: argparse.Namespace) -> int:
    return show_call(args, "node.peers", format_peers)


def format_status(status: dict[str, Any]) -> str:
    """`node.status` as aligned "key  value" lines; lists one item per line."""
    rows = [
        ("peer id", status.get("peer_id")),
        ("version", status.get("version")),
        ("uptime", _duration(status.get("uptime_s", 0))),
        ("peers connected", status.get("peers_connected")),
        ("bootstrap", _bootstrap_row(status.get("bootstrap"))),
        ("bytes in / out", f"{human_size(status.get('bytes_in', 0))} / {human_size(status.get('bytes_out', 0))}"),
        *_bandwidth_rows(status.get("bandwidth")),
        *([("schedule", status["schedule"])] if status.get("schedule") else []),
        ("protocol errors", _protocol_errors_row(status)),
        *_ended_early_rows(status.get("streams_ended_early")),
        ("services", ", ".join(status.get("services", [])) or "-"),
        ("runs", ", ".join(str(run) for run in status.get("runs", [])) or "-"),
    ]
    rows.extend(_nat_rows(status))
    for label, key in (("listening on", "listen_addrs"), ("observed as", "observed_addrs")):
        addresses = status.get(key) or ["-"]
        rows.extend((label if index == 0 else "", address) for index, address in enumerate(addresses))
    table = TextTable.pairs(rows)
    return table if "dial_addrs" not in status else table.followed_by("\n".join(dial_lines(status["dial_addrs"])))


def dial_lines(dial_addrs: list[dict[str, str]]) -> list[str]:
    """Ready ``--bootstrap`` arguments for other nodes, each after its kind (node/dial_addrs.py):
    the kind first, so that the address ends the line and copies whole. Under the table, not in it:
    on a narrow terminal rich would break an address in two."""
    if not dial_addrs:
        return ["start other nodes with: none of this node's addresses is known yet"]
    width = max(len(entry["kind"]) for entry in dial_addrs)
    lines = ["start other nodes with one of these (locomesh node start --bootstrap ...):"]
    lines.extend(f"  {entry['kind']:<{width}}  --bootstrap {entry['addr']}" for entry in dial_addrs)
    if not any(entry["kind"] in (PUBLIC, RELAYED) for entry in dial_addrs):
        lines.append("  (none is public or relayed yet: nodes on other networks cannot dial this one; "
                     "`locomesh doctor` says why)")
    return lines


def _bandwidth_rows(bandwidth: dict[str, int] | None) -> list[tuple[str, str]]:
    """"upload 1.2 MB/s (cap 10 MB/s)" and the same for download: the node's rates over the last few
    seconds and its caps (node/bandwidth.py), when the daemon reports them."""
    if not isinstance(bandwidth, dict):
        return []
    rows = []
    for direction in ("upload", "download"):
        limit = bandwidth.get(f"{direction}_limit") or 0
        cap = f"cap {human_size(limit)}/s" if limit else "no cap"
        rows.append((direction, f"{human_size(bandwidth.get(f'{direction}_rate') or 0)}/s ({cap})"))
    return rows


def _protocol_errors_row(status: dict[str, Any]) -> str:
    """"3 (timeout 2, too-large 1): ..." with what they mean, or "0"."""
    total = status.get("protocol_errors") or 0
    if not total:
        return "0"
    by_code = status.get("protocol_errors_by_code") or {}
    meaning = "bad or slow input from peers, dropped (the log at INFO names each peer)"
    if by_code.get("internal"):
        meaning += "; internal: a bug in this node, please report it with the log"
    return f"{total}{_breakdown(by_code)}: {meaning}"


def _ended_early_rows(by_code: dict[str, int] | None) -> list[tuple[str, str]]:
    """A row for the streams that ended early with nothing wrong in the input (node/streams.py
    `NOT_PROTOCOL_ERRORS`), if there were any."""
    if not by_code:
        return []
    return [("streams ended early", f"{sum(by_code.values())}{_breakdown(by_code)}: peers that closed a stream "
                                    "before it was done or asked about a run not replicated here; normal, not errors")]


def _breakdown(by_code: dict[str, int]) -> str:
    """" (timeout 2, too-large 1)": the counts by code, largest first; "" without any."""
    parts = [f"{code} {count}" for code, count in sorted(by_code.items(), key=lambda item: (-item[1], item[0]))]
    return f" ({', '.join(parts)})" if parts else ""


def _bootstrap_row(bootstrap: dict[str, int] | None) -> str:
    """"1/2 connected", or why there is nothing to count."""
    if not bootstrap or not bootstrap.get("configured"):
        return "none configured"
    return f"{bootstrap['connected']}/{bootstrap['configured']} connected"


def _nat_rows(status: dict[str, Any]) -> list[tuple[str, Any]]:
    """Reachability and relay rows, when the daemon runs those services."""
    rows: list[tuple[str, Any]] = []
    reach = status.get("reachability")
    if isinstance(reach, dict):
        confirmed = ", ".join(reach.get("confirmed_addrs") or [])
        proof = f" (dialled back at {confirmed})" if confirmed else ""
        rows.append(("reachability", f"{reach.get('verdict')}{proof}"))
    relay = status.get("relay")
    if isinstance(relay, dict):
        offering = f"offering ({relay.get('active_circuits', 0)} circuits)" if relay.get("offering") else "not offering"
        rows.append(("relay", f"{offering}; reserved on {len(relay.get('reservations') or [])} relay(s)"))
        addresses = relay.get("relay_addrs") or []
        rows.extend(("relayed at" if index == 0 else "", address) for index, address in enumerate(addresses))
    mapping = status.get("port_mapping")
    if isinstance(mapping, dict):
        rows.append(("port mapping", _port_mapping_text(mapping)))
    return rows


def _port_mapping_text(mapping: dict[str, Any]) -> str:
    """``upnp /ip4/1.2.3.4/tcp/4001, lease 3600 s (renew in 1700 s), confirmed``, or the state and why."""
    if mapping.get("external_addr"):
        renew = mapping.get("renew_in_s")
        lease = f"lease {mapping.get('lease_s')} s (renew in {renew} s)" if mapping.get("lease_s") else (
            f"permanent lease (re-added in {renew} s)"
        )
        proof = "confirmed" if mapping.get("confirmed") else "not yet confirmed by a dial-back"
        return f"{mapping.get('protocol')} {mapping['external_addr']}, {lease}, {proof}"
    reason = mapping.get("reason")
    return f"{mapping.get('state')}: {reason}" if reason else str(mapping.get("state"))


def format_peers(peers: list[dict[str, Any]]) -> str:
    """`node.peers` as a table with a header row (CONNECTION: direct / hole-punched / relayed, when known)."""
    if not peers:
        return "no peers connected"
    with_kind = any("connection" in peer for peer in peers)
    header = ("PEER ID", "DIRECTION", *(("CONNECTION",) if with_kind else ()), "CONNECTED SINCE", "ADDRESS")
    rows = [
        (
            str(peer.get("peer_id")),
            str(peer.get("direction")),
            *((str(peer.get("connection", "-")),) if with_kind else ()),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(peer.get("connected_since", 0))),
            (peer.get("connection_addrs") or peer.get("addrs") or ["-"])[0],
        )
        for peer in peers
    ]
    return TextTable.columns(header, rows)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"
