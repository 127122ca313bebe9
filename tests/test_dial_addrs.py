"""The addresses a node gives others (#37): `status` names dialable ones, each with its kind, as
ready ``--bootstrap`` lines (never the 0.0.0.0 it listens on), and doctor's fix for a first node
names the best of them."""

from __future__ import annotations

import random

import trio
from multiaddr import Multiaddr

from locomesh.cli.status_cmd import format_status
from locomesh.node.dial_addrs import LAN, PUBLIC, RELAYED, THIS_MACHINE, UNCONFIRMED, dial_addresses
from locomesh.node.doctor.checks import FAIL
from locomesh.node.doctor.network import network_checks
from locomesh.node.runtime import Node

ME = "12D3KooWMe"
RELAY = "12D3KooWRelay"
INTERFACES = ["127.0.0.1", "::1", "192.168.1.20", "fe80::1%eth0", "2a01:4f8::7"]


def test_each_address_others_can_dial_is_named_with_its_kind_best_first():
    status = {
        "peer_id": ME,
        "listen_addrs": [f"/ip4/0.0.0.0/tcp/4001/p2p/{ME}", f"/ip6/::/tcp/4002/p2p/{ME}"],
        "observed_addrs": [f"/ip4/81.2.69.160/tcp/4001/p2p/{ME}", f"/ip4/81.2.69.161/tcp/4001/p2p/{ME}"],
        "reachability": {"verdict": "public", "confirmed_addrs": ["/ip4/81.2.69.160/tcp/4001"]},
        "relay": {"relay_addrs": [f"/ip4/81.2.69.9/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{ME}"]},
    }
    assert dial_addresses(status, lambda: INTERFACES) == [
        {"addr": f"/ip4/81.2.69.160/tcp/4001/p2p/{ME}", "kind": PUBLIC},  # a dial-back proved it: once, as public
        {"addr": f"/ip4/81.2.69.9/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{ME}", "kind": RELAYED},
        {"addr": f"/ip6/2a01:4f8::7/tcp/4002/p2p/{ME}", "kind": UNCONFIRMED},
        {"addr": f"/ip4/81.2.69.161/tcp/4001/p2p/{ME}", "kind": UNCONFIRMED},
        {"addr": f"/ip4/192.168.1.20/tcp/4001/p2p/{ME}", "kind": LAN},
        {"addr": f"/ip4/127.0.0.1/tcp/4001/p2p/{ME}", "kind": THIS_MACHINE},
        {"addr": f"/ip6/::1/tcp/4002/p2p/{ME}", "kind": THIS_MACHINE},
    ], "0.0.0.0 and :: at the interfaces' IPs of their family, link-local left out"


def test_status_prints_ready_bootstrap_lines_and_says_when_none_reaches_other_networks():
    dial = [{"addr": f"/ip4/192.168.1.20/tcp/4001/p2p/{ME}", "kind": LAN},
            {"addr": f"/ip4/127.0.0.1/tcp/4001/p2p/{ME}", "kind": THIS_MACHINE}]
    text = format_status({"peer_id": ME, "listen_addrs": [f"/ip4/0.0.0.0/tcp/4001/p2p/{ME}"], "dial_addrs": dial})
    assert text.splitlines()[-4:] == [
        "start other nodes with one of these (locomesh node start --bootstrap ...):",
        f"  LAN only           --bootstrap /ip4/192.168.1.20/tcp/4001/p2p/{ME}",
        f"  this machine only  --bootstrap /ip4/127.0.0.1/tcp/4001/p2p/{ME}",
        "  (none is public or relayed yet: nodes on other networks cannot dial this one; `locomesh doctor` says why)",
    ]
    assert text.after == "\n".join(text.splitlines()[-4:]), "printed as is under the table on a terminal too"
    relayed = [{"addr": f"/ip4/81.2.69.9/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{ME}", "kind": RELAYED}, *dial]
    assert "none is public" not in format_status({"peer_id": ME, "dial_addrs": relayed})
    assert "start other nodes" not in format_status({"peer_id": ME}), "an older daemon's status: no such lines"


def test_doctor_tells_a_first_node_the_command_that_starts_the_others_with_its_best_address():
    alone = {"bootstrap": {"configured": 0, "connected": 0}, "peers_connected": 0,
             "dial_addrs": [{"addr": f"/ip4/192.168.1.20/tcp/4001/p2p/{ME}", "kind": LAN},
                            {"addr": f"/ip4/127.0.0.1/tcp/4001/p2p/{ME}", "kind": THIS_MACHINE}]}
    [bootstrap] = network_checks(alone, {})
    assert bootstrap.status == FAIL
    assert (f"if this is the first node of a new network, start the other nodes with: locomesh node start "
            f"--bootstrap /ip4/192.168.1.20/tcp/4001/p2p/{ME} (LAN only; nodes on other networks need a public or "
            "relayed address, see the reachability and relays checks; `locomesh status` lists every address)"
            ) in bootstrap.fix
    public = {**alone, "dial_addrs": [{"addr": f"/ip4/81.2.69.160/tcp/4001/p2p/{ME}", "kind": PUBLIC}]}
    [bootstrap] = network_checks(public, {})
    assert bootstrap.fix.endswith(f"--bootstrap /ip4/81.2.69.160/tcp/4001/p2p/{ME} (public; `locomesh status` "
                                  "lists every address)")


async def test_a_node_listening_on_0_0_0_0_offers_an_address_another_node_can_dial(nursery, identity_factory):
    node = Node.create(identity_factory(1), listen_addrs=[Multiaddr("/ip4/0.0.0.0/tcp/0")], rng=random.Random(1))
    node.interface_ips = lambda: ["127.0.0.1"]  # the host's others: not ours to assume in a test
    await nursery.start(node.run)
    status = node.status()
    assert status["listen_addrs"][0].startswith("/ip4/0.0.0.0/tcp/")  # what no one can dial
    [offered] = status["dial_addrs"]
    port = status["listen_addrs"][0].split("/")[4]
    assert offered == {"addr": f"/ip4/127.0.0.1/tcp/{port}/p2p/{node.peer_id}", "kind": THIS_MACHINE}
    assert f"this machine only  --bootstrap {offered['addr']}" in format_status(status)

    friend = Node.create(identity_factory(2), listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")],
                         bootstrap=[Multiaddr(offered["addr"])], rng=random.Random(2))
    await nursery.start(friend.run)
    with trio.fail_after(10):
        while node.peer_id not in friend.peers:
            await trio.sleep(0.02)
    friend.request_stop()
    node.request_stop()
