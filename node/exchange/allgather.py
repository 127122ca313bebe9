"""The round's payloads: ours stored for the others, theirs fetched, every size checked first.

A payload travels as a content-addressed checkpoint, so the checkpoint service serves it (over
its authenticated data plane) and any peer that fetched a payload can serve it on: the exchange
is a multi-source download, verified chunk by chunk against the ID its author committed to in
the CRDT, after the commit's size and the manifest were checked against what a payload of the
run can be (`Participant.payload_limits`). Ours goes to the node's store (after a crash we must
contribute the same payload again); the others' stay in memory (`HeldCheckpoints`), are served
on from there, and are released a round after theirs ended. An archive node (`node start
--archive`) also writes each of the others' payloads to the store once it is fetched and checked,
and keeps every payload there (`states.StateKeeper.forget_old_rounds`), so `locomesh run audit`
can replay any round (`audit`).

A fetch keeps trying while FETCH_TIMEOUT lasts: a provider that is busy, or a payload only its
author has so far, is a reason to wait, not to leave it out (a peer that leaves out what the
others include votes for another hash). Three things end it early: a payload that breaks the
run's limits (trying again gives the same); an author we hold no connection to after a failed
try (it crashed after its commit: each try waits for dials to it to time out); and, once the
round's cutoff has passed, no byte for STALL_SECONDS (or a window, if longer): nobody serves it,
its author withholds it, and it would otherwise cost every round FETCH_TIMEOUT. If another peer
has it, the round's proposal makes the round machine ask for it again.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import trio

from locomesh.crdt import Replica
from locomesh.node.runtime import Node
from locomesh.node.transfer.download import REFUSED, DownloadError, DownloadProgress, Offload, download_checkpoint
from locomesh.node.transfer.held import HeldCheckpoints
from locomesh.node.transfer.store import load_payload, write_frames, write_payload
from locomesh.protocol import peer_id_from_public_key
from locomesh.training.checkpoint_manifest import CheckpointError
from locomesh.training.contract import PAYLOAD_TENSOR

from .work import RoundClock

logger = logging.getLogger(__name__)

FETCH_TIMEOUT = 60.0
FETCH_RETRY_SECONDS = 0.5
STALL_SECONDS = 5.0  # after the cutoff, a payload of which no byte arrived this long is given up
STALL_POLL_SECONDS = 0.5


class PayloadExchange:
    """Our payloads into the store, the others' out of the network, for one run."""

    def __init__(self, node: Node, replica: Replica, participant: Any, directory: Path, held: HeldCheckpoints,
                 scores: Any, *, machine: RoundClock, offload: Offload, connected: Callable[[bytes], bool],
                 other_members: Callable[[bytes | None], list[str]], archive: bool = False) -> None:
        """`archive`: also write the others' payloads to the store (see the module docstring)."""
        self.node, self.replica, self.run_id = node, replica, replica.run_id
        self.participant, self.directory, self.held, self.scores = participant, directory, held, scores
        self.machine, self.offload = machine, offload
        self.connected, self.other_members = connected, other_members
        self.archive = archive
        self.me = node.identity.public_key

    async def store(self, round_number: int, payload: bytes) -> tuple[bytes, int]:
        """Write our payload for `round_number` to the store, where the checkpoint service serves
        it; (its ID, its size), what our commit names."""
        manifest = await self.offload(write_payload, self.directory, payload, self.run_id, round_number)
        return manifest.id, len(payload)

    async def committed_before(self, round_number: int) -> Any:
        """The payload we committed to for this round before a restart, from our store: a second,
        different commitment would be an equivocation (a ban). None if we made none (or lost it:
        then `CrdtService.write` refuses the new commitment, and the round goes on without us)."""
        said = self.replica.facts.commits_in(round_number).get(self.me)
        if not said:
            return None
        ((payload_id, size),) = said
        try:
            limits = self.participant.payload_limits(self.run_id, round_number, size)
        except ValueError:
            return None
        payload = await self._stored(round_number, payload_id, limits)
        if payload is None:
            logger.warning("round %d: our payload committed before a restart is not in the store", round_number)
            return None
        logger.info("round %d: contributing the payload we committed to before a restart", round_number)
        return SimpleNamespace(payload=payload, train_loss=None, seconds=0.0)  # what training hands back

    def release_before(self, round_number: int | None = None) -> int:
        """Drop the held payloads of this run's rounds before `round_number` (all of them if None)."""
        return self.held.release(lambda manifest: manifest.run == self.run_id
                                 and (round_number is None or manifest.round < round_number))

    async def fetch(self, round_number: int, author: bytes, payload_id: bytes, size: int,
                    progress: DownloadProgress | None = None) -> memoryview | None:
        """The payload `author` committed to for `round_number`, or None (see the module docstring).
        `progress` shows what was fetched, by every try."""
        try:
            limits = self.participant.payload_limits(self.run_id, round_number, size)
        except ValueError as error:  # a bad commit: no payload of this run is that size, so nothing is fetched
            logger.warning("round %d: the commit of %s is bad: %s", round_number, peer_id_from_public_key(author), error)
            return None
        payload = None
        progress = progress or DownloadProgress(payload_id)  # kept across tries: its byte count shows a stall
        with trio.move_on_after(min(FETCH_TIMEOUT, self.machine.timing.round_deadline / 4)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._give_up_when_stalled, round_number, progress, nursery.cancel_scope)
                while payload is None:
                    try:
                        payload = await self._download(round_number, author, payload_id, limits, progress)
                    except REFUSED as error:  # a bad payload: trying again gives the same
                        logger.warning("round %d: the payload committed by %s is refused: %s", round_number,
                                       peer_id_from_public_key(author), error)
                        break
                    if payload is None:
                        if not self.connected(author):
                            break
                        await trio.sleep(FETCH_RETRY_SECONDS)
                nursery.cancel_scope.cancel()
        return payload

    async def _give_up_when_stalled(self, round_number: int, progress: DownloadProgress, fetch: trio.CancelScope) -> None:
        """Cancel `fetch` once the round's cutoff has passed and no byte arrived for a while
        (waking only when that could first be true, not on a polling tick)."""
        seen_bytes, since = progress.bytes_fetched, trio.current_time()
        while (current := self.machine.current) is not None and current.number == round_number:
            stall = max(STALL_SECONDS, self.machine.window())
            cutoff = self.machine.cutoff() if current.first_seen is not None else math.inf
            now = trio.current_time()
            if progress.bytes_fetched != seen_bytes:
                seen_bytes, since = progress.bytes_fetched, now
            elif now >= cutoff and now - since >= stall:
                logger.info("round %d: no byte of a payload for %.1f s after the cutoff: given up", round_number, now - since)
                fetch.cancel()
                return
            await trio.sleep_until(max(min(cutoff, now + stall), since + stall, now + STALL_POLL_SECONDS))

    async def _download(self, round_number: int, author: bytes, payload_id: bytes, limits: Any,
                        progress: DownloadProgress) -> memoryview | None:
        providers = [peer_id_from_public_key(author), *self.other_members(author)]
        try:
            await download_checkpoint(self.node, self.directory, payload_id, providers, scores=self.scores,
                                      progress=progress, offload=self.offload, limits=limits, held=self.held)
        except REFUSED:
            raise
        except (DownloadError, OSError, ValueError) as error:
            logger.info("round %d: payload of %s not fetched: %s", round_number, peer_id_from_public_key(author), error)
            return None
        data = await self._held(round_number, payload_id, limits)
        if data is None:
            logger.warning("round %d: the payload %s committed by %s is not a payload of this round",
                           round_number, payload_id.hex()[:12], peer_id_from_public_key(author))
        elif self.archive:
            await self._archive(round_number, payload_id)
        return data

    async def _archive(self, round_number: int, payload_id: bytes) -> None:
        """Write a held payload (checked: `_held`) to the store too, for `locomesh run audit`. A disk
        that fails costs the archive that payload, never the round."""
        held = self.held.complete(payload_id)
        if held is None:
            return
        try:
            await self.offload(write_frames, self.directory, held.manifest, held.frames)
        except (OSError, ValueError) as error:
            logger.error("round %d: payload %s not archived: %s", round_number, payload_id.hex()[:12], error)

    async def _held(self, round_number: int, payload_id: bytes, limits: Any) -> memoryview | None:
        """The payload `payload_id` of this run's round `round_number`, held in memory whole, inflated
        once (its bytes are a view into that buffer); None if it is no such payload."""
        held = self.held.complete(payload_id)
        if held is None:
            return None
        try:
            arrays, metadata = await self.offload(held.arrays, limits)
        except CheckpointError:
            return None
        payload = arrays.get(PAYLOAD_TENSOR)
        if metadata.get("round") != round_number or metadata.get("run") != self.run_id or payload is None:
            return None
        return memoryview(payload)

    async def _stored(self, round_number: int, payload_id: bytes, limits: Any) -> bytes | None:
        """The payload `payload_id` of this run's round `round_number` from our store; None if it
        is not there whole, or is no such payload (or breaks the `limits` of one)."""
        try:  # `limits` name the run and the round: a payload of another round breaks them
            return await self.offload(load_payload, self.directory, payload_id, limits)
        except (OSError, ValueError):
            return None
