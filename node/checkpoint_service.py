"""The checkpoint service: serve local checkpoints' manifests and chunks, and download others'.

Serving (`/locomesh/ckpt/1`, see `checkpoint_wire`): a stream carries any
number of requests. At most `max_uploads` requests are served at once across
all streams; one more gets a ``busy`` answer at once (backpressure the asker
understands) instead of queueing unboundedly. The store is the data dir's
``checkpoints/`` (the layout of `locomesh.training.checkpoint`); only a
checkpoint whose manifest is installed is served, so a half-downloaded one is
not offered.

The same requests are served on the data plane (`dataplane`: a TCP listener
beside libp2p, every byte sealed with keys agreed over libp2p), which carries
bulk data several times faster than a Yamux stream; askers fall back to
libp2p streams where it cannot be reached.

Downloading: `checkpoint.fetch {id, providers}` starts `download_checkpoint`
in the service's nursery and returns its progress; `checkpoint.progress`,
`checkpoint.cancel`, `checkpoint.list` and `checkpoint.peers` (reputations)
complete the RPC surface, and ``node.status`` shows the downloads under
``checkpoints``. Providers are peer IDs (already known to the node) or
multiaddrs ending in ``/p2p/<peer id>``; the DHT fills this list later.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import trio

from locomesh.training.checkpoint_manifest import CheckpointError, Manifest, read_manifest

from . import checkpoint_wire as wire
from .checkpoint_download import MAX_WINDOW, TRANSPORTS, DownloadError, DownloadProgress, checkpoint_store, download_checkpoint, parse_provider
from .dataplane import DataPlaneServer
from .peer_scores import PeerScores
from .rpc import RpcError
from .runtime import Node

logger = logging.getLogger(__name__)

MAX_UPLOADS = 16
IDLE_TIMEOUT = 60.0  # a stream with no request for this long is closed
FRAME_TIMEOUT = 30.0
MAX_PROVIDERS = 64
MAX_KEPT_DOWNLOADS = 32
MAX_STREAMS = 16  # per provider; py-libp2p allows 256 outbound streams per connection in all
_MANIFEST_CACHE = 32
_HASH_HEX = 64


class CheckpointService:
    name = "checkpoints"

    def __init__(self, directory: str | Path, *, max_uploads: int = MAX_UPLOADS, dataplane: bool = True) -> None:
        self.directory = Path(directory)
        self.dataplane = dataplane
        self._uploads = trio.Semaphore(max_uploads)
        self._manifests: OrderedDict[bytes, Manifest] = OrderedDict()
        self.downloads: dict[bytes, DownloadProgress] = {}
        self._cancel_scopes: dict[bytes, trio.CancelScope] = {}
        self.scores: PeerScores | None = None
        self._node: Node | None = None
        self._nursery: trio.Nursery | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.scores = PeerScores(node.metrics)
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
                await nursery.start(DataPlaneServer(_listen_host(node), self.serve_requests).run, node)
            task_status.started()
            await trio.sleep_forever()

    # --- serving ---------------------------------------------------------------------------

    async def _serve(self, stream: Any) -> None:
        await self.serve_requests(stream, wire.remote_peer(stream))

    async def serve_requests(self, stream: Any, peer_id: str) -> None:
        """Answer `peer_id`'s requests on `stream` (libp2p or data plane) until it closes it or idles."""
        assert self._node is not None
        while True:
            request = await wire.next_request(stream, peer_id, idle_timeout=IDLE_TIMEOUT)
            if request is None:
                return
            try:
                self._uploads.acquire_nowait()
            except trio.WouldBlock:
                self._served.inc(answer=wire.BUSY)
                await wire.answer(stream, self._node.identity, wire.BUSY, timeout=FRAME_TIMEOUT)
                continue
            try:
                payload = await trio.to_thread.run_sync(self._read, request)
                status = wire.NOT_FOUND if payload is None else wire.OK
                self._served.inc(answer=status if request.index is None else f"chunk-{status}")
                await wire.answer(stream, self._node.identity, status, payload or b"", timeout=FRAME_TIMEOUT)
            finally:
                self._uploads.release()

    def _read(self, request: wire.Request) -> bytes | None:
        """The bytes a request asks for from the local store, or None if it is not here (runs in a thread)."""
        store = checkpoint_store()
        try:
            manifest = self._manifest(store, request.checkpoint_id)
        except (OSError, CheckpointError):
            return None
        if request.index is None:
            return manifest.encode()
        if request.index >= len(manifest.chunks):
            return None
        ref = manifest.chunks[request.index]
        try:
            data = store.chunk_path(self.directory, ref.hash).read_bytes()
        except OSError:
            return None
        return data if len(data) == ref.size else None

    def _manifest(self, store: Any, checkpoint_id: bytes) -> Manifest:
        """An installed manifest, parsed once and kept in a small cache (parsing recomputes its Merkle root)."""
        manifest = self._manifests.get(checkpoint_id)
        if manifest is None:
            data = store.manifest_path(self.directory, checkpoint_id).read_bytes()
            manifest = read_manifest(data, expected_id=checkpoint_id)
            self._manifests[checkpoint_id] = manifest
            while len(self._manifests) > _MANIFEST_CACHE:
                self._manifests.popitem(last=False)
        return manifest

    # --- downloading -----------------------------------------------------------------------

    def start_download(
        self, checkpoint_id: bytes, providers: list[str], *, streams: int = MAX_WINDOW, transport: str = "auto"
    ) -> DownloadProgress:
        """Start downloading `checkpoint_id` unless a download of it is under way; its progress."""
        current = self.downloads.get(checkpoint_id)
        if current is not None and current.state in ("manifest", "chunks"):
            return current
        assert self._nursery is not None, "the service is not running"
        progress = DownloadProgress(checkpoint_id)
        self.downloads.pop(checkpoint_id, None)
        self.downloads[checkpoint_id] = progress
        self._forget_old_downloads()
        self._nursery.start_soon(self._download, checkpoint_id, providers, progress, streams, transport)
        return progress

    def _forget_old_downloads(self) -> None:
        """Keep the progress of at most MAX_KEPT_DOWNLOADS downloads: the running ones and the latest finished."""
        finished = [key for key, progress in self.downloads.items() if progress.state not in ("manifest", "chunks")]
        for key in finished[: max(0, len(self.downloads) - MAX_KEPT_DOWNLOADS)]:
            del self.downloads[key]

    async def _download(
        self, checkpoint_id: bytes, providers: list[str], progress: DownloadProgress, streams: int, transport: str
    ) -> None:
        assert self._node is not None and self.scores is not None
        with trio.CancelScope() as scope:
            self._cancel_scopes[checkpoint_id] = scope
            try:
                await download_checkpoint(
                    self._node, self.directory, checkpoint_id, providers, scores=self.scores, progress=progress,
                    max_window=streams, transport=transport,
                )
                logger.info("checkpoint %s downloaded", checkpoint_id.hex())
            except (DownloadError, OSError) as error:
                progress.state, progress.error = "failed", str(error)
                logger.warning("checkpoint %s: download failed: %s", checkpoint_id.hex(), error)
            finally:
                self._cancel_scopes.pop(checkpoint_id, None)
        if scope.cancelled_caught:
            progress.state = "cancelled"

    # --- RPC and status --------------------------------------------------------------------

    async def _rpc_fetch(
        self, id: str, providers: list[str], streams: int = MAX_WINDOW, transport: str = "auto"
    ) -> dict[str, Any]:
        """Start a download (`streams`: requests in flight per provider at most; `transport`: auto,
        dataplane or libp2p) and return its progress."""
        if transport not in TRANSPORTS:
            raise RpcError.invalid_params(f"transport must be one of {', '.join(TRANSPORTS)}")
        checkpoint_id = _parse_id(id)
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
            raise RpcError.invalid_params(f"streams must be an integer in [1, {MAX_STREAMS}]")
        if not isinstance(providers, list) or not 1 <= len(providers) <= MAX_PROVIDERS:
            raise RpcError.invalid_params(f"providers must be a list of 1 to {MAX_PROVIDERS} peer IDs or multiaddrs")
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
        return await trio.to_thread.run_sync(self._list)

    def _list(self) -> list[dict[str, Any]]:
        store = checkpoint_store()
        listed = []
        for path in sorted((self.directory / "manifests").glob("*.msgpack")):
            try:
                manifest = self._manifest(store, bytes.fromhex(path.name.removesuffix(".msgpack")))
            except (ValueError, OSError, CheckpointError):
                continue  # not a manifest of ours (or damaged): not listed, not served
            listed.append({"id": manifest.id.hex(), "round": manifest.round, "run": manifest.run.hex(),
                           "chunks": len(manifest.chunks), "raw_size": manifest.raw_size})
        return listed

    def _status(self) -> dict[str, Any]:
        return {
            "downloads": [progress.to_json() for progress in self.downloads.values()],
            "chunks_served": int(self._served.get(answer="chunk-ok")),
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
