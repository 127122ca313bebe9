"""Downloading a checkpoint from several providers: the trio layer around `DownloadSchedule`.

`download_checkpoint` fetches the manifest (from the first provider whose
answer hashes to the requested ID), works out which chunks are missing from
the local store (so an interrupted download resumes where it stopped), and
runs `max_window` workers per provider inside one nursery. Each worker holds
one stream to its provider (`ProviderSession`), asks the schedule for a chunk,
fetches it, verifies and stores it (`store_chunk`, in a thread: hashing and
fsync are not for the event loop), and reports the outcome. When every chunk
is stored, the manifest is written last, atomically: only then can the
checkpoint be loaded. A round's payloads go to memory instead (`held`,
`HeldCheckpoints`): the same verification, no file.

A caller that knows what the checkpoint may be (a payload or a state of its run) passes
`ManifestLimits`: the manifest is checked against them the moment it is read, before any chunk
is fetched. A manifest that breaks them hashes to the ID asked for, so every provider would send
the same: the one that sent it is struck and the download fails at once (`CheckpointRefused`,
naming the limit). Without limits the manifest format's own caps are all that hold.

Every request has a timeout (`REQUEST_TIMEOUT` per frame); a provider that
vanishes costs its in-flight chunks a timeout each, then they are fetched
elsewhere. A provider whose chunk fails its hash gets a strike in the node's
`PeerScores` as well as in this download's schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from locomesh.protocol import ProtocolError
from locomesh.training.checkpoint_manifest import (
    MAX_MANIFEST_SIZE, CheckpointError, LimitError, Manifest, ManifestLimits, read_manifest,
)

from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.dataplane import SealedStream, open_sealed_stream
from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.transfer.sinks import DownloadError, HeldSink, Offload, Sink, StoreSink
from locomesh.node.transfer.schedule import DownloadSchedule, Outcome
from locomesh.node.peer_scores import PeerScores
from locomesh.node.runtime import DialError, Node
from locomesh.node.streams import close_quietly, error_code, reset_quietly

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0  # per frame; generous: a busy provider reads its chunks from disk in a thread
BUSY_BACKOFF = 0.2
MAX_WINDOW = 4
TRANSPORTS = ("auto", "dataplane", "libp2p")


class CheckpointRefused(DownloadError):
    """The checkpoint's manifest breaks the caller's `ManifestLimits`: nothing of it was fetched.
    `limit` names the limit (see `LimitError`)."""

    def __init__(self, checkpoint_id: bytes, error: LimitError) -> None:
        super().__init__(f"checkpoint {checkpoint_id.hex()[:16]} refused: {error.reason}")
        self.limit = error.limit


# What says that a checkpoint itself is not what the caller allows (its manifest when it arrives,
# its header when it is loaded): fetching it again, from anyone, gives the same.
REFUSED = (CheckpointRefused, LimitError)


@dataclass
class DownloadProgress:
    """What a download has done so far (shown by RPC and in `node.status`)."""

    checkpoint_id: bytes
    state: str = "manifest"  # one of states.RUNNING_STATES, then of states.ENDED_STATES
    chunks_total: int = 0
    chunks_stored: int = 0  # including the ones stored before (a resumed download)
    chunks_fetched: int = 0  # fetched by this download
    bytes_fetched: int = 0
    bytes_total: int = 0  # the chunks' bytes as stored and sent (0 until the manifest is known)
    error: str | None = None
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_at: float | None = None  # trio clock: when the download began, and when it ended
    done_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id.hex(), "state": self.state, "chunks_total": self.chunks_total,
            "chunks_stored": self.chunks_stored, "chunks_fetched": self.chunks_fetched,
            "bytes_fetched": self.bytes_fetched, "bytes_total": self.bytes_total, "error": self.error,
            "providers": self.providers,
            "seconds": self._seconds(),
        }

    def _seconds(self) -> float | None:
        """From the start of the download to its end (done, failed or cancelled), or to now while it runs."""
        if self.started_at is None:
            return None
        end = self.done_at if self.done_at is not None else trio.current_time()
        return round(end - self.started_at, 4)


@dataclass
class _Route:
    """How one download reaches one provider, shared by all its sessions to it: on `auto`, the data
    plane until it fails once, then libp2p streams (so the failure is logged once per provider)."""

    transport: str


class ProviderSession:
    """One stream to one provider, opened on first use and reopened after a failure.

    `transport`: ``"dataplane"`` (sealed TCP, see `dataplane`), ``"libp2p"``
    (a Yamux stream), or ``"auto"``: the data plane, and libp2p streams to
    this provider for the rest of the download once the data plane has failed
    there (no data plane, refused, reset, timed out, a bad answer). A data
    plane stream is taken from the node's `StreamPool` when one is idle there,
    and given back to it by `close` (stream_pool.py says why). A provider
    whose authenticated data plane connection sends an oversized or unopenable
    frame is struck in `scores`.
    """

    def __init__(
        self, node: Node, peer_id: str, address: Multiaddr | None, transport: str = "auto", *,
        scores: PeerScores | None = None, route: _Route | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.node, self.peer_id, self.address, self.scores = node, peer_id, address, scores
        self._route = route or _Route(transport)
        self._stream: Any = None
        self._untried = False  # the stream came from the pool and has answered no request yet

    @property
    def transport(self) -> str:
        return self._route.transport

    def sibling(self) -> ProviderSession:
        """Another session to the same provider (its own stream), sharing its route."""
        return ProviderSession(
            self.node, self.peer_id, self.address, self.transport, scores=self.scores, route=self._route
        )

    async def _open(self, *, pooled: bool = True) -> Any:
        if self.transport == "libp2p":
            return await self.node.open_stream(self.peer_id, [wire.PROTOCOL_ID])
        stream = await self.node.stream_pool.take(self.peer_id) if pooled else None
        self._untried = stream is not None
        return stream or await open_sealed_stream(self.node, self.peer_id, host_hint=_host_of(self.address))

    async def ask(self, checkpoint_id: bytes, index: int | None, *, max_size: int) -> wire.Reply:
        """One request and its answer; any failure resets the stream and propagates, except that on
        `auto` a failure of the data plane moves this provider to libp2p streams (`_Route`) and the
        request is asked again there."""
        if self._stream is None:
            await self._connect()  # the libp2p connection: both transports need it
        on_dataplane = self.transport == "auto"
        try:
            return await self._ask(checkpoint_id, index, max_size)
        except Exception as error:
            if not (on_dataplane and _is_transport_failure(error)):
                raise
            self._fall_back(error)
        return await self._ask(checkpoint_id, index, max_size)

    async def _ask(self, checkpoint_id: bytes, index: int | None, max_size: int) -> wire.Reply:
        """The request on this session's stream, opened if need be. A stream from the pool that fails
        its first request (it may have died while idle) is replaced by a fresh one, once."""
        try:
            if self._stream is None:
                self._stream = await self._open()
            try:
                reply = await self._request(checkpoint_id, index, max_size)
            except Exception:
                if not self._untried:
                    raise
                await self.close(reset=True)
                self._stream = await self._open(pooled=False)
                reply = await self._request(checkpoint_id, index, max_size)
            self._untried = False
            return reply
        except BaseException:
            await self.close(reset=True)
            raise

    def _fall_back(self, error: Exception) -> None:
        """Use libp2p streams to this provider from now on; say so once; strike a bad frame."""
        code = error_code(error)
        if code in ("too-large", "bad-frame") and self.scores is not None:  # on a connection that proved its keys
            self.scores.strike(self.peer_id, f"data plane: {error}")
        if self._route.transport == "auto":
            logger.info("data plane to %s failed (%s); using libp2p streams", self.peer_id, str(error) or code)
        self._route.transport = "libp2p"

    async def _connect(self) -> None:
        if self.address is not None and self.peer_id not in self.node.peers:
            # The address we were given wins over any the peerstore kept: a provider
            # that restarted listens elsewhere, and py-libp2p would dial only the old one.
            self.node.host.get_peerstore().clear_addrs(ID.from_base58(self.peer_id))
            self.node.forget_failed_dials(self.peer_id)  # and py-libp2p's 60 s refusal after a failed dial
            await self.node.connect(self.address)

    async def _request(self, checkpoint_id: bytes, index: int | None, max_size: int) -> wire.Reply:
        return await wire.ask(
            self._stream, self.node.identity, self.peer_id, checkpoint_id, index,
            max_size=max_size, timeout=REQUEST_TIMEOUT,
        )

    async def close(self, *, reset: bool = False) -> None:
        """Reset the stream, or (after a complete answer) close it: a data plane stream then
        goes back to the node's pool for the next download from this provider."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        with trio.CancelScope(shield=True):  # bounded: each gives up after a short timeout
            if reset:
                await reset_quietly(stream)
            elif isinstance(stream, SealedStream):
                await self.node.stream_pool.give(self.peer_id, stream)
            else:
                await close_quietly(stream)


def _is_transport_failure(error: Exception) -> bool:
    """A failure of the stream or of what came on it (a refusal, a reset, a timeout, bad input), not a bug here."""
    return isinstance(error, (DialError, OSError)) or error_code(error) != "internal"


def _host_of(address: Multiaddr | None) -> str | None:
    for protocol in ("ip4", "ip6"):
        try:
            return address.value_for_protocol(protocol) if address is not None else None
        except Exception:  # noqa: BLE001 - the address has no such part
            continue
    return None


def parse_provider(provider: str) -> tuple[str, Multiaddr | None]:
    """A provider given as a peer ID, or as a multiaddr ending in ``/p2p/<peer id>``: (peer ID, address)."""
    if not provider.startswith("/"):
        return _checked_peer_id(provider), None
    try:
        address = Multiaddr(provider)
        peer_id = address.value_for_protocol("p2p")
    except Exception as error:  # noqa: BLE001 - multiaddr raises many types for bad input
        raise ValueError(f"{provider!r} is not a multiaddr ending in /p2p/<peer id>: {error}") from None
    return _checked_peer_id(peer_id), address


def _checked_peer_id(peer_id: str) -> str:
    try:
        ID.from_base58(peer_id)
    except Exception:  # noqa: BLE001 - base58 and multihash errors of several types
        raise ValueError(f"{peer_id[:80]!r} is not a peer ID") from None
    return peer_id


async def download_checkpoint(
    node: Node,
    directory: Path,
    checkpoint_id: bytes,
    providers: Sequence[str],
    *,
    scores: PeerScores,
    progress: DownloadProgress,
    max_window: int = MAX_WINDOW,
    transport: str = "auto",
    offload: Offload = trio.to_thread.run_sync,
    limits: ManifestLimits | None = None,
    held: HeldCheckpoints | None = None,
) -> Manifest:
    """Download checkpoint `checkpoint_id` from `providers` into the store at `directory`, or into
    memory (`held`) when given; return its manifest.

    Raises `DownloadError` when it cannot finish; chunks already verified stay
    stored (or held), so a later call resumes. Cancelling it leaves the store consistent.
    With `limits`, a checkpoint whose manifest breaks them raises `CheckpointRefused`
    before any chunk is fetched, and its provider is struck.
    """
    progress.started_at = trio.current_time()
    sink = StoreSink(directory, offload) if held is None else HeldSink(held, offload)
    local = await sink.installed(checkpoint_id)
    if local is not None:
        _check_limits(local, limits)
        progress.state, progress.chunks_total, progress.done_at = "done", len(local.chunks), trio.current_time()
        progress.chunks_stored, progress.bytes_total = len(local.chunks), sum(chunk.size for chunk in local.chunks)
        return local
    sessions = {
        peer: ProviderSession(node, peer, address, transport, scores=scores)
        for peer, address in map(parse_provider, providers)
    }
    try:
        manifest = await _fetch_manifest(sessions, checkpoint_id, scores, limits)
        missing = await sink.missing(manifest)
        progress.state, progress.chunks_total = "chunks", len(manifest.chunks)
        progress.chunks_stored = len(manifest.chunks) - len(missing)
        progress.bytes_total = sum(chunk.size for chunk in manifest.chunks)
        wanted = {index: manifest.chunks[index].size for index in missing}
        schedule = DownloadSchedule(wanted, list(sessions), max_window=max_window)
        await _ChunkFetcher(sink, manifest, schedule, sessions, scores, progress).run()
        await sink.install(manifest)
        progress.state, progress.done_at = "done", trio.current_time()
        return manifest
    finally:
        if progress.done_at is None:  # failed or cancelled: its time stops here too
            progress.done_at = trio.current_time()
        for session in sessions.values():
            await session.close()


async def _fetch_manifest(
    sessions: dict[str, ProviderSession], checkpoint_id: bytes, scores: PeerScores, limits: ManifestLimits | None,
) -> Manifest:
    """The manifest from the first provider that has it and sends bytes hashing to `checkpoint_id`;
    `CheckpointRefused` (its sender struck) if it breaks `limits`."""
    problems = []
    for peer, session in sessions.items():
        try:
            reply = await session.ask(checkpoint_id, None, max_size=MAX_MANIFEST_SIZE)
            if reply.status == wire.OK:
                manifest = read_manifest(reply.payload, expected_id=checkpoint_id)
                _check_limits(manifest, limits)
                return manifest
            problems.append(f"{peer}: {reply.status}")
        except CheckpointRefused as refused:  # any other provider would send the same manifest: no retry
            scores.strike(peer, f"manifest: {refused}")
            raise
        except CheckpointError as error:
            scores.strike(peer, f"manifest: {error.reason}")
            problems.append(f"{peer}: {error}")
        except Exception as error:  # classified; bugs re-raised
            if error_code(error) == "internal" and not isinstance(error, DialError):
                raise
            problems.append(f"{peer}: {error}")
    raise DownloadError(f"no provider gave the manifest of {checkpoint_id.hex()}: {'; '.join(problems) or 'none given'}")


def _check_limits(manifest: Manifest, limits: ManifestLimits | None) -> None:
    """`CheckpointRefused` if `manifest` breaks `limits`."""
    if limits is None:
        return
    try:
        limits.check(manifest)
    except LimitError as error:
        raise CheckpointRefused(manifest.id, error) from None


class _ChunkFetcher:
    """The workers of one download, and the event that wakes them when the schedule changes."""

    def __init__(
        self, sink: Sink, manifest: Manifest, schedule: DownloadSchedule,
        sessions: dict[str, ProviderSession], scores: PeerScores, progress: DownloadProgress,
    ) -> None:
        self.sink, self.manifest, self.schedule = sink, manifest, schedule
        self.sessions, self.scores, self.progress = sessions, scores, progress
        self._changed = trio.Event()
        self._requests: dict[tuple[str, int], trio.CancelScope] = {}  # (provider, chunk) -> its request

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for peer in self.sessions:
                # The first worker reuses the manifest's stream; the others open their own.
                workers = [self.sessions[peer]] + [
                    self.sessions[peer].sibling() for _ in range(self.schedule.max_window - 1)
                ]
                for session in workers:
                    nursery.start_soon(self._worker, peer, session)
            while not self.schedule.finished:
                await self._changed.wait()
            nursery.cancel_scope.cancel()
        self._show_providers()
        failure = self.schedule.failure()
        if failure is not None:
            raise DownloadError(failure)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        self._show_providers()

    async def _worker(self, peer: str, session: ProviderSession) -> None:
        try:
            while not self.schedule.finished:
                index = self.schedule.next_chunk(peer)
                if index is None:
                    if self.schedule.peers[peer].dropped is not None:
                        return
                    await self._changed.wait()
                    continue
                started = trio.current_time()
                outcome = await self._fetch_cancellable(peer, session, index)
                self.schedule.record(peer, index, outcome, seconds=trio.current_time() - started)
                if outcome is Outcome.STORED:
                    self._cancel_copies(index)
                self._notify()
                if outcome is Outcome.BUSY:
                    await trio.sleep(BUSY_BACKOFF)
        finally:
            if session is not self.sessions[peer]:
                await session.close()

    async def _fetch_cancellable(self, peer: str, session: ProviderSession, index: int) -> Outcome:
        """`_fetch`, unless another provider's copy of the chunk is stored first: then `SUPERSEDED`."""
        with trio.CancelScope() as scope:
            self._requests[(peer, index)] = scope
            try:
                return await self._fetch(peer, session, index)
            finally:
                del self._requests[(peer, index)]
        return Outcome.SUPERSEDED  # cancelled (the stream was reset; the session opens a new one)

    def _cancel_copies(self, index: int) -> None:
        """Stop the endgame copies of a stored chunk: their providers' uplinks are wanted for other chunks."""
        for peer in self.schedule.holders(index):
            scope = self._requests.get((peer, index))
            if scope is not None:  # its request may be just finishing
                scope.cancel()

    async def _fetch(self, peer: str, session: ProviderSession, index: int) -> Outcome:
        """Fetch, verify and store chunk `index` from `peer`; what became of it."""
        size = self.manifest.chunks[index].size
        try:
            reply = await session.ask(self.manifest.id, index, max_size=size)
        except ProtocolError as error:
            if error.code == "too-large":  # it offered more bytes than the chunk has: a lie
                return self._bad(peer, index, error.reason)
            return self._failed(peer, index, error)
        except Exception as error:  # classified; bugs re-raised
            if error_code(error) == "internal" and not isinstance(error, DialError):
                raise
            return self._failed(peer, index, error)
        if reply.status != wire.OK:
            return Outcome.BUSY if reply.status == wire.BUSY else Outcome.NOT_FOUND
        try:
            await self.sink.store(self.manifest, index, reply.payload)
        except CheckpointError as error:
            return self._bad(peer, index, error.reason)
        self.progress.chunks_fetched += 1
        self.progress.bytes_fetched += size
        self.scores.reward(peer)
        return Outcome.STORED

    def _bad(self, peer: str, index: int, reason: str) -> Outcome:
        logger.warning("chunk %d from %s failed verification: %s", index, peer, reason)
        self.scores.strike(peer, f"chunk {index}: {reason}")
        return Outcome.BAD

    def _failed(self, peer: str, index: int, error: BaseException) -> Outcome:
        logger.info("chunk %d from %s failed: %s", index, peer, error)
        return Outcome.FAILED

    def _show_providers(self) -> None:
        self.progress.chunks_stored = self.progress.chunks_total - len(self.schedule.wanted) + self.schedule.stored
        self.progress.providers = {
            peer: {"stored": state.stored, "strikes": state.strikes, "window": self.schedule.window(peer),
                   "rate_mb_s": round(state.rate / 1e6, 1), "dropped": state.dropped}
            for peer, state in self.schedule.peers.items()
        }
