"""Benchmark: NAT traversal across real NATs (Linux namespaces, nftables masquerade, real daemons). Root only.

    .venv/bin/python bench/nat_netns.py [--trials 2]

Per NAT kind (``cone``: masquerade that keeps ports, so a hole punch can
work; ``symmetric``: ``fully-random`` ports, so it cannot; ``cgnat``: the
`CgnatLab`, a port-restricted host and two hosts behind one carrier NAT on the
same private address and port, one of them remapped), each trial
builds the lab of `tests/netns_lab.py` (a public relay, two hosts
each behind its own NAT), waits until both hosts know they are private, hold
a relay reservation and have published it in the DHT, then has host2 connect
to host1 by peer ID (DHT lookup, then direct dials and, 2 s later, relayed
ones beside them) and waits up to 30 s for DCUtR.

Figures per kind: the share of NATed pairs that connected (target 100%), the
share upgraded to a direct connection (target >= 90% where the NAT allows
it), seconds until the hosts knew they were private and had a reservation
published, seconds until the first connection (`nat.connect`, retried until
the peer record found in the DHT carries the relay address), seconds from
then to the hole-punched connection. One JSON line, then a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the repository root: the lab is test plumbing (tests/)

from _report import machine, report

from tests.netns_lab import (
    CgnatLab,
    LabTimeout,
    NatLab,
    RpcFailed,
    missing_tools,
    peer_connection,
    rpc,
    start_cgnat,
    start_daemon,
    start_three,
    wait_private_with_reservation,
)

PUNCH_WAIT = 30.0
CONNECT_WAIT = 60.0


def trial(symmetric: bool, index: int) -> dict:
    """One lab, one pair: what happened and how long each step took."""
    daemons = []
    with tempfile.TemporaryDirectory() as directory, NatLab(f"b{os.getpid() % 1000}{index}", symmetric=symmetric) as lab:
        root = Path(directory)

        def start(ns, name, **options):
            daemons.append(start_daemon(lab, ns, root / name, **options))

        try:
            relay_id, first, _ = start_three(lab, start, root)
            began = time.monotonic()
            wait_private_with_reservation(lab, root, relay_id)
            private_s = time.monotonic() - began
            host2 = (lab.host_ns[1], root / "host2")
            began = time.monotonic()
            kind, attempts = connect(host2, first)
            if kind is None:
                return {"connected": False, "direct": False, "private_s": private_s, "attempts": attempts}
            connect_s = time.monotonic() - began
            deadline = began + connect_s + PUNCH_WAIT
            while time.monotonic() < deadline and peer_connection(*host2, first) not in ("hole-punched", "direct"):
                time.sleep(0.25)
            direct = peer_connection(*host2, first) in ("hole-punched", "direct")
            punch_s = time.monotonic() - began - connect_s if direct else None
            return {"connected": True, "first": kind, "direct": direct, "private_s": private_s,
                    "connect_s": connect_s, "attempts": attempts, "punch_s": punch_s}
        except LabTimeout as error:
            print(f"  trial {index}: {error}", file=sys.stderr)
            return {"connected": False, "direct": False}
        finally:
            for daemon in daemons:
                daemon.stop()


def cgnat_trial(index: int) -> list[dict]:
    """One `CgnatLab`: the port-restricted host connects to both hosts behind the carrier (kept port, remapped)."""
    daemons = []
    with tempfile.TemporaryDirectory() as directory, CgnatLab(f"g{os.getpid() % 1000}{index}") as lab:
        root = Path(directory)

        def start(ns, name, **options):
            daemons.append(start_daemon(lab, ns, root / name, **options))

        try:
            began = time.monotonic()
            hosts = start_cgnat(lab, start, root)
            private_s = time.monotonic() - began
            pr = hosts["pr"][:2]
            results = []
            for name in ("host1", "host2"):
                began = time.monotonic()
                kind, attempts = connect(pr, hosts[name][2])
                results.append({"connected": kind is not None, "direct": False, "private_s": private_s,
                                "attempts": attempts, "first": kind, "began": began,
                                "connect_s": time.monotonic() - began if kind else None})
            deadline = time.monotonic() + PUNCH_WAIT
            while time.monotonic() < deadline and not all(result["direct"] for result in results):
                for name, result in zip(("host1", "host2"), results):
                    if not result["direct"] and peer_connection(*pr, hosts[name][2]) in ("hole-punched", "direct"):
                        result["direct"] = True
                        result["punch_s"] = time.monotonic() - result["began"] - result["connect_s"]
                time.sleep(0.25)
            return results
        except LabTimeout as error:
            print(f"  trial {index}: {error}", file=sys.stderr)
            return [{"connected": False, "direct": False}] * 2
        finally:
            for daemon in daemons:
                daemon.stop()


def connect(host: tuple, peer_id: str) -> tuple[str | None, int]:
    """`nat.connect` until it works (a peer record may not carry the relay address yet): (kind, attempts)."""
    deadline = time.monotonic() + CONNECT_WAIT
    attempts = 0
    while time.monotonic() < deadline:
        attempts += 1
        try:
            return rpc(*host, "nat.connect", {"peer_id": peer_id}, timeout=CONNECT_WAIT)["connection"], attempts
        except RpcFailed as error:
            print(f"  attempt {attempts}: {error}", file=sys.stderr)
            time.sleep(1.0)
    return None, attempts


def summary(kind: str, results: list[dict]) -> dict:
    def median(key: str) -> float | None:
        values = [result[key] for result in results if result.get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "nat": kind,
        "pairs": len(results),
        "connected_pct": 100.0 * sum(result["connected"] for result in results) / len(results),
        "direct_pct": 100.0 * sum(result["direct"] for result in results) / len(results),
        "private_and_reserved_s": median("private_s"),
        "first_connection_s": median("connect_s"),
        "connect_attempts": median("attempts"),
        "first_connection_was": ",".join(sorted({result.get("first", "-") for result in results})),
        "hole_punch_s": median("punch_s"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="pairs per NAT kind")
    args = parser.parse_args()
    reason = missing_tools()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    rows = []
    for kind, symmetric in (("cone", False), ("symmetric", True)):
        results = []
        for index in range(args.trials):
            results.append(trial(symmetric, index))
            print(f"  {kind} trial {index}: {results[-1]}", file=sys.stderr)
        rows.append(summary(kind, results))
    kept, remapped = [], []
    for index in range(args.trials):
        pair = cgnat_trial(index)
        print(f"  cgnat trial {index}: {pair}", file=sys.stderr)
        kept.append(pair[0])
        remapped.append(pair[1])
    rows += [summary("cgnat, port kept", kept), summary("cgnat, port remapped", remapped)]
    report("nat_netns", rows, meta={"trials": args.trials, "punch_wait_s": PUNCH_WAIT, **machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
