"""Scenario `checkpoint`: one seeder, many joiners, limited uplinks; and what k providers are worth.

Every node runs the daemon's `CheckpointService` (serving and downloading
real checkpoints: `locomesh.node.transfer.store` chunks, verified by hash,
installed atomically) and a `Discovery` it announces to, on a real host over
the simulated network. Every node has the same access link: `uplink` bytes/s
up (100 Mbit/s by default), `downlink` down (1 Gbit/s), so a provider's
upload is the bottleneck, as on home connections.

The checkpoint data plane (`node/transfer/dataplane.py`, a raw TCP side channel) does
not exist in the simulator, which carries libp2p connections only; the
service runs with ``dataplane=False`` and every chunk travels on a libp2p
(Yamux) stream. Store work (hashing, file writes) runs inline
(`netsim.offload.run_inline`): in a worker thread its real duration
would let virtual time run ahead and the same seed would not give the same
run. Files go to a temporary directory, removed afterwards.

Part 1, the swarm, in virtual time:

1. The seeder starts with a checkpoint of a small model (`model_width`;
   `chunk_size` chunks) and announces it in the DHT.
2. Joiners start at random times over `join_window` seconds. Each
   bootstraps its DHT off the seeder, then downloads the checkpoint *with
   no providers given*: the service looks them up (`Discovery.find_providers`),
   downloads from all it found at once, and on success announces the
   checkpoint itself, so later joiners find more providers than the seeder.

Part 2, the multi-source figure: `probe_providers` fresh nodes each hold the
same larger checkpoint (`probe_size` bytes, written locally: the same bytes
give the same ID); for k = 1..`probe_providers`, a fresh downloader, already
connected to the first k of them, downloads it from exactly those k, one k
at a time so that nothing else competes. The rate is the checkpoint's bytes
over the virtual time from the first chunk request to the last chunk stored;
the target is at least 0.8 k times the rate from one provider (the benchmark's,
`bench/netsim_checkpoint.py`). The verdict: every joiner installed the
checkpoint, and each added provider made the download faster.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import trio

from locomesh.dht.discovery import Discovery
from locomesh.node.transfer.download import DownloadProgress
from locomesh.node.transfer.service import CheckpointService

from .. import clock
from ..links import Capacity, LinkProfile
from ..node import SimNode
from ..offload import run_inline
from ..report import counted, criterion, glossary, percentile, table, verdict
from ..simulation import Simulation, run_simulation
from . import glossaries
from .options import option

Progress = Callable[[str], None]
MEGABIT = 1_000_000 / 8
POLL = 0.002  # virtual seconds between looks at a running download (the timing resolution)


@dataclass(frozen=True)
class Config:
    nodes: int = 50  # seeder and joiners
    uplink: float = option(100 * MEGABIT, "every node's upload capacity, bytes per second (100 Mbit/s)")
    downlink: float = option(1000 * MEGABIT, "every node's download capacity, bytes per second (1 Gbit/s)")
    latency: float = option(0.02, "one-way delay of every node's link, seconds")
    # In-flight bytes per connection (a TCP socket's buffer): Linux grows it to several MB for bulk
    # transfers; netsim's 256 KiB default would cap one connection at 256 KiB per round trip.
    buffer: int = option(4 * 1024 * 1024, "bytes in flight per connection (a TCP socket's buffer)")
    model_width: int = option(256, "size of the swarm's checkpoint: a 3-layer model, width x width "
                                   "(about 0.8 MB at 256)")
    chunk_size: int = option(64 * 1024, "bytes per chunk of the swarm's checkpoint")
    join_window: float = option(30.0, "virtual seconds over which the joiners start, at random times")
    download_timeout: float = option(300.0, "virtual seconds a joiner gets to install the checkpoint")
    probe_providers: int = option(4, "part 2: download one checkpoint from 1, 2, .. this many providers "
                                     "(0: skip part 2)")
    probe_size: int = option(16 * 1024 * 1024, "part 2: bytes of that checkpoint")
    probe_chunk_size: int = option(256 * 1024, "part 2: bytes per chunk")
    probe_streams: int = option(8, "part 2: chunk requests in flight per provider (enough to fill a 100 Mbit/s "
                                   "uplink at 40 ms round trip)")


@dataclass
class _Download:
    name: str
    started: float
    seconds: float | None = None
    providers: int = 0
    from_seeder: int = 0  # chunks
    chunks: int = 0
    error: str | None = None


@dataclass
class _Probe:
    k: int
    seconds: float
    size: int
    chunks_by_provider: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.size / self.seconds


@dataclass
class _Member:
    node: SimNode
    service: CheckpointService
    discovery: Discovery | None = None


def model_state(width: int, seed: int) -> dict[str, torch.Tensor]:
    """The state dict of a small MLP (three width x width layers), initialised from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width), torch.nn.GELU(),
        torch.nn.Linear(width, width),
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, width**-0.5, generator=generator)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


class _Run:
    """The state of one `checkpoint` run."""

    def __init__(self, sim: Simulation, config: Config, directory: Path, progress: Progress) -> None:
        self.sim, self.config, self.directory, self.progress = sim, config, directory, progress
        self.rng = sim.rng_for("checkpoint")
        self.members: dict[str, _Member] = {}
        self.downloads: list[_Download] = []
        self.probes: list[_Probe] = []
        self.checkpoint_id = b""
        self.checkpoint_chunks = 0

    # --- population -----------------------------------------------------------------------------

    def _add(self, name: str) -> _Member:
        profile = LinkProfile(latency=self.config.latency, buffer=self.config.buffer)
        capacity = Capacity(upload=self.config.uplink, download=self.config.downlink)
        node = self.sim.add_node(name, profile=profile, capacity=capacity)
        service = CheckpointService(self.directory / name, dataplane=False, offload=run_inline,
                                    discovery=lambda: self.members[name].discovery)
        member = self.members[name] = _Member(node, service)
        return member

    async def _bring_up(self, member: _Member, *, dht: bool) -> None:
        await self.sim.start(member.node)
        assert member.node.nursery is not None and member.node.node is not None
        if dht:
            rng = random.Random(self.rng.getrandbits(64))
            member.discovery = Discovery(member.node.host, member.node.identity, clock=clock.wall, rng=rng)
            await member.node.nursery.start(member.discovery.run)
        await member.node.nursery.start(member.service.run, member.node.node)

    # --- part 1: the swarm ----------------------------------------------------------------------

    async def swarm(self) -> None:
        seeder = self._add("seeder")
        state = model_state(self.config.model_width, self.sim.seed)
        manifest = _write(seeder.service.directory, state, self.config.chunk_size)
        self.checkpoint_id, self.checkpoint_chunks = manifest.id, len(manifest.chunks)
        await self._bring_up(seeder, dht=True)
        joiners = [self._add(f"n{index:04d}") for index in range(self.config.nodes - 1)]
        self.progress(f"seeder up with {self.checkpoint_chunks} chunks ({manifest.raw_size} bytes); "
                      f"{len(joiners)} joiners")
        async with trio.open_nursery() as nursery:
            for member in joiners:
                nursery.start_soon(self._join, member, seeder, self.rng.uniform(0, self.config.join_window))
        done = sum(1 for download in self.downloads if download.seconds is not None)
        self.progress(f"t={trio.current_time():.1f}s: swarm done, {done}/{len(joiners)} joiners have the checkpoint")

    async def _join(self, member: _Member, seeder: _Member, at: float) -> None:
        await trio.sleep_until(at)
        await self._bring_up(member, dht=True)
        assert member.discovery is not None
        record = _Download(member.node.name, trio.current_time())
        self.downloads.append(record)
        with trio.move_on_after(self.config.download_timeout):
            await member.node.connect(seeder.node.peer_id, seeder.node.listen_addr)
            await member.discovery.wait_seeded()
            progress = member.service.start_download(self.checkpoint_id, [], transport="libp2p")
            await _finished(progress)
        progress = member.service.downloads.get(self.checkpoint_id)
        if progress is None or progress.state != "done":
            record.error = "timeout" if progress is None or progress.error is None else progress.error
            return
        record.seconds = trio.current_time() - record.started
        record.providers = len(progress.providers)
        record.chunks = progress.chunks_fetched
        record.from_seeder = progress.providers.get(seeder.node.identity.peer_id, {}).get("stored", 0)

    # --- part 2: k providers --------------------------------------------------------------------

    async def probe(self) -> None:
        config = self.config
        holders = [self._add(f"holder{index}") for index in range(config.probe_providers)]
        blob = np.random.default_rng(self.sim.seed).integers(0, 256, config.probe_size, dtype=np.uint8)
        probe_id = b""
        for holder in holders:
            probe_id = _write(holder.service.directory, {"blob": torch.from_numpy(blob)}, config.probe_chunk_size).id
            await self._bring_up(holder, dht=False)
        for k in range(1, config.probe_providers + 1):
            downloader = self._add(f"probe{k}")
            await self._bring_up(downloader, dht=False)
            for holder in holders[:k]:
                await downloader.node.connect(holder.node.peer_id, holder.node.listen_addr)
            providers = [holder.node.identity.peer_id for holder in holders[:k]]
            progress = downloader.service.start_download(
                probe_id, providers, streams=config.probe_streams, transport="libp2p"
            )
            with trio.move_on_after(config.download_timeout):
                seconds = await _finished(progress)
            if progress.state != "done":
                raise RuntimeError(f"probe download from {k} providers failed: {progress.error or 'timeout'}")
            chunks = [progress.providers[peer]["stored"] for peer in providers]
            self.probes.append(_Probe(k, seconds, config.probe_size, chunks))
            self.progress(f"t={trio.current_time():.1f}s: {k} provider(s): {config.probe_size / seconds / 1e6:.2f} MB/s")
            downloader.node.crash()  # gone: it must not serve the next probe

    # --- reporting ------------------------------------------------------------------------------

    def report(self) -> dict:
        return {
            "scenario": "checkpoint",
            "overview": self._overview(),
            "verdict": verdict(self._criteria()),
            "config": asdict(self.config),
            "summary": self._summary(),
            "tables": [self._swarm_table(), self._probe_table()],
            "glossary": glossary(glossaries.CHECKPOINT),
        }

    def _overview(self) -> str:
        done = [download.seconds for download in self.downloads if download.seconds is not None]
        p50 = percentile(done, 50)
        text = (
            f"A seeder held a model checkpoint of {counted(self.checkpoint_chunks, 'chunk')}; "
            f"{counted(len(self.downloads), 'joiner')}, starting over {self.config.join_window:g} virtual seconds, "
            "each looked for providers in the DHT to download it from all of them at once (every node's uplink "
            f"{self.config.uplink / MEGABIT:g} Mbit/s) and, once it had it, served it in turn. "
            f"{len(done)} of {len(self.downloads)} joiners installed it"
            + (f", in {p50:.2f} virtual seconds (median)." if p50 is not None else ".")
        )
        if self.probes:
            last = self.probes[-1]
            text += (f" Downloading {self.config.probe_size / 2**20:g} MiB from {last.k} providers at once was "
                     f"{last.rate / self.probes[0].rate:.2f} times as fast as from one.")
        return text

    def _criteria(self) -> list[dict]:
        done = sum(1 for download in self.downloads if download.seconds is not None)
        judged = [criterion("every joiner installed the checkpoint, each chunk checked against its hash",
                            f"{done} of {len(self.downloads)}", done == len(self.downloads))]
        if len(self.probes) > 1:
            rates = [probe.rate for probe in self.probes]
            judged.append(criterion(
                "each added provider made the download faster",
                ", ".join(f"{rate / 1e6:.2f}" for rate in rates) + f" MB/s from k = 1..{len(rates)}",
                all(later > earlier for earlier, later in zip(rates, rates[1:]))))
        return judged

    def _summary(self) -> dict:
        done = [download for download in self.downloads if download.seconds is not None]
        seconds = [download.seconds for download in done]
        fetched = sum(download.chunks for download in done)
        one = self.probes[0].rate if self.probes else None
        return {
            "seed": self.sim.seed,
            "nodes": self.config.nodes,
            "uplink Mbit/s": round(self.config.uplink / MEGABIT, 1),
            "checkpoint chunks": self.checkpoint_chunks,
            "joiners": len(self.downloads),
            "joiners done": len(done),
            "download time p50 s": _rounded(percentile(seconds, 50)),
            "download time p90 s": _rounded(percentile(seconds, 90)),
            "share of chunks served by the seeder": round(sum(d.from_seeder for d in done) / fetched, 3) if fetched else None,
            "providers per download (mean)": round(sum(d.providers for d in done) / len(done), 2) if done else None,
            "k-provider speedup at k=max": round(self.probes[-1].rate / one, 3) if self.probes else None,
            "virtual seconds": round(trio.current_time(), 3),
        }

    def _swarm_table(self) -> dict:
        rows = []
        ordered = sorted(self.downloads, key=lambda download: download.started)
        quarter = max(1, len(ordered) // 4)
        for index in range(0, len(ordered), quarter):
            group = ordered[index : index + quarter]
            done = [download for download in group if download.seconds is not None]
            seconds = [download.seconds for download in done]
            rows.append([
                f"{index + 1}-{index + len(group)}", len(group), len(done),
                _rounded(percentile(seconds, 50)), _rounded(max(seconds, default=None)),
                round(sum(d.providers for d in done) / len(done), 2) if done else None,
                sum(d.from_seeder for d in done), sum(d.chunks for d in done),
            ])
        return table(
            "Swarm: joiners in order of arrival (providers found in the DHT)",
            ["joiners", "count", "done", "p50 s", "max s", "providers (mean)", "chunks from seeder", "chunks in all"],
            rows,
            note="Time from a joiner's start (DHT bootstrap and provider lookup included) to the checkpoint installed.",
        )

    def _probe_table(self) -> dict:
        one = self.probes[0].rate if self.probes else 0.0
        rows = [
            [probe.k, round(probe.seconds, 4), round(probe.rate / 1e6, 3), round(probe.rate / one, 3),
             round(probe.rate / one / probe.k, 3), " / ".join(map(str, probe.chunks_by_provider))]
            for probe in self.probes
        ]
        return table(
            f"Downloading {self.config.probe_size} bytes from k providers (uplink {self.config.uplink / MEGABIT:g} Mbit/s each)",
            ["k", "seconds", "MB/s", "speedup", "speedup / k", "chunks per provider"],
            rows,
            note="Seconds: first chunk request to last chunk stored (virtual). speedup: the rate over the rate from "
            "one provider; speedup / k: the share of the ideal (bench/netsim_checkpoint.py's target: >= 0.8).",
        )


def _write(directory: Path, tensors: dict, chunk_size: int):  # a Manifest
    from locomesh.node.transfer.store import write_checkpoint

    return write_checkpoint(directory, tensors, {"round": 1, "run": b""}, chunk_size=chunk_size)


async def _finished(progress: DownloadProgress) -> float:
    """Wait until `progress` ends; the virtual seconds it spent fetching chunks."""
    while progress.state == "manifest":
        await trio.sleep(POLL)
    started = trio.current_time()
    while progress.state == "chunks":
        await trio.sleep(POLL)
    return trio.current_time() - started


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def run(*, nodes: int = 50, seed: int = 0, progress: Progress = lambda line: None, **options: object) -> dict:
    """Run the scenario and return its report."""
    config = Config(nodes=nodes, **options)  # type: ignore[arg-type]
    if config.nodes < 2:
        raise ValueError("need at least 2 nodes (the seeder and a joiner)")

    async def main(sim: Simulation) -> dict:
        with tempfile.TemporaryDirectory(prefix="locomesh-netsim-") as directory:
            state = _Run(sim, config, Path(directory), progress)
            await state.swarm()
            if config.probe_providers:
                await state.probe()
            return state.report()

    return run_simulation(seed, main)
