"""The run's certified states: stored by each round's stewards, attested by its voters, synced by
whoever lacks one.

- After its vote, off the critical path (while the next round trains), a peer that is one of the
  round's state stewards (`state_stewards`) stores the new state as a checkpoint; every peer
  attests its checkpoint ID (a non-steward computes the manifest without writing it). Only the
  newest state waits to be stored: when storing falls behind the rounds, an older one is dropped.
- A sync downloads a checkpoint of the certified round that its voters attested, most attested
  first (the stewards asked first), and adopts it only if its state hash is the certified one; an
  attested ID that does not hold it costs a manifest, and the next one is tried.
- Payloads and states of rounds older than KEPT_ROUNDS are deleted; an archive node
  (`node start --archive`) keeps the payloads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from locomesh.crdt import Replica
from locomesh.node.rounds.orders import state_stewards
from locomesh.node.runtime import Node
from locomesh.node.transfer.download import DownloadError, DownloadProgress, Offload, download_checkpoint
from locomesh.node.transfer.store import load_state, read_stored_manifest, remove_checkpoints, write_state
from locomesh.protocol import peer_id_from_public_key
from locomesh.protocol.runs import short_run_id

logger = logging.getLogger(__name__)

KEPT_ROUNDS = 3  # payloads and states of older rounds are deleted

Compute = Callable[..., Awaitable[Any]]


class StateKeeper:
    """Stores, attests, finds and loads the run's certified states, for one run."""

    def __init__(self, node: Node, crdt: Any, replica: Replica, participant: Any, directory: Path, scores: Any, *,
                 compute: Compute, compute_lock: trio.Lock, offload: Offload,
                 other_members: Callable[[bytes | None], list[str]], archive: bool = False) -> None:
        self.node, self.crdt, self.replica, self.run_id = node, crdt, replica, replica.run_id
        self.archive = archive  # keep every payload (`forget_old_rounds`)
        self.participant, self.directory, self.scores = participant, directory, scores
        self.compute, self.compute_lock, self.offload = compute, compute_lock, offload
        self.other_members = other_members
        self.me = node.identity.public_key
        self._unstored: tuple[int, Any, bytes] | None = None  # the newest state not yet stored
        self._storing = False

    # --- who -------------------------------------------------------------------------------------

    def seed(self, round_number: int) -> bytes:
        """What round `round_number`'s proposer and steward orders are drawn from: the hash of the
        state certified before it (no key could know it when it was made), or the run ID."""
        certificate = self.replica.state.certificates.get(round_number - 1)
        return self.run_id if certificate is None else certificate.hash

    def stewards(self, round_number: int) -> list[bytes]:
        return state_stewards(round_number, self.seed(round_number), self.replica.electorate(round_number))

    def providers(self, round_number: int) -> list[str]:
        """Who to ask for round `round_number`'s state: its stewards first, then the other members."""
        first = [peer_id_from_public_key(key) for key in self.stewards(round_number) if key != self.me]
        return first + [peer for peer in self.other_members(None) if peer not in first]

    # --- storing and attesting -------------------------------------------------------------------

    def store_later(self, nursery: trio.Nursery, round_number: int, snapshot: Any, state_hash: bytes) -> None:
        """Queue a state to store and attest (in `nursery`). Only the newest waits, so at most two
        states are held (being written, waiting) and the one offered to syncing peers is the newest."""
        self._unstored = (round_number, snapshot, state_hash)
        if not self._storing:
            self._storing = True
            nursery.start_soon(self._store_queued)

    async def _store_queued(self) -> None:
        try:
            while self._unstored is not None:
                (round_number, snapshot, state_hash), self._unstored = self._unstored, None
                await self.store(round_number, snapshot, state_hash)
        finally:
            self._storing = False

    async def store(self, round_number: int, snapshot: Any, state_hash: bytes) -> None:
        """Write the state we voted for as a checkpoint if we are one of the round's stewards, then
        attest it (peers that sync fetch it from the stewards); a peer that is not only attests."""
        steward = self.me in self.stewards(round_number)
        try:
            if steward:
                manifest = await self.offload(write_state, self.directory, snapshot, self.run_id)
            else:
                manifest = await self.offload(snapshot.manifest, self.run_id)
        except (OSError, ValueError) as error:  # a full disk, say: we keep training, others offer the state
            logger.error("round %d: the state was not stored: %s", round_number, error)
            return
        if manifest.state_hash != state_hash:  # a bug, never a peer's doing: do not offer it
            logger.error("round %d: the stored state is not the state voted for", round_number)
            return
        self.crdt.write(self.run_id, "checkpoint", round=round_number, id=manifest.id, size=manifest.raw_size)

    # --- syncing ---------------------------------------------------------------------------------

    async def download(self, round_number: int, state_hash: bytes) -> bytes | None:
        """Download and load the certified state of `round_number` (see the module docstring); its
        hash, or None when nobody attested it yet or no attested checkpoint held it."""
        for checkpoint in self.replica.checkpoint_candidates(round_number):
            if await self._try(round_number, state_hash, checkpoint.id):
                logger.info("run %s: synced to round %d", short_run_id(self.run_id), round_number)
                return state_hash
        return None

    async def _try(self, round_number: int, state_hash: bytes, checkpoint_id: bytes) -> bool:
        try:
            await download_checkpoint(self.node, self.directory, checkpoint_id, self.providers(round_number),
                                      scores=self.scores, progress=DownloadProgress(checkpoint_id), offload=self.offload,
                                      limits=self.participant.state_limits(self.run_id, round_number))
            manifest = await self.offload(read_stored_manifest, self.directory, checkpoint_id)
        except (DownloadError, OSError, ValueError) as error:
            logger.info("round %d: state download failed: %s", round_number, error)
            return False
        if manifest.state_hash != state_hash:
            logger.warning("round %d: attested checkpoint %s is not the certified state", round_number, checkpoint_id.hex()[:12])
            return False
        async with self.compute_lock:
            try:
                await self.compute(load_state, self.directory, checkpoint_id, self.participant, self.run_id)
            except ValueError as error:
                logger.warning("round %d: the certified state does not fit this run: %s", round_number, error)
                return False
        return True

    def forget_old_rounds(self, round_number: int) -> None:
        """Delete this run's payloads and states from before the last KEPT_ROUNDS rounds (a peer that
        syncs wants the newest certified state; older ones only fill the disk), but no payload on
        an archive node (an audit replays rounds from them). Blocking."""
        oldest = round_number - KEPT_ROUNDS

        def doomed(meta: dict[str, Any]) -> bool:
            if self.archive and meta.get("kind") == "payload":
                return False
            return meta.get("run") == self.run_id and meta.get("round", oldest) < oldest

        remove_checkpoints(self.directory, doomed)
