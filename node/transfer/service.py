"""The checkpoint service: serve local checkpoints' manifests and chunks, and download others'.

Serving (`/locomesh/ckpt/1`, see `wire`): a stream carries any
number of requests. Each answer holds an upload slot (`slots`): at most
`max_uploads` across all streams, `uploads_per_peer` of them by one peer,
`stranger_uploads` by peers with no standing in a run here (`is_member`),
each for as long as its size allows at a minimum rate; a request that finds
no slot gets a ``busy`` answer at once (backpressure the asker understands)
instead of queueing unboundedly, and an answer not written in time has its
stream reset. What is served: the checkpoints
held in memory (`held`: a round's payloads, see held.py), then the store, the
data dir's ``checkpoints/`` (`locomesh.node.transfer.store`); only a
checkpoint whose every chunk is here (in the store, whose manifest is
installed) is served, so a half-downloaded one is not offered.

The same requests are served on the data plane (`dataplane`: a TCP listener
beside libp2p, every byte sealed with keys agreed over libp2p), which carries
bulk data several times faster than a Yamux stream; askers fall back to
libp2p streams where it cannot be reached.

Downloading: `checkpoint.fetch {id, providers}` starts `download_checkpoint`
in the service's nursery and returns its progress; `checkpoint.progress`,
`checkpoint.cancel`, `checkpoint.list` and `checkpoint.peers` (reputations)
complete the RPC surface, and ``node.status`` shows the downloads under
``checkpoints``. Providers are peer IDs (already known to the node) or
multiaddrs ending in ``/p2p/<peer id>``.

The DHT (given as `discovery`, a callable returning the node's `Discovery`
once it runs): every installed checkpoint is announced as a provider record
under `records.checkpoint_key` (`Discovery.provide`, which also republishes
it well before it expires). Checkpoints written here by others (the round
service) are picked up by a scan every `ANNOUNCE_INTERVAL` s; a finished
download is announced at once. A download given no providers looks them up
with `Discovery.find_providers` (one entry per peer, never ourselves).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio
from libp2p.peer.id import ID

from locomesh.dht import records
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol import ProtocolError
from locomesh.training.checkpoint_manifest import CheckpointError, Manifest

from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.download import (
    MAX_WINDOW, TRANSPORTS, DownloadError, DownloadProgress, Offload, download_checkpoint, parse_provider,
)
from locomesh.node.transfer.dataplane import DataPlaneServer
from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.transfer.slots import (
    MAX_STRANGER_UPLOADS, MAX_UPLOADS, MAX_UPLOADS_PER_PEER, MemberTest, UploadSlots, write_deadline,
)
from locomesh.node.transfer.states import RUNNING_STATES
from locomesh.node.transfer.store import checkpoint_ids, read_stored_chunk, read_stored_manifest
from locomesh.node.peer_scores import PeerScores
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runtime import Node
from locomesh.node.streams import reset_quietly

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = 60.0  # a stream with no request for this long is closed
FRAME_TIMEOUT = 30.0  # a busy answer (a few bytes, no slot held) must be written within this
MAX_PROVIDERS = 64
MAX_KEPT_DOWNLOADS = 32
MAX_STREAMS = 16  # per provider; py-libp2p allows 256 outbound streams per connection in all
_MANIFEST_CACHE = 32
_HASH_HEX = 64
ANNOUNCE_INTERVAL = 300.0  # how often the store is scanned for checkpoints not announced yet
DISCOVERY_POLL = 1.0  # while the node's DHT is not up yet
PROVIDER_ADDR_TTL = 600  # seconds the addresses in a provider record stay in the peerstore

DiscoverySource = Callable[[], "Discovery | None"]


class CheckpointService:
    name = "checkpoints"

    def __init__(
        self,
        directory: str | Path,
        *,
        max_uploads: int = MAX_UPLOADS,
        uploads_per_peer: int = MAX_UPLOADS_PER_PEER,
        stranger_uploads: int = MAX_STRANGER_UPLOADS,
        is_member: MemberTest | None = None,
        dataplane: bool = True,
        discovery: DiscoverySource | None = None,
        offload: Offload = trio.to_thread.run_sync,
    ) -> None:
        """`discovery`: returns the node's `Discovery` (None until it runs); without it nothing is
        announced and every download needs its providers given. `offload`: how blocking store work runs.
        `is_member(peer ID)`: has that peer standing in a run this node replicates (served before
        strangers, see `slots`); without it every asker is served alike."""
        self.directory = Path(directory)
        self.dataplane = dataplane
        self._discovery = discovery
        self._offload = offload
        self.announced: set[bytes] = set()  # checkpoints whose provider record went out
        self.uploads = UploadSlots(max_uploads, per_peer=uploads_per_peer, strangers=stranger_uploads,
                                   is_member=is_member)
        self._manifests: OrderedDict[bytes, Manifest] = OrderedDict()
        self.held = HeldCheckpoints()  # a round's payloads, fetched into memory (served like the store's)
        self.bytes_served = 0  # manifests and chunks answered, since start
        self.downloads: dict[bytes, DownloadProgress] = {}
        self._cancel_scopes: dict[bytes, trio.CancelScope] = {}
        self.scores: PeerScores | None = None
        self.dataplane_server: DataPlaneServer | None = None
        self._node: Node | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.scores = node.scores
        self._served = node.metrics.counter(
            "locomesh_checkpoint_served_total", "Checkpoint requests answered, by answer.", labels=("answer",)
        )
        node.set_stream_handler(wire.PROTOCOL_ID, self._serve, timeout=None)
        for name, method in {
            "checkpoint.list": self._rpc_list, "checkpoint.fetch": self._rpc_fetch,
            "checkpoint.progress": self._rpc_progress, "checkpoint.cancel": self._rpc_cancel,
            "checkpoint.peers": self._rpc_peers,
        }.items():
            node.rpc.register(name, method)
        node.add_status_field("checkpoints", self._status)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.dataplane:
                self.dataplane_server = DataPlaneServer(_listen_host(node), self.serve_requests, scores=self.scores)
                await nursery.start(self.dataplane_server.run, node)
            if self._discovery is not None:
                nursery.start_soon(self._announce_installed)
            task_status.started()
            await trio.sleep_forever()

    # --- serving ---------------------------------------------------------------------------

    async def _serve(self, stream: Any) -> None:
        await self.serve_requests(stream, wire.remote_peer(stream))

    async def serve_requests(self, stream: Any, peer_id: str) -> None:
        """Answer `peer_id`'s requests on `stream` (libp2p or data plane) until it closes it or idles.
        A request that finds no upload slot for `peer_id` is answered busy; an answer not written
        within its deadline resets `stream` and raises `ProtocolError("timeout")`."""
        assert self._node is not None
        while True:
            request = await wire.next_request(stream, peer_id, idle_timeout=IDLE_TIMEOUT)
            if request is None:
                return
            slot = self.uploads.take(peer_id)
            if slot is None:
                self._served.inc(answer=wire.BUSY)
                await wire.answer(stream, self._node.identity, wire.BUSY, timeout=FRAME_TIMEOUT)
                continue
            try:
                payload = await self._offload(self._read, request)
                status = wire.NOT_FOUND if payload is None else wire.OK
                self._served.inc(answer=status if request.index is None else f"chunk-{status}")
                await self._answer_in_time(stream, peer_id, status, payload or b"")
                self.bytes_served += len(payload or b"")
            finally:
                slot.release()

    async def _answer_in_time(self, stream: Any, peer_id: str, status: str, payload: bytes) -> None:
        """Write the answer within `write_deadline` of its size, or reset `stream` and raise
        `ProtocolError("timeout")`: the slot is not left to a reader that does not read."""
        assert self._node is not None
        deadline = write_deadline(len(payload), upload_cap=self._node.meter.bandwidth.upload.rate,
                                  slots=self.uploads.total)
        with trio.move_on_after(deadline):
            await wire.answer(stream, self._node.identity, status, payload, timeout=deadline)
            return
        # Part of a frame may be out: nothing can follow it on this stream (the connection stays whole).
        self._served.inc(answer="too-slow")
        await reset_quietly(stream)
        raise ProtocolError("timeout", f"{peer_id} did not read {len(payload)} bytes within {deadline:.1f} s")

    def _read(self, request: wire.Request) -> bytes | None:
        """The bytes a request asks for from memory or the local store, or None if it is not here
        (runs in a thread)."""
        try:
            manifest = self._manifest(request.checkpoint_id)
            if request.index is None:
                return manifest.encode()
            if request.index >= len(manifest.chunks):
                return None
            held = self.held.complete(request.checkpoint_id)
            if held is not None:
                return held.frame(request.index)
            data = read_stored_chunk(self.directory, manifest, request.index)
        except CheckpointError:
            return None
        return data if len(data) == manifest.chunks[request.index].size else None

    def _manifest(self, checkpoint_id: bytes) -> Manifest:
        """A held checkpoint's manifest, or an installed one, parsed once and kept in a small cache
        (parsing recomputes its Merkle root)."""
        held = self.held.complete(checkpoint_id)
        if held is not None:
            return held.manifest
        manifest = self._manifests.get(checkpoint_id)
        if manifest is None:
            manifest = read_stored_manifest(self.directory, checkpoint_id)
            self._manifests[checkpoint_id] = manifest
            while len(self._manifests) > _MANIFEST_CACHE:
                self._manifests.popitem(last=False)
        return manifest

    # --- downloading -----------------------------------------------------------------------

    def start_download(
        self, checkpoint_id: bytes, providers: list[str] = (), *, streams: int = MAX_WINDOW, transport: str = "auto"
    ) -> DownloadProgress:
        """Start downloading `checkpoint_id` unless a download of it is under way; its progress.

        With no `providers`, they are looked up in the DHT first."""
        current = self.downloads.get(checkpoint_id)
        if current is not None and current.state in RUNNING_STATES:
            return current
        assert self._nursery is not None, "the service is not running"
        progress = self._keep(DownloadProgress(checkpoint_id))
        self._nursery.start_soon(self._download, checkpoint_id, list(providers), progress, streams, transport)
        return progress

    @contextmanager
    def tracked(self, checkpoint_id: bytes) -> Iterator[DownloadProgress]:
        """A progress for a download made elsewhere (a run's dataset: node/datasets/), shown beside the
        service's own (`checkpoint.progress`, ``node.status``) so that `locomesh run join` can draw it;
        marked failed (or cancelled) if the block ends in an exception before the download is done.
        While another download of the same checkpoint runs, that one stays listed (its progress shows
        the same chunks arriving) and this one's progress is not listed."""
        progress = DownloadProgress(checkpoint_id)
        current = self.downloads.get(checkpoint_id)
        if current is None or current.state not in RUNNING_STATES:
            self._keep(progress)
        try:
            yield progress
        except BaseException as error:
            if progress.state != "done":
                cancelled = isinstance(error, trio.Cancelled)
                progress.state = "cancelled" if cancelled else "failed"
                progress.error = None if cancelled else str(error) or type(error).__name__
            raise

    def _keep(self, progress: DownloadProgress) -> DownloadProgress:
        """List `progress` as its checkpoint's newest download (for RPC and ``node.status``)."""
        self.downloads.pop(progress.checkpoint_id, None)
        self.downloads[progress.checkpoint_id] = progress
        self._forget_old_downloads()
        return progress

    def _forget_old_downloads(self) -> None:
        """Keep the progress of at most MAX_KEPT_DOWNLOADS downloads: the running ones and the latest finished."""
        finished = [key for key, progress in self.downloads.items() if progress.state not in RUNNING_STATES]
        for key in finished[: max(0, len(self.downloads) - MAX_KEPT_DOWNLOADS)]:
            del self.downloads[key]

    async def _download(
        self, checkpoint_id: bytes, providers: list[str], progress: DownloadProgress, streams: int, transport: str
    ) -> None:
        assert self._node is not None and self.scores is not None
        with trio.CancelScope() as scope:
            self._cancel_scopes[checkpoint_id] = scope
            try:
                providers = providers or await self.find_providers(checkpoint_id)
                await download_checkpoint(
                    self._node, self.directory, checkpoint_id, providers, scores=self.scores, progress=progress,
                    max_window=streams, transport=transport, offload=self._offload,
                )
                logger.info("checkpoint %s downloaded", checkpoint_id.hex())
                self._nursery.start_soon(self.announce, checkpoint_id)
            except (DownloadError, OSError) as error:
                progress.state, progress.error = "failed", str(error)
                logger.warning("checkpoint %s: download failed: %s", checkpoint_id.hex(), error)
            finally:
                self._cancel_scopes.pop(checkpoint_id, None)
        if scope.cancelled_caught:
            progress.state = "cancelled"

    # --- the DHT ---------------------------------------------------------------------------

    async def find_providers(self, checkpoint_id: bytes) -> list[str]:
        """Peer IDs of the checkpoint's providers in the DHT, once each, never ours; their addresses
        go into the peerstore so the download can dial them. `DownloadError` if there are none."""
        assert self._node is not None
        discovery = self._discovery() if self._discovery is not None else None
        if discovery is None:
            raise DownloadError("no providers given, and no DHT to look them up in")
        try:
            found = await discovery.find_providers(records.checkpoint_key(checkpoint_id), limit=MAX_PROVIDERS)
        except DiscoveryError as error:
            raise DownloadError(f"looking up providers failed: {error}") from None
        providers: list[str] = []
        for info in found:
            peer = str(info.peer_id)
            if peer == self._node.peer_id or peer in providers:
                continue
            if info.addrs:
                self._node.host.get_peerstore().add_addrs(ID.from_base58(peer), info.addrs, PROVIDER_ADDR_TTL)
            providers.append(peer)
        if not providers:
            raise DownloadError(f"no provider of {checkpoint_id.hex()} found in the DHT")
        return providers

    async def announce(self, checkpoint_id: bytes) -> None:
        """Provide `checkpoint_id` in the DHT (`Discovery` keeps republishing it); once per checkpoint."""
        discovery = self._discovery() if self._discovery is not None else None
        if discovery is None or checkpoint_id in self.announced:
            return
        # `provide` gives up after a while; the key stays with `Discovery`, which republishes it.
        await discovery.provide(records.checkpoint_key(checkpoint_id))
        self.announced.add(checkpoint_id)

    def withdraw(self, checkpoint_id: bytes) -> None:
        """Stop announcing `checkpoint_id` (deleted from the store)."""
        discovery = self._discovery() if self._discovery is not None else None
        if discovery is not None:
            discovery.stop_providing(records.checkpoint_key(checkpoint_id))
        self.announced.discard(checkpoint_id)

    async def _announce_installed(self) -> None:
        """Announce every installed checkpoint, and every `ANNOUNCE_INTERVAL` s the ones added since."""
        assert self._discovery is not None
        while (discovery := self._discovery()) is None:
            await trio.sleep(DISCOVERY_POLL)
        await discovery.wait_seeded()  # a provide before that would reach no peer, only our own store
        while True:
            for checkpoint_id in await self._offload(self._installed_ids):
                await self.announce(checkpoint_id)
            await trio.sleep(ANNOUNCE_INTERVAL)

    def _installed_ids(self) -> list[bytes]:
        return [bytes.fromhex(entry["id"]) for entry in self._list()]

    # --- RPC and status --------------------------------------------------------------------

    async def _rpc_fetch(
        self, id: str, providers: list[str] | None = None, streams: int = MAX_WINDOW, transport: str = "auto"
    ) -> dict[str, Any]:
        """Start a download (`providers`: none or empty to look them up in the DHT; `streams`: requests
        in flight per provider at most; `transport`: auto, dataplane or libp2p) and return its progress."""
        if providers is None or providers == []:
            if self._discovery is None:
                raise RpcError.invalid_params("providers must be given: this node has no DHT")
            providers = []
        if transport not in TRANSPORTS:
            raise RpcError.invalid_params(f"transport must be one of {', '.join(TRANSPORTS)}")
        checkpoint_id = _parse_id(id)
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
            raise RpcError.invalid_params(f"streams must be an integer in [1, {MAX_STREAMS}]")
        if not isinstance(providers, list) or len(providers) > MAX_PROVIDERS:
            raise RpcError.invalid_params(f"providers must be a list of at most {MAX_PROVIDERS} peer IDs or multiaddrs")
        for provider in providers:
            if not isinstance(provider, str):
                raise RpcError.invalid_params("each provider is a string")
            try:
                parse_provider(provider)
            except ValueError as error:
                raise RpcError.invalid_params(str(error)) from None
        return self.start_download(checkpoint_id, providers, streams=streams, transport=transport).to_json()

    async def _rpc_progress(self, id: str) -> dict[str, Any]:
        progress = self.downloads.get(_parse_id(id))
        if progress is None:
            raise RpcError(-32001, f"no download of {id}")
        return progress.to_json()

    async def _rpc_cancel(self, id: str) -> dict[str, Any]:
        scope = self._cancel_scopes.get(_parse_id(id))
        if scope is not None:
            scope.cancel()
        return {"cancelled": scope is not None}

    async def _rpc_peers(self) -> dict[str, Any]:
        assert self.scores is not None
        return self.scores.to_json()

    async def _rpc_list(self) -> list[dict[str, Any]]:
        return await self._offload(self._list)

    def _list(self) -> list[dict[str, Any]]:
        listed = []
        for checkpoint_id in checkpoint_ids(self.directory):
            try:
                manifest = self._manifest(checkpoint_id)
            except CheckpointError:
                continue  # not a manifest of ours (or damaged): not listed, not served
            listed.append({"id": manifest.id.hex(), "round": manifest.round, "run": manifest.run.hex(),
                           "chunks": len(manifest.chunks), "raw_size": manifest.raw_size})
        return listed

    def _status(self) -> dict[str, Any]:
        return {
            "downloads": [progress.to_json() for progress in self.downloads.values()],
            "chunks_served": int(self._served.get(answer="chunk-ok")),
            "bytes_served": self.bytes_served,
            "held": {"checkpoints": len(self.held), "bytes": self.held.bytes_held},
        }


def _listen_host(node: Node) -> str:
    """The IP the data plane listens on: the one libp2p listens on (so it is reachable where libp2p is)."""
    for address in node.listen_addrs:
        try:
            return address.value_for_protocol("ip4")
        except Exception:  # noqa: BLE001 - not an ip4 address
            continue
    return "127.0.0.1"


def _parse_id(value: Any) -> bytes:
    if not isinstance(value, str) or len(value) != _HASH_HEX:
        raise RpcError.invalid_params("id must be a checkpoint ID: 64 hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise RpcError.invalid_params("id must be a checkpoint ID: 64 hex digits") from None
