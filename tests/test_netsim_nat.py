"""NAT boxes: every pair of NAT types, who can dial whom and whether a hole punch works."""

from __future__ import annotations

import pytest
import trio
from libp2p.transport.exceptions import OpenConnectionError

from locomesh.netsim.nat import NatBox, NatType, hole_punch_succeeds, reachable
from locomesh.netsim.network import DialOutcome, Network
from .repeatable import output_of_fresh_process

P, F, R, PR, S = (NatType.PUBLIC, NatType.FULL_CONE, NatType.RESTRICTED, NatType.PORT_RESTRICTED, NatType.SYMMETRIC)
ORDER = [P, F, R, PR, S]

# Can the row type dial the column type at the address a third party observed for it?
DIAL = {
    P: "YY...",
    F: "YY...",
    R: "YY...",
    PR: "YY...",
    S: "YY...",
}
# Do simultaneous dials to each other's observed addresses connect?
PUNCH = {
    P: "YYYYY",
    F: "YYYYY",
    R: "YYYYY",
    PR: "YYYY.",
    S: "YYY..",
}
PAIRS = [(a, b) for a in ORDER for b in ORDER]


@pytest.mark.parametrize(("dialer", "target"), PAIRS, ids=lambda t: t.value)
def test_who_can_dial_whom(dialer, target):
    assert reachable(dialer, target) == (DIAL[dialer][ORDER.index(target)] == "Y")


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=lambda t: t.value)
def test_hole_punch_outcomes(a, b):
    assert hole_punch_succeeds(a, b) == (PUNCH[a][ORDER.index(b)] == "Y")
    assert hole_punch_succeeds(a, b) == hole_punch_succeeds(b, a)


def test_filters_remember_what_they_should():
    remote, other_port, other_ip = ("1.1.1.1", 10), ("1.1.1.1", 11), ("2.2.2.2", 10)
    inside = ("10.0.0.1", 4001)
    expected = {  # nat type: admitted from (remote, same ip other port, other ip)
        F: (True, True, True),
        R: (True, True, False),
        PR: (True, False, False),
        S: (True, False, False),
    }
    for nat_type, admitted in expected.items():
        box = NatBox("100.64.0.1", nat_type)
        _, port = box.outbound(inside, remote)
        assert tuple(box.inbound(port, src) == inside for src in (remote, other_port, other_ip)) == admitted
        assert box.inbound(port + 1, remote) is None


def test_mapping_is_per_destination_only_for_symmetric_nats():
    inside = ("10.0.0.1", 4001)
    for nat_type in (F, R, PR, S):
        box = NatBox("100.64.0.1", nat_type)
        first, second = box.outbound(inside, ("1.1.1.1", 1)), box.outbound(inside, ("2.2.2.2", 1))
        assert (first != second) == (nat_type is S)
        box.reset()
        assert box.inbound(first[1], ("1.1.1.1", 1)) is None


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=lambda t: t.value)
async def test_simultaneous_dials_through_the_network(a, b, autojump_clock):
    """Both learn their observed addresses from a public node, then dial each other at once."""
    network = Network(0, syn_timeout=3.0)
    nodes = []
    for name, nat_type in (("a", a), ("b", b)):
        nodes.append(network.attach(name, nat=None if nat_type is P else network.add_nat(nat_type)))
    observer = network.attach("observer")
    seen = []
    network.listen(observer, observer.port, lambda stream: seen.append(stream.get_remote_address()))
    for node in nodes:
        network.listen(node, node.port, lambda stream: None)
        await network.connect(node, observer.endpoint)
    results = {}

    async def dial(me, target, name):
        try:
            await network.connect(me, target)
            results[name] = True
        except OpenConnectionError:
            results[name] = False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dial, nodes[0], seen[1], "a")
        nursery.start_soon(dial, nodes[1], seen[0], "b")
    assert (results["a"] or results["b"]) == hole_punch_succeeds(a, b)


async def test_nodes_behind_one_nat_reach_each_other_on_the_lan_but_not_by_hairpin(autojump_clock):
    network = Network(0, syn_timeout=1.0)
    box = network.add_nat(PR)
    first, second = network.attach("first", nat=box), network.attach("second", nat=box)
    network.listen(second, second.port, lambda stream: None)
    await network.connect(first, second.endpoint)
    assert network.dials[-1].outcome is DialOutcome.LAN
    with pytest.raises(OpenConnectionError):
        await network.connect(first, (box.public_ip, 40000))


# --- scenario `nat`: the daemon's reachability check, relay v2 and DCUtR between NAT types --------

NAT_SCENARIO = {"relays": 4, "settle": 40.0, "upgrade_wait": 40.0}


def test_nat_scenario_connects_every_pair_and_is_deterministic_by_seed():
    """Four relays and one node of each NAT type: every pair connects, the same seed gives the same report."""
    from locomesh.netsim.scenarios import SCENARIOS, nat

    assert SCENARIOS["nat"] is nat.run
    report = nat.run(nodes=9, seed=3, **NAT_SCENARIO)
    summary = report["summary"]
    assert summary["pairs tried"] == 10  # C(5, 2): one node of each type
    assert summary["NATed pairs connected (share)"] == 1.0
    pairs, verdicts = report["tables"][0], report["tables"][1]
    columns = pairs["columns"]
    for row in pairs["rows"]:
        outcome = dict(zip(columns, row))
        # A public listen address, or a full cone's port-preserved one (proved by the dial-back and
        # so in its peer record): dialled directly.
        if outcome["target"] in ("public", "full-cone"):
            assert outcome["direct"] == outcome["pairs"]
        elif outcome["dialer"] != "public":
            assert outcome["direct"] == 0 and outcome["none"] == 0  # private listen addresses: relay, then maybe punch
    by_type = {row[0]: row for row in verdicts["rows"]}
    assert by_type["public"][2] == 1 and by_type["public"][5] == 0
    assert by_type["full-cone"][2] == 1 and by_type["full-cone"][5] == 1  # public through its NAT: keeps a relay too
    assert all(by_type[t.value][3] == 1 and by_type[t.value][5] == 1 for t in ORDER[2:])
    assert summary["direct where the NATs allow it (share)"] > 0
    # The same seed, from fresh processes, gives the same report (see tests/repeatable.py: a second
    # run in one process need not). The error table is left out:
    # which code a torn-down stream is counted under (reset or truncated) follows such a set too.
    assert _report_in_a_fresh_process() == _report_in_a_fresh_process()


def _report_in_a_fresh_process() -> str:
    code = (
        "import logging, sys; logging.disable(logging.CRITICAL); "
        "from locomesh.netsim.scenarios import nat; from locomesh.netsim.report import to_json; "
        f"report = nat.run(nodes=9, seed=3, **{NAT_SCENARIO!r}); "
        "sys.stdout.write(to_json({**report, 'tables': report['tables'][:2]}))"
    )
    return output_of_fresh_process(code)


def test_cone_nats_preserve_the_inside_port_while_it_is_free_and_symmetric_ones_never():
    remote = ("198.51.100.9", 4001)
    cone = NatBox("203.0.113.5", NatType.PORT_RESTRICTED)
    assert cone.outbound(("10.0.0.1", 4001), remote) == ("203.0.113.5", 4001)
    assert cone.outbound(("10.0.0.2", 4001), remote)[1] != 4001  # taken by the first: another port
    assert cone.outbound(("10.0.0.1", 4001), ("198.51.100.10", 7)) == ("203.0.113.5", 4001)  # one mapping for all
    symmetric = NatBox("203.0.113.6", NatType.SYMMETRIC)
    ports = {symmetric.outbound(("10.0.0.1", 4001), (f"198.51.100.{n}", 4001))[1] for n in range(3)}
    assert len(ports) == 3 and 4001 not in ports
