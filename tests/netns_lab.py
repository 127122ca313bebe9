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


class _Lab:
    """Namespaces made by `_add_namespaces`; `close` (or leaving the `with` block) removes them all."""

    def __init__(self) -> None:
        self._made: list[str] = []

    def __enter__(self):
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def build(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)
        self._made.clear()

    def _add_namespaces(self, *names: str) -> None:
        for ns in names:
            try:
                _run("ip", "netns", "add", ns)
            except subprocess.CalledProcessError as error:
                raise LabUnavailable(f"network namespaces not permitted here: {error.stderr.strip()}") from None
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def exec_prefix(ns: str) -> list[str]:
        """Put this before a command line to run it inside namespace `ns`."""
        return ["ip", "netns", "exec", ns]


class NatLab(_Lab):
    """The relay and the two NATed sites of the module docstring."""

    def __init__(self, tag: str, *, symmetric: bool = False) -> None:
        super().__init__()
        self.tag = tag
        self.symmetric = symmetric
        self.relay_ns = f"lm{tag}-relay"
        self.nat_ns = (f"lm{tag}-nat1", f"lm{tag}-nat2")
        self.host_ns = (f"lm{tag}-host1", f"lm{tag}-host2")

    def build(self) -> None:
        self._add_namespaces(self.relay_ns, *self.nat_ns, *self.host_ns)
        _bridge(self.relay_ns, "br0", f"{PUBLIC_IP}/24")
        for index, (nat, host) in enumerate(zip(self.nat_ns, self.host_ns)):
            _router(nat, uplink=(self.relay_ns, "br0", f"port{index}"), outside=f"{NAT_PUBLIC_IPS[index]}/24")
            _lan(nat, host, f"10.{index + 1}.0.1", HOST_IPS[index])
            _run(*self.exec_prefix(nat), "nft", "-f", "-", stdin=_masquerade_ruleset(fully_random=self.symmetric))


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
    log = open(f"{data_dir}.log", "wb")  # the child holds it; closed when the caller ends
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


# --- a carrier-grade NAT: two homes behind one shared outside address -------------------------

CGNAT_PUBLIC_IP = "11.0.0.20"
CGNAT_INSIDE = ("100.64.0.2", "100.64.0.3")  # the two home routers' outside addresses (RFC 6598 space)
HOME_HOST_IP = "192.168.30.2"  # the same private address in both homes, on the same listen port
REMAPPED_PORT = 3192  # where the carrier maps the second home's listen port (the first keeps PORT)
PR_NAT_PUBLIC_IP = "11.0.0.11"
PR_HOST_IP = "10.1.0.2"


class CgnatLab(_Lab):
    """A public relay, a port-restricted home elsewhere, and two homes behind one carrier-grade NAT.

    ::

        inet ns: bridge br0, 11.0.0.1 (relay / bootstrap)
          |-- prnat ns: pub 11.0.0.11 (masquerade, port-restricted) / lan 10.1.0.1 -- prhost 10.1.0.2
          |-- cgnat ns: pub 11.0.0.20 / bridge cg0 100.64.0.1
                 |-- home1 ns: pub 100.64.0.2 (masquerade) / lan 192.168.30.1 -- host1 192.168.30.2
                 |-- home2 ns: pub 100.64.0.3 (masquerade) / lan 192.168.30.1 -- host2 192.168.30.2

    The carrier maps endpoint-independently (RFC 6888 asks it to): every flow
    from a home's port 4001 leaves from one fixed outside port, 4001 for home1
    and `REMAPPED_PORT` for home2 (a collision remapped); everything else is
    masqueraded. Like every NAT here it admits only replies (conntrack), drops
    unsolicited connections, and does not hairpin (a home cannot reach the
    other at the shared outside address). Both homes use the same private
    subnet and both hosts the same address and port.
    """

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag
        self.inet_ns = f"lm{tag}-inet"
        self.pr_nat_ns, self.pr_host_ns = f"lm{tag}-prnat", f"lm{tag}-prhost"
        self.cgnat_ns = f"lm{tag}-cgnat"
        self.home_ns = (f"lm{tag}-home1", f"lm{tag}-home2")
        self.host_ns = (f"lm{tag}-host1", f"lm{tag}-host2")

    def build(self) -> None:
        self._add_namespaces(self.inet_ns, self.pr_nat_ns, self.pr_host_ns, self.cgnat_ns, *self.home_ns, *self.host_ns)
        _bridge(self.inet_ns, "br0", f"{PUBLIC_IP}/24")
        _router(self.pr_nat_ns, uplink=(self.inet_ns, "br0", "port0"), outside=f"{PR_NAT_PUBLIC_IP}/24")
        _lan(self.pr_nat_ns, self.pr_host_ns, "10.1.0.1", PR_HOST_IP)
        _router(self.cgnat_ns, uplink=(self.inet_ns, "br0", "port1"), outside=f"{CGNAT_PUBLIC_IP}/24")
        _bridge(self.cgnat_ns, "cg0", "100.64.0.1/24")
        for index, (home, host) in enumerate(zip(self.home_ns, self.host_ns)):
            _router(home, uplink=(self.cgnat_ns, "cg0", f"home{index}"), outside=f"{CGNAT_INSIDE[index]}/24")
            _run("ip", "-n", home, "route", "add", "default", "via", "100.64.0.1")
            _lan(home, host, "192.168.30.1", HOME_HOST_IP)
        for ns in (self.pr_nat_ns, *self.home_ns):
            _run(*self.exec_prefix(ns), "nft", "-f", "-", stdin=_masquerade_ruleset())
        _run(*self.exec_prefix(self.cgnat_ns), "nft", "-f", "-", stdin=_cgnat_ruleset())


def _bridge(ns: str, name: str, address: str) -> None:
    _run("ip", "-n", ns, "link", "add", name, "type", "bridge")
    _run("ip", "-n", ns, "addr", "add", address, "dev", name)
    _run("ip", "-n", ns, "link", "set", name, "up")


def _router(ns: str, *, uplink: tuple[str, str, str], outside: str) -> None:
    """`ns` gets an interface "pub" at `outside`, plugged into bridge `uplink[1]` of namespace `uplink[0]`."""
    up_ns, bridge, port = uplink
    _run("ip", "link", "add", "name", "pub", "netns", ns, "type", "veth", "peer", "name", port, "netns", up_ns)
    _run("ip", "-n", up_ns, "link", "set", port, "master", bridge, "up")
    _run("ip", "-n", ns, "addr", "add", outside, "dev", "pub")
    _run("ip", "-n", ns, "link", "set", "pub", "up")
    _run(*NatLab.exec_prefix(ns), "sysctl", "-qw", "net.ipv4.ip_forward=1")


def _lan(router: str, host: str, gateway: str, host_ip: str) -> None:
    _run("ip", "link", "add", "name", "lan", "netns", router, "type", "veth", "peer", "name", "eth0", "netns", host)
    _run("ip", "-n", router, "addr", "add", f"{gateway}/24", "dev", "lan")
    _run("ip", "-n", router, "link", "set", "lan", "up")
    _run("ip", "-n", host, "addr", "add", f"{host_ip}/24", "dev", "eth0")
    _run("ip", "-n", host, "link", "set", "eth0", "up")
    _run("ip", "-n", host, "route", "add", "default", "via", gateway)


def _masquerade_ruleset(*, fully_random: bool = False) -> str:
    """A home router: masquerade out of "pub" (Linux keeps the port when it can; `fully_random`: a random
    port per connection, a symmetric NAT), and drop what no mapping expects, as a home router does (a
    reset would kill the simultaneous open of a hole punch)."""
    mapping = " fully-random" if fully_random else ""
    return (
        "table ip nat {\n"
        '  chain post { type nat hook postrouting priority 100; oifname "pub" masquerade' + mapping + "; }\n"
        "}\n"
        # Only what is addressed to the router itself needs dropping: nothing routes to the LAN from
        # outside, so a new connection reaches it only through a port forward (a DNAT rule).
        "table ip filter {\n"
        '  chain in { type filter hook input priority 0; iifname "pub" ct state new drop; }\n'
        "}\n"
    )


def _cgnat_ruleset() -> str:
    """The carrier: a fixed outside port per home listen port (endpoint-independent), no hairpinning."""
    return (
        "table ip nat {\n"
        "  map listen_ports { type ipv4_addr . inet_service : ipv4_addr . inet_service;\n"
        f"    elements = {{ {CGNAT_INSIDE[0]} . {PORT} : {CGNAT_PUBLIC_IP} . {PORT},\n"
        f"                 {CGNAT_INSIDE[1]} . {PORT} : {CGNAT_PUBLIC_IP} . {REMAPPED_PORT} }} }}\n"
        "  chain post { type nat hook postrouting priority 100;\n"
        '    oifname "pub" ip saddr . tcp sport @listen_ports snat ip to ip saddr . tcp sport map @listen_ports;\n'
        '    oifname "pub" masquerade; }\n'
        "}\n"
        "table ip filter {\n"
        '  chain in { type filter hook input priority 0; iifname "pub" ct state new drop;\n'
        f'    iifname "cg0" ip daddr {CGNAT_PUBLIC_IP} drop; }}\n'
        '  chain inbound { type filter hook forward priority 0; iifname "pub" ct state new drop; }\n'
        "}\n"
    )


def start_cgnat(lab: CgnatLab, start: Callable[..., DaemonProcess], root: Path) -> dict[str, tuple[str, Path, str]]:
    """The relay, the port-restricted host "pr" and "host1"/"host2" behind the carrier, started and all
    private with a published relay address; name -> (namespace, data dir, peer ID)."""
    start(lab.inet_ns, "relay", listen=f"/ip4/{PUBLIC_IP}/tcp/{PORT}", env={"LOCOMESH_RELAY": "on"})
    relay = wait_until("relay up", lambda: rpc(lab.inet_ns, root / "relay", "node.status"), 30)["peer_id"]
    bootstrap = [f"/ip4/{PUBLIC_IP}/tcp/{PORT}/p2p/{relay}"]
    hosts = {}
    for ns, name, ip in ((lab.pr_host_ns, "pr", PR_HOST_IP), (lab.host_ns[0], "host1", HOME_HOST_IP),
                         (lab.host_ns[1], "host2", HOME_HOST_IP)):
        start(ns, name, listen=f"/ip4/{ip}/tcp/{PORT}", bootstrap=bootstrap)
        hosts[name] = (ns, root / name, wait_until(f"{name} up", lambda: rpc(ns, root / name, "node.status"), 30)["peer_id"])
    for name, (ns, data_dir, _) in hosts.items():

        def ready() -> bool:
            status = rpc(ns, data_dir, "node.status")
            return status["reachability"]["verdict"] == "private" and bool(status["relay"]["published_relay_addrs"])

        wait_until(f"{name} private with a published relay address", ready, 90)
    return hosts
