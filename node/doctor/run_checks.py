"""The run half of ``locomesh doctor RUN_ID``: can this node take part in that run, from here, now?

In order: the run's manifest (known here, or from the DHT); its members (from the run's CRDT when
this node replicates it, else the peers that announce the run in the DHT); whether each of a few
(`MAX_MEMBERS_TRIED`) is reachable from here (connected, or a fresh dial, through a relay where
needed); round trips and download bandwidth to a few of those (`MAX_MEMBERS_MEASURED`, with the
bounded probe of `probe.py`); the run's memory footprint against the node's limit and the memory
available (`memory.py`); and the prediction of a round's time against the run's deadline
(`prediction.py`). Each step is bounded in time; a failure in one becomes a check, never an
exception out of the RPC.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from locomesh.dht import records
from locomesh.protocol import ProtocolError, peer_id_from_public_key
from locomesh.protocol.runs import format_run_id, load_manifest
from locomesh.training.run_settings import ParticipantError

from locomesh.node.config import human_size
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import DialError, Node

from .checks import Check, fail, ok, warn
from .memory import verdict_for
from .prediction import predict, time_inner_steps
from .probe import ProbeBusy, measure_download

logger = logging.getLogger(__name__)

LOOKUP_TIMEOUT = 10.0
DIAL_TIMEOUT = 8.0
MEASURE_TIMEOUT = 15.0
MAX_MEMBERS_TRIED = 8
MAX_MEMBERS_MEASURED = 3

Offload = Callable[..., Awaitable[Any]]


@dataclass
class MemberReport:
    peer_id: str
    reachable: bool = False
    how: str = ""  # "connected", "dialled", "relayed", or why not
    rtt_ms: float | None = None
    download_bps: float | None = None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class RunReport:
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


class RunDoctor:
    """Checks one run for the node; see the module docstring."""

    def __init__(self, node: Node, registry: Any, crdt: Any, *, device: str, memory_limit: int,
                 offload: Offload = trio.to_thread.run_sync) -> None:
        self.node = node
        self.registry = registry
        self.crdt = crdt
        self.device = device
        self.memory_limit = memory_limit
        self.offload = offload

    async def check(self, run_id: str) -> RunReport:
        report = RunReport()
        try:
            with trio.fail_after(LOOKUP_TIMEOUT):
                raw = await self.registry.resolve(run_id, look_up=True)  # the IDs browse prints, too
        except (RpcError, trio.TooSlowError) as error:
            reason = error.message if isinstance(error, RpcError) else "the directory of public runs did not answer in time"
            report.checks.append(fail("run", f"{run_id[:60]!r}: {reason}",
                                      "copy the ID from `locomesh run list`, `locomesh run browse` or the run's creator"))
            return report
        report.facts["run_id"] = format_run_id(raw)
        manifest = await self._manifest(raw, report)
        if manifest is None:
            return report
        body = load_manifest(manifest)[1].body
        progress = await self._progress(format_run_id(raw))
        if progress is not None:
            report.checks.append(progress)
        members = await self._members(raw)
        report.facts["members"] = len(members)
        tried = await self._reach(members[:MAX_MEMBERS_TRIED])
        report.checks.append(_members_check(members, tried))
        await self._measure([member for member in tried if member.reachable][:MAX_MEMBERS_MEASURED])
        report.facts["member_reports"] = [member.as_dict() for member in tried]
        report.checks.append(_link_check(tried))
        footprint = await self._memory(body, max(len(members) + 1, 1), report)
        if footprint is not None:
            await self._prediction(body, footprint, tried, report)
        return report

    async def _progress(self, run_id: str) -> Check | None:
        """Whether the run certifies rounds here (`run.status` of this node's participation), or
        None if this node does not train in it."""
        try:
            status = await self.node.rpc.call("run.status", {"run_id": run_id})
        except RpcError:
            return None
        return progress_check(status)

    async def _manifest(self, raw: bytes, report: RunReport) -> bytes | None:
        with trio.move_on_after(LOOKUP_TIMEOUT):
            try:
                run, source = await self.registry.find(raw)
            except RpcError as error:  # not found, or the DHT lookup failed
                logger.debug("run lookup failed: %s", error.message)
            else:
                report.checks.append(ok("run", "known to this node" if source == "local" else "found in the DHT"))
                return run.manifest
            report.checks.append(fail("run", "not found: this node does not know the run and the DHT gave no record",
                                      "check the ID; if the run is not public (created without --public), ask its "
                                      "creator for a member's address and start with --bootstrap ADDRESS"))
            return None

    async def _members(self, raw: bytes) -> list[str]:
        """Peer IDs of the run's members other than us: the CRDT's, else the run's DHT providers."""
        replica = self.crdt.replicas.get(raw)
        if replica is not None and replica.state.members:
            peers = [peer_id_from_public_key(key) for key in replica.state.members]
        else:
            peers = []
            if self.registry.discovery is not None:
                with trio.move_on_after(LOOKUP_TIMEOUT):
                    try:
                        found = await self.registry.discovery.find_providers(records.run_key(raw))
                        peers = [str(info.peer_id) for info in found]
                        for info in found:
                            self.node.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 600)
                    except Exception as error:  # noqa: BLE001 - as above
                        logger.debug("provider lookup failed: %s", error)
        return sorted({peer for peer in peers if peer != self.node.peer_id})

    async def _reach(self, peers: list[str]) -> list[MemberReport]:
        reports = [MemberReport(peer) for peer in peers]
        async with trio.open_nursery() as nursery:
            for report in reports:
                nursery.start_soon(self._reach_one, report)
        return reports

    async def _reach_one(self, member: MemberReport) -> None:
        if member.peer_id in self.node.peers:
            member.reachable, member.how = True, "connected"
            return
        relay = next((service for service in self.node.services if service.name == "relay"), None)
        try:
            with trio.fail_after(DIAL_TIMEOUT):
                if relay is None:
                    raise DialError("no relay service to find its addresses")
                member.how = await relay.connect(member.peer_id, await relay.lookup_addrs(member.peer_id))
                member.reachable = True
        except trio.TooSlowError:
            member.error = f"no connection within {DIAL_TIMEOUT:g} s"
        except Exception as error:  # noqa: BLE001 - DialError, RpcError from a lookup: it may be gone
            member.error = str(error)[:300]

    async def _measure(self, members: list[MemberReport]) -> None:
        ping = next((service for service in self.node.services if service.name == "ping"), None)

        async def measure(member: MemberReport) -> None:
            with trio.move_on_after(MEASURE_TIMEOUT):
                try:
                    rtt = await ping.ping(member.peer_id) if ping is not None else 0.0
                    member.rtt_ms = round(rtt * 1000, 3)
                    member.download_bps = round(await measure_download(self.node, member.peer_id, rtt=rtt))
                except (DialError, ProtocolError, ProbeBusy, ValueError) as error:
                    member.error = str(error)[:300]

        async with trio.open_nursery() as nursery:
            for member in members:
                nursery.start_soon(measure, member)

    async def _memory(self, body: dict[str, Any], contributors: int, report: RunReport) -> Any:
        from locomesh.training.footprint import run_footprint  # light: torch loads in the thread, when it runs

        try:
            footprint = await self.offload(lambda: run_footprint(body, contributors=contributors))
        except ParticipantError as error:
            report.checks.append(fail("task", f"this node cannot train the run's task: {error}",
                                      "update locomesh; a user task must be installed on this machine too"))
            return None
        verdict = verdict_for(footprint, self.memory_limit)
        report.facts["footprint"] = footprint.as_dict()
        report.facts["memory"] = verdict.as_dict()
        if verdict.fits:
            report.checks.append(ok("memory", verdict.message()))
        else:
            report.checks.append(fail("memory", verdict.problem(), verdict.fix()))
        return footprint

    async def _prediction(self, body: dict[str, Any], footprint: Any, tried: list[MemberReport],
                          report: RunReport) -> None:
        try:
            timing = await self.offload(time_inner_steps, body, self.device)
        except Exception as error:  # noqa: BLE001 - a task, device or dataset this check cannot train
            report.checks.append(warn("round time", f"could not time inner steps here: {type(error).__name__}: "
                                      f"{str(error)[:200]}", "see `locomesh node start --device`"))
            return
        rates = [member.download_bps for member in tried if member.download_bps]
        bandwidth = statistics.median(rates) if rates else None
        prediction = predict(footprint, timing.seconds_per_step, bandwidth)
        report.facts["prediction"] = {**prediction.as_dict(), "seconds_per_step": round(timing.seconds_per_step, 6),
                                      "steps_timed": timing.steps, "device": timing.device,
                                      "bandwidth_bps": bandwidth, "exchange_bytes": footprint.exchange_bytes_down()}
        exchange = ("exchange not measured: no member answered a bandwidth probe" if prediction.exchange_s is None
                    else f"exchange ~{prediction.exchange_s:.1f} s for {human_size(footprint.exchange_bytes_down())}")
        detail = (f"{footprint.inner_steps} inner steps ~{prediction.train_s:.1f} s on {timing.device} "
                  f"({timing.seconds_per_step * 1000:.1f} ms each); {exchange}; deadline {prediction.deadline_s:g} s")
        if prediction.verdict == "too slow":
            report.checks.append(fail("round time", f"would not finish a round in time: {detail}",
                                      "train on a faster device (--device cuda), or join a run with a smaller model "
                                      "or a longer round deadline"))
        elif prediction.verdict == "close":
            report.checks.append(warn("round time", f"close to the deadline: {detail}",
                                      "a faster device or link would leave a margin"))
        else:
            report.checks.append(ok("round time", f"in time: {detail}"))


def progress_check(status: dict[str, Any]) -> Check:
    """A round that has gone its recover deadline uncertified cannot advance: a failure, with its
    cause and a fix (node/rounds/status.py: `stuck`)."""
    waiting = status.get("waiting") or {}
    stuck = waiting.get("stuck")
    if not stuck:
        return ok("round progress", f"round {status.get('certified', 0) + 1} is under way "
                                    f"({status.get('certified', 0)} certified)")
    return fail("round progress", stuck["cause"], stuck["fix"])


def _members_check(members: list[str], tried: list[MemberReport]) -> Check:
    if not members:
        return warn("members", "no other member found (the run is new, or its members are offline)",
                    "nothing to do if you start the run; otherwise retry once a member is online")
    reached = [member for member in tried if member.reachable]
    shown = f"{len(reached)}/{len(tried)} members reachable from here" + (
        f" (tried {len(tried)} of {len(members)})" if len(tried) < len(members) else "")
    if not reached:
        errors = "; ".join(f"{member.peer_id[:16]}: {member.error}" for member in tried[:3])
        return fail("members", f"{shown}: {errors}",
                    "check the network connection; a member behind a NAT needs a relay both of you reach")
    return ok("members", shown) if len(reached) == len(tried) else warn(
        "members", shown, "the unreachable ones may be offline; if many are, check your firewall")


def _link_check(tried: list[MemberReport]) -> Check:
    measured = [member for member in tried if member.download_bps]
    if not measured:
        return warn("links", "no bandwidth measured to any member", "retry in a minute (members answer a few probes "
                    "a minute)")
    parts = [f"{member.peer_id[:16]}: {member.rtt_ms:.0f} ms, {human_size(int(member.download_bps))}/s"
             for member in measured]
    return ok("links", "; ".join(parts))
