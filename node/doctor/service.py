"""The ``node.doctor`` RPC method: the daemon's checks, for ``locomesh doctor [RUN_ID]``.

    node.doctor(run_id=None) -> {"ok": bool, "checks": [{name, status, detail, fix}], "facts": {...}}

Without a run: the network checks (`network.py`). With one: those and the run's (`run_checks.py`).
`ok` is false when any check failed: the node cannot take part until that is fixed (`checks.takes_part`). The service
also answers the bounded bandwidth probe (`probe.py`) that other nodes' doctors send, the members
of the runs it holds first.

One doctor call runs at a time (a second waits): a call dials, probes and trains for a few seconds,
and the RPC is local, so nothing is lost by queueing.
"""

from __future__ import annotations

from typing import Any

import trio


from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import Node

from .checks import takes_part
from .network import bootstrap_dials, network_checks
from .probe import ProbeServer
from .run_checks import Offload, RunDoctor


class DoctorService:
    """Serves ``node.doctor`` and the bandwidth probe."""

    name = "doctor"

    def __init__(self, registry: Any, crdt: Any, *, device: str = "cpu", memory_limit: int = 0,
                 offload: Offload = trio.to_thread.run_sync) -> None:
        self.registry = registry
        self.crdt = crdt
        self.device = device
        self.memory_limit = memory_limit
        self.offload = offload
        self._node: Node | None = None
        self._one_at_a_time = trio.Lock()

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        ProbeServer(node, self._is_member)
        node.rpc.register("node.doctor", self._rpc_doctor)
        task_status.started()

    def _is_member(self, peer_id: str) -> bool:
        """Has `peer_id` standing in a run this node holds (the probe serves those first)?"""
        return self.crdt is not None and self.crdt.has_standing(peer_id)

    async def _rpc_doctor(self, run_id: str | None = None) -> dict[str, Any]:
        if run_id is not None and not isinstance(run_id, str):
            raise RpcError.invalid_params("run_id must be a string")
        node = self._node
        assert node is not None, "the service is not running"
        async with self._one_at_a_time:
            dials = await bootstrap_dials(node)
            status = node.status()
            checks = network_checks(status, dials)
            facts: dict[str, Any] = {"bootstrap_dials": dials, "memory_limit": self.memory_limit,
                                     "device": self.device}
            if run_id is not None:
                report = await RunDoctor(node, self.registry, self.crdt, device=self.device,
                                         memory_limit=self.memory_limit, offload=self.offload).check(run_id)
                checks.extend(report.checks)
                facts["run"] = report.facts
        return {"ok": takes_part(checks), "checks": [c.as_dict() for c in checks],
                "facts": facts, "status": status}
