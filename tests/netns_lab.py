"""A small internet in Linux network namespaces, for the NAT tests and benchmarks (root only).

Test plumbing, so it lives beside the tests, not in a package the daemon ships: it starts real
daemons with the CLI's `DaemonProcess` and drives them with its `RpcClient`, and only the top
layer may import the CLI (node must not; netsim, the in-memory simulator, must not either, and a
lab of real kernels and real processes is not a simulation). Its users are
tests/test_nat_netns.py and bench/nat_netns.py (which puts the repository root on its path).

`NatLab` needs root, `ip` (iproute2) and `nft` (nftables)::

    relay ns: bridge br0 = the "internet", 11.0.0.1 (a public relay / bootstrap host lives here)
      |-- nat1 ns: pub 11.0.0.11 (masquerade) / lan 10.1.0.1 -- host1 ns: 10.1.0.2
      |-- nat2 ns: pub 11.0.0.12 (masquerade) / lan 10.2.0.1 -- host2 ns: 10.2.0.2

11.0.0.0/24 is a *global* range on purpose, so nothing treats the public
side as a private network; nothing leaves these namespaces. The NAT
routers have no route to the other LAN, so the only way in is through the
masquerade, whose conntrack lets in nothing unsolicited (dropped, as a home router does).
`symmetric=True` maps every connection to a random port (``fully-random``):
a port guessed from another connection is wrong, so hole punching cannot
work and only the relay connects the two hosts.

A process runs inside a namespace behind `NatLab.exec_prefix(ns)`; a daemon
there is driven by running the RPC client inside the same namespace
(`rpc`), since each namespace has its own 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locomesh.cli.daemon_process import DaemonProcess

PUBLIC_IP = "11.0.0.1"
NAT_PUBLIC_IPS = ("11.0.0.11", "11.0.0.12")
HOST_IPS = ("10.1.0.2", "10.2.0.2")
PORT = 4001
_RPC_SNIPPET = (
    "import json, sys\n"
    "from locomesh.cli.client import RpcClient\n"
    "client = RpcClient.for_data_dir(sys.argv[1], timeout=float(sys.argv[4]))\n"
    "print(json.dumps(client.call(sys.argv[2], json.loads(sys.argv[3]))))\n"
)


class LabUnavailable(Exception):
    """Namespaces cannot be made here (not root, no `ip`, no `nft`, or the kernel refuses)."""


def _run(*command: str, stdin: str | None = None, timeout: float = 15.0) -> str:
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, command, result.stdout, result.stderr)
    return result.stdout


def missing_tools() -> str | None:
    """Why a lab cannot be built here, or None if it can (as far as tools and rights go)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (install {package}; .ci/run does when apt works offline)"
    return None


class NatLab:
    """The namespaces above; `close` (or leaving the `with` block) removes them all."""

    def __init__(self, tag: str, *, symmetric: bool = False) -> None:
        self.tag = tag
        self.symmetric = symmetric
        self.relay_ns = f"lm{tag}-relay"
        self.nat_ns = (f"lm{tag}-nat1", f"lm{tag}-nat2")
        self.host_ns = (f"lm{tag}-host1", f"lm{tag}-host2")
        self._made: list[str] = []

    def __enter__(self) -> NatLab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def build(self) -> None:
        for ns in (self.relay_ns, *self.nat_ns, *self.host_ns):
            try:
                _run("ip", "netns", "add", ns)
            except subprocess.CalledProcessError as error:
                raise LabUnavailable(f"network namespaces not permitted here: {error.stderr.strip()}") from None
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        relay = self.relay_ns
        _run("ip", "-n", relay, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", relay, "addr", "add", f"{PUBLIC_IP}/24", "dev", "br0")
        _run("ip", "-n", relay, "link", "set", "br0", "up")
        for index, (nat, host) in enumerate(zip(self.nat_ns, self.host_ns)):
            self._build_site(index, nat, host)

    def _build_site(self, index: int, nat: str, host: str) -> None:
        port = f"port{index}"
        _run("ip", "link", "add", "name", "pub", "netns", nat, "type", "veth", "peer", "name", port, "netns", self.relay_ns)
        _run("ip", "-n", self.relay_ns, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", nat, "addr", "add", f"{NAT_PUBLIC_IPS[index]}/24", "dev", "pub")
        _run("ip", "-n", nat, "link", "set", "pub", "up")
        _run("ip", "link", "add", "name", "lan", "netns", nat, "type", "veth", "peer", "name", "eth0", "netns", host)
        _run("ip", "-n", nat, "addr", "add", f"10.{index + 1}.0.1/24", "dev", "lan")
        _run("ip", "-n", nat, "link", "set", "lan", "up")
        _run("ip", "-n", host, "addr", "add", f"{HOST_IPS[index]}/24", "dev", "eth0")
        _run("ip", "-n", host, "link", "set", "eth0", "up")
        _run("ip", "-n", host, "route", "add", "default", "via", f"10.{index + 1}.0.1")
        _run(*self.exec_prefix(nat), "sysctl", "-qw", "net.ipv4.ip_forward=1")
        mapping = " fully-random" if self.symmetric else ""
        ruleset = (
            "table ip nat {\n"
            "  chain post { type nat hook postrouting priority 100; oifname \"pub\" masquerade" + mapping + "; }\n"
            "}\n"
            # Like a home router: what no mapping expects is dropped, not refused (a RST would
            # kill the simultaneous open of a hole punch).
            "table ip filter {\n"
            "  chain in { type filter hook input priority 0; iifname \"pub\" ct state new drop; }\n"
            "}\n"
        )
        _run(*self.exec_prefix(nat), "nft", "-f", "-", stdin=ruleset)

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)
        self._made.clear()

    # --- processes inside -------------------------------------------------------------------

    @staticmethod
    def exec_prefix(ns: str) -> list[str]:
        """Put this before a command line to run it inside namespace `ns`."""
        return ["ip", "netns", "exec", ns]


def rpc(ns: str, data_dir: Path, method: str, params: Any = None, *, timeout: float = 30.0) -> Any:
    """Call `method` on the daemon of `data_dir`, from inside namespace `ns`; raises `RpcFailed`."""
    command = [*NatLab.exec_prefix(ns), sys.executable, "-c", _RPC_SNIPPET]
    command += [str(data_dir), method, json.dumps(params), str(timeout)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 15)
    if result.returncode != 0:
        raise RpcFailed(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}")
    return json.loads(result.stdout)


class RpcFailed(Exception):
    """An RPC made inside a namespace failed (no daemon yet, or it answered an error)."""


class LabTimeout(Exception):
    """Something awaited in the lab (`wait_until`) did not happen in time."""


# --- a scenario: a relay and two NATed daemons ------------------------------------------


def start_daemon(lab: NatLab, ns: str, data_dir: Path, *, listen: str, bootstrap=(), env=None) -> DaemonProcess:
    """A real `locomesh node start` in namespace `ns`; its log goes to ``<data_dir>.log``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(f"{data_dir}.log", "wb")  # noqa: SIM115 - the child holds it; closed when the caller ends
    daemon = DaemonProcess(data_dir, listen=[listen], bootstrap=list(bootstrap), log=log, env={**os.environ, **(env or {})})
    daemon.args[:0] = lab.exec_prefix(ns)
    return daemon.start()


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """Poll `check` until it returns something true (errors count as not yet); fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (RpcFailed, KeyError, subprocess.TimeoutExpired) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(0.5)
    raise LabTimeout(f"{what}: not within {timeout:g} s (last: {last!r})")


def peer_connection(ns: str, data_dir: Path, peer_id: str) -> str | None:
    """How the daemon of `data_dir` is connected to `peer_id` (direct / hole-punched / relayed), or None."""
    for peer in rpc(ns, data_dir, "node.peers"):
        if peer["peer_id"] == peer_id:
            return peer.get("connection")
    return None


def start_three(lab: NatLab, start: Callable[..., DaemonProcess], root: Path) -> tuple[str, str, str]:
    """The relay (public, relaying from the start) and the two NATed hosts; returns their peer IDs.

    `start(ns, name, listen=..., bootstrap=..., env=...)` starts one daemon with data dir
    ``root / name`` (e.g. `start_daemon` plus the caller's bookkeeping).
    """
    start(lab.relay_ns, "relay", listen=f"/ip4/{PUBLIC_IP}/tcp/{PORT}", env={"LOCOMESH_RELAY": "on"})
    relay_status = wait_until("relay up", lambda: rpc(lab.relay_ns, root / "relay", "node.status"), 30)
    bootstrap = [f"/ip4/{PUBLIC_IP}/tcp/{PORT}/p2p/{relay_status['peer_id']}"]
    ids = []
    for index, ns in enumerate(lab.host_ns):
        name = f"host{index + 1}"
        start(ns, name, listen=f"/ip4/{HOST_IPS[index]}/tcp/{PORT}", bootstrap=bootstrap)
        ids.append(wait_until(f"{name} up", lambda: rpc(ns, root / name, "node.status"), 30)["peer_id"])
    return relay_status["peer_id"], ids[0], ids[1]


def wait_private_with_reservation(lab: NatLab, root: Path, relay_id: str) -> None:
    """Both hosts find out they are private (dial-backs fail), reserve a slot on the relay, and publish it."""
    for ns, name in zip(lab.host_ns, ("host1", "host2")):

        def reserved() -> bool:
            status = rpc(ns, root / name, "node.status")
            relay = status["relay"]
            return (
                status["reachability"]["verdict"] == "private"
                and relay["reservations"] == [relay_id]
                and relay["published_relay_addrs"] == relay["relay_addrs"]
            )

        wait_until(f"{name} private with a reservation on the relay", reserved, 60)
