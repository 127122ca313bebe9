"""The daemon's service assembly (node/assembly.py): what the daemon runs, and what a caller injects."""

from __future__ import annotations

from locomesh.netsim.adversaries import WithholdingCheckpointService
from locomesh.netsim.offload import run_inline
from locomesh.netsim.sim_participant import SimCompute
from locomesh.node.assembly import Pieces, node_services
from locomesh.node.config import NodeConfig
from locomesh.node.daemon import default_services


def test_the_daemon_starts_each_service_after_what_it_needs(tmp_path):
    names = [service.name for service in default_services(NodeConfig(tmp_path))]
    assert names == ["bandwidth", "ping", "reach", "portmap", "relay", "doctor", "runs", "crdt", "checkpoints", "rounds"]


def test_the_daemon_wires_its_services_to_each_other_over_its_data_dir(tmp_path):
    services = node_services(NodeConfig(tmp_path, attack="sign_flip_x100"))
    rounds = services.rounds
    assert rounds is not None
    assert (rounds.registry, rounds.crdt, rounds.checkpoints) == (services.registry, services.crdt, services.checkpoints)
    assert services.checkpoints.directory == tmp_path / "checkpoints" and services.checkpoints.dataplane
    assert rounds.participant_factory is None and rounds.adversary is not None  # the daemon's participant, wrapped
    assert node_services(NodeConfig(tmp_path / "honest")).rounds.adversary is None


def test_injected_pieces_replace_the_daemons_own(tmp_path):
    def factory(body, key):
        raise AssertionError("not called by the assembly")

    compute = SimCompute()
    pieces = Pieces(participant_factory=factory, compute=compute, offload=run_inline, dataplane=False,
                    checkpoint_service=WithholdingCheckpointService, network=False)
    services = node_services(NodeConfig(tmp_path), pieces)
    assert [service.name for service in services.in_start_order()] == ["bandwidth", "runs", "crdt", "checkpoints", "rounds"]
    assert isinstance(services.checkpoints, WithholdingCheckpointService) and not services.checkpoints.dataplane
    rounds = services.rounds
    assert rounds is not None
    assert (rounds.participant_factory, rounds.compute, rounds.offload) == (factory, compute, run_inline)


def test_a_node_without_the_round_service_replicates_and_serves_only(tmp_path):
    services = node_services(NodeConfig(tmp_path), Pieces(network=False, rounds=False))
    assert services.rounds is None
    assert [service.name for service in services.in_start_order()] == ["bandwidth", "runs", "crdt", "checkpoints"]
