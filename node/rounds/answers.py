"""The answers of a `RoundService` to the node's RPC calls about runs: `run.join`, `run.leave`,
`run.pause`, `run.resume`, `run.admit`, `run.status` and `run.export` (node/rpc/), and why a call
about a run this node has no part in is refused.

A mixin: `RoundService` (service.py) holds the state these read (`registry`, `participations`,
`crdt`, `paused`, `_left`, `_rejoining`, `_node`) and does the joining and leaving they ask for.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from locomesh.crdt import Replica
from locomesh.protocol import ProtocolError, public_key_from_peer_id
from locomesh.protocol.runs import format_run_id, short_run_id
from locomesh.training.run_settings import ParticipantError

from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.rounds.history import RoundHistory, left_after, read_history
from locomesh.node.rounds.participation import HISTORY, RunParticipation
from locomesh.node.rounds.status import kept_status, members_by_peer_id
from locomesh.node.runs.registry import BAD_RUN, RUN_NOT_FOUND

NOT_JOINED = -32005


class RunAnswers:
    """`RoundService`'s RPC answers (module docstring)."""

    async def _rpc_join(self, run_id: str) -> dict[str, Any]:
        raw_id = await self.registry.resolve(run_id, look_up=True)  # a short ID from `run browse` too
        run, _source = await self.registry.find(raw_id)
        first = await self.join(run.manifest)
        return {"run_id": format_run_id(raw_id), "joins_at": first, **self._sitting_out(raw_id)}

    def _sitting_out(self, run_id: bytes) -> dict[str, Any]:
        """Why the node sits `run_id`'s rounds out now, if it does (`run join` must not promise round
        `joins_at` then), and the schedule's windows when now is outside them."""
        participation = self.participations.get(run_id)
        return {"sitting_out": None if participation is None else participation[0].sitting_out(),
                "outside_schedule": None if self.schedule is None else self.schedule.outside_windows(datetime.now())}

    async def _rpc_leave(self, run_id: str) -> dict[str, Any]:
        raw_id = await self.registry.resolve(run_id)
        return {"run_id": format_run_id(raw_id), "last_round": await self.leave(raw_id)}

    async def _rpc_pause(self, run_id: str) -> dict[str, Any]:
        """Sit the run's rounds out after the round under way, keeping its state current (pauses.py)."""
        raw_id = await self.registry.resolve(run_id)
        participation = self._joined(raw_id)
        await self.offload(self.paused.pause, raw_id)  # an fsync'd file: off the event loop
        participation.paused = True
        machine = participation.machine
        after = machine.current.number if machine.current is not None else machine.state_round
        return {"run_id": format_run_id(raw_id), "paused": True, "after_round": after}

    async def _rpc_resume(self, run_id: str) -> dict[str, Any]:
        """Contribute again, from the next round this node can join, with the state it holds;
        {"run_id", "paused": False, "round": the round of that state}."""
        raw_id = await self.registry.resolve(run_id)
        participation = self._joined(raw_id)
        await self.offload(self.paused.resume, raw_id)
        participation.paused = False
        return {"run_id": format_run_id(raw_id), "paused": False, "round": participation.machine.state_round}

    async def _rpc_admit(self, run_id: str, peer_ids: list[str]) -> dict[str, Any]:
        """Vouch for keys in a run we take part in (an `admit` op each): the creator's admit them
        (admission "creator" or "open"); in a run with admission "electorate", more than two thirds
        of the electorate's do. An admitted key has a say from the round its join is admitted in."""
        raw_id = await self.registry.resolve(run_id)
        self._joined(raw_id)
        if not isinstance(peer_ids, list) or not 0 < len(peer_ids) <= 64:
            raise RpcError.invalid_params("peer_ids must list 1 to 64 peer IDs")
        try:
            keys = [public_key_from_peer_id(peer) for peer in peer_ids]
        except (ProtocolError, TypeError, ValueError):
            raise RpcError.invalid_params("peer_ids must list peer IDs (as `locomesh status` prints them)") from None
        written = self.crdt.write_batch(raw_id, [("admit", {"key": key}) for key in keys])
        if len(written) != len(keys):
            raise RpcError(-32000, "the run refused the admissions now (see the node's log)")
        return {"run_id": format_run_id(raw_id), "admitted": peer_ids}

    async def _rpc_status(self, run_id: str) -> dict[str, Any]:
        raw_id = await self.registry.resolve(run_id)
        if raw_id not in self.participations:
            if raw_id in self._rejoining:
                return await self._rejoining_status(raw_id)
            return await self._left_status(raw_id)
        participation = self._joined(raw_id)
        return {**participation.status(), "training": True, "member_peers": self._members(participation.replica),
                "device": participation.participant.device, "run_id": format_run_id(raw_id)}

    def _members(self, replica: Replica) -> list[dict[str, Any]]:
        return members_by_peer_id(replica.state.members, self._node.identity.public_key,
                                  lambda peer: peer in self._node.peers)

    async def _left_status(self, run_id: bytes) -> dict[str, Any]:
        """`run.status` of a run this node left: the rounds it finished there, kept in the data dir;
        `RpcError` NOT_JOINED for a run it never trained in."""
        last, history = self._left.get(run_id, (None, None))
        if history is None:  # left before this start
            last = await self.offload(left_after, self._data_dir, run_id)
            if last is not None:
                history = await self.offload(read_history, self._data_dir, run_id, HISTORY)
        if last is None or history is None:
            raise self._not_joined(run_id)
        return {**self._kept_status(run_id, history, last), "phase": "left", "left_after": last}

    async def _rejoining_status(self, run_id: bytes) -> dict[str, Any]:
        """`run.status` of a run joined before this start, until its participation runs: phase
        "rejoining" and the rounds kept in the data dir (NOT_JOINED would read as if it was lost)."""
        history = await self.offload(read_history, self._data_dir, run_id, HISTORY)
        newest = max((record.round for record in history), default=0)
        return {**self._kept_status(run_id, history, newest), "phase": "rejoining"}

    def _kept_status(self, run_id: bytes, history: RoundHistory, last: int) -> dict[str, Any]:
        replica = self.crdt.replicas.get(run_id)
        members = [] if replica is None else self._members(replica)
        return kept_status(run_id, history, last, None if replica is None else replica.state, members, len(self._node.peers))

    async def _rpc_export(self, run_id: str, directory: str) -> dict[str, Any]:
        """Write the run's certified model into `directory` (an absolute path) as the files of a
        checkpoint directory other tools load (`RunParticipation.export`)."""
        raw_id = await self.registry.resolve(run_id)
        if not isinstance(directory, str) or not os.path.isabs(directory):
            raise RpcError.invalid_params("directory must be an absolute path")
        try:
            exported = await self._joined(raw_id).export(Path(directory))
        except ParticipantError as error:
            raise RpcError(BAD_RUN, str(error)) from None
        except OSError as error:
            raise RpcError(-32000, f"cannot write {directory}: {error.strerror}") from None
        return {**exported, "run_id": format_run_id(raw_id), "directory": directory}

    def _joined(self, run_id: bytes) -> RunParticipation:
        if run_id not in self.participations:
            raise self._not_joined(run_id)
        return self.participations[run_id][0]

    def _not_joined(self, run_id: bytes) -> RpcError:
        """Why this node has no part in `run_id`: it knows no such run (a typo, a run of another
        network), or it knows the run but never joined it, and then how to."""
        full = format_run_id(run_id)
        if run_id in self._rejoining:
            return RpcError(NOT_JOINED, f"rejoining run {short_run_id(run_id)} after the restart: try again once "
                                        f"`locomesh run status {full}` shows it training")
        if not self.registry.knows(run_id):
            return RpcError(RUN_NOT_FOUND, f"no such run: this node knows no run {full} (`locomesh run list` "
                                           "shows the runs it knows, `locomesh run browse` the public ones)")
        return RpcError(NOT_JOINED, f"this node has not joined run {short_run_id(run_id)}; "
                                    f"join it with: locomesh run join {full}")
