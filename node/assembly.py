"""The services a node runs, assembled in one place: the daemon's and the simulator's nodes alike.

`node_services(config, pieces)` builds them over ``config.data_dir``, wired to each other, in the
order the node starts them:

    bandwidth                                    (the node's rate caps, `locomesh.node.bandwidth`)
    ping, reachability, port mapping, relay      (`network`: they need real sockets and gateways)
    doctor                                       (``node.doctor`` and its bandwidth probe, with `network`)
    run registry (owns the DHT), CRDT, checkpoints, rounds

`Pieces` are the parts a caller may put in place of the daemon's own. The daemon passes none.
The network simulator (netsim/scenarios/train.py) passes a modelled participant and compute,
inline store work, no data plane (it carries libp2p connections only) and no network services,
and for an adversary a hostile subclass of the checkpoint service; a stranger that only writes
ops runs no round service.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from locomesh.training.contract import ParticipantFactory, RoundParticipant

from locomesh.node.bandwidth import BandwidthLimits
from locomesh.node.config import NodeConfig
from locomesh.node.datadir import CHECKPOINT_DIR
from locomesh.node.doctor.service import DoctorService
from locomesh.node.nat.services import nat_services
from locomesh.node.ping import PingService
from locomesh.node.replication.service import CrdtService
from locomesh.node.rounds.participation import Compute
from locomesh.node.rounds.service import RoundService
from locomesh.node.runs.registry import RunRegistryService
from locomesh.node.schedule import TrainingSchedule
from locomesh.node.service import Service
from locomesh.node.transfer.download import Offload
from locomesh.node.exchange.shard_transfer import ShardService
from locomesh.node.transfer.service import CheckpointService


@dataclass(frozen=True)
class Pieces:
    """What a caller may inject; every default is the daemon's own part."""

    participant_factory: ParticipantFactory | None = None  # None: training.participant.Participant.for_run
    compute: Compute = trio.to_thread.run_sync  # runs a participant method (its training, its outer step)
    offload: Offload = trio.to_thread.run_sync  # runs blocking store work (hashing, file writes)
    dataplane: bool = True  # the checkpoint data plane (its own TCP listener beside libp2p)
    checkpoint_service: type[CheckpointService] = CheckpointService
    shard_service: type[ShardService] = ShardService
    network: bool = True  # ping and the NAT-traversal services (modes from the config)
    rounds: bool = True  # the round service (training); without it a node replicates and serves only
    wall_clock: Callable[[], float] = time.time  # what DHT records are dated by (the simulator's: virtual)


@dataclass(frozen=True)
class NodeServices:
    """One node's services, by name, and each collaborator of the others."""

    registry: RunRegistryService
    crdt: CrdtService
    checkpoints: CheckpointService
    rounds: RoundService | None
    network: tuple[Service, ...] = ()
    bandwidth: Service | None = None

    def in_start_order(self) -> list[Service]:
        """The order the node starts them in: each service only needs what started before it."""
        rounds = [] if self.rounds is None else [self.rounds]
        bandwidth = [] if self.bandwidth is None else [self.bandwidth]
        return [*bandwidth, *self.network, self.registry, self.crdt, self.checkpoints, *rounds]


def node_services(config: NodeConfig, pieces: Pieces = Pieces()) -> NodeServices:
    """A node's services over ``config.data_dir``, with `pieces` in place of the daemon's own."""
    registry = RunRegistryService(config.data_dir, replicas=lambda: crdt.replicas.values(), offload=pieces.offload,
                                  clock=pieces.wall_clock)
    crdt = CrdtService(config.data_dir)
    checkpoints = pieces.checkpoint_service(
        config.data_dir / CHECKPOINT_DIR, dataplane=pieces.dataplane, offload=pieces.offload,
        discovery=lambda: registry.discovery, is_member=crdt.has_standing,
    )
    rounds = None
    if pieces.rounds:
        rounds = RoundService(registry, crdt, checkpoints, archive=config.archive == "on",
                              device=config.device, local_workers=config.local_workers,
                              memory_limit=config.memory_limit,
                              train_threads=config.train_threads, schedule=TrainingSchedule.from_config(config),
                              participant_factory=pieces.participant_factory, adversary=_adversary(config),
                              compute=pieces.compute,
                              shard_service=pieces.shard_service,
                              offload=pieces.offload)
    network: tuple[Service, ...] = ()
    if pieces.network:
        network = (PingService(), *nat_services(relay=config.relay, nat_traversal=config.nat_traversal,
                                                port_mapping=config.port_mapping, discovery=lambda: registry.discovery,
                                                allow_private_addrs=config.private_addresses == "on"),
                   DoctorService(registry, crdt, device=config.device, memory_limit=config.memory_limit,
                                 offload=pieces.offload))
    bandwidth = BandwidthLimits(upload=config.upload_limit, download=config.download_limit)
    return NodeServices(registry, crdt, checkpoints, rounds, network, bandwidth)


def _adversary(config: NodeConfig) -> Callable[[RoundParticipant], RoundParticipant] | None:
    """What makes a test adversary of each participant (`config.attack`: `training.adversary`), or
    None for an honest node. The module loads torch: imported on the first join, in its thread."""
    if not config.attack:
        return None

    def attacking(honest: RoundParticipant) -> RoundParticipant:
        from locomesh.training.adversary import AttackingParticipant
        from locomesh.training.attacks import get_attack

        return AttackingParticipant(honest, get_attack(config.attack))

    return attacking
