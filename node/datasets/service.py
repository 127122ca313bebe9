"""A run's data from peers: its dataset and initial weights at join, each round's shards ahead of it.

Theory of operation
-------------------
A dataset is content-addressed checkpoints in the node's store (node/datasets/store.py: an index,
a tokenizer, fixed-size token shards), so the checkpoint service shares it like any checkpoint:
it announces every checkpoint it holds in the DHT and serves it. Whatever this module fetches
comes from strangers, so it goes through `download_checkpoint` with the limits of what it must
be (`index_limits`, `shard_limits`, the run's `init_limits`): a manifest that claims more is
refused before a chunk is fetched, every chunk is checked against its hash, and a provider that
sends a bad one is struck (the peer scores), its chunk fetched from another.

- At join (`prepare`), the participant's `data_needs` names a dataset and initial weights by ID.
  The index is fetched (a dataset ID nobody provides is a `DataUnavailable` with that message,
  and the join is refused before any training), then the held-out shards evaluation reads, then
  the initial weights; the participant checks them against its model (`attach_data`).
- Each round (`RunData.shards`), the round's assignment (training/data/assignment.py: drawn from
  the run's seed, the round and its contributors) names this peer's shards; the ones not held
  are fetched, retried with a growing pause while the round lasts (the round's work is cancelled
  when it ends), and loaded. The next round's shards are then fetched in the background
  (`prefetch`), for the roster as it stands, so training does not wait on data: a roster that
  changes by then costs the difference.
- Downloads of one checkpoint are shared: a second asker waits for the first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import trio

from locomesh.node.datasets import store as dataset_store
from locomesh.node.runtime import Node
from locomesh.node.transfer.download import DownloadError, Offload, download_checkpoint
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.transfer.store import checkpoint_ids, has_checkpoint, load_checkpoint, remove_checkpoint_ids
from locomesh.training.checkpoint_manifest import CheckpointError, ManifestLimits
from locomesh.training.contract import DataNeeds, RoundParticipant
from locomesh.training.data.assignment import assigned, shards_per_member
from locomesh.training.data.index import DatasetIndex, index_limits, shard_limits, tokenizer_limits

logger = logging.getLogger(__name__)

FETCH_TIMEOUT = 300.0  # one checkpoint's download, providers looked up included
PARALLEL_FETCHES = 8  # shard downloads at once
EVAL_SHARDS = 1  # held-out shards a peer fetches to evaluate on (a dataset's held-out part can be large)
RETRY_PAUSE = 2.0
MAX_RETRY_PAUSE = 60.0
KEPT_RECORDS = 16  # rounds whose shards `status` shows
KEPT_SHARDS = 64  # fetched shards kept (and served to others) at least; older ones are deleted


class DataUnavailable(Exception):
    """A dataset, shard or initial-weights checkpoint that could not be had; the message says which and why."""


class DatasetFetcher:
    """Fetches checkpoints of datasets and initial weights into the node's store, one download per ID."""

    def __init__(self, node: Node, checkpoints: CheckpointService, *, offload: Offload = trio.to_thread.run_sync) -> None:
        self.node, self.checkpoints, self.offload = node, checkpoints, offload
        self.directory: Path = checkpoints.directory
        self._downloads: dict[bytes, trio.Event] = {}
        self._fetching = trio.CapacityLimiter(PARALLEL_FETCHES)  # a round of many tiny shards opens no more downloads
        self.fetched: OrderedDict[bytes, None] = OrderedDict()  # shards downloaded here, least recently used first

    async def fetch(self, checkpoint_id: bytes, limits: ManifestLimits, what: str) -> None:
        """Have checkpoint `checkpoint_id` whole in the store (fetched within `limits` from the DHT's
        providers unless held already); `DataUnavailable` naming `what` if that failed."""
        while (running := self._downloads.get(checkpoint_id)) is not None:
            await running.wait()
        done = self._downloads[checkpoint_id] = trio.Event()
        try:
            await self._fetch(checkpoint_id, limits, what)
        finally:
            del self._downloads[checkpoint_id]
            done.set()

    async def _fetch(self, checkpoint_id: bytes, limits: ManifestLimits, what: str) -> None:
        if await self.offload(has_checkpoint, self.directory, checkpoint_id):
            return
        assert self.checkpoints.scores is not None, "the checkpoint service runs"
        try:
            with self.checkpoints.tracked(checkpoint_id) as progress, trio.fail_after(FETCH_TIMEOUT):
                providers = await self.checkpoints.find_providers(checkpoint_id)
                await download_checkpoint(self.node, self.directory, checkpoint_id, providers,
                                          scores=self.checkpoints.scores, progress=progress,
                                          offload=self.offload, limits=limits)
        except trio.TooSlowError:
            raise DataUnavailable(f"{what} {checkpoint_id.hex()}: no download in {FETCH_TIMEOUT:.0f} s") from None
        except (DownloadError, OSError) as error:
            raise DataUnavailable(f"{what} {checkpoint_id.hex()}: {error}") from None
        self.fetched[checkpoint_id] = None
        await self.checkpoints.announce(checkpoint_id)

    async def announce_dataset(self, dataset_id: bytes, index: DatasetIndex) -> None:
        """Provide the dataset's checkpoints this node holds now (a dataset just packed is announced
        at once, not at the store's next scan)."""
        held = set(await self.offload(checkpoint_ids, self.directory))  # a visible manifest's chunks are all there
        for checkpoint_id in (dataset_id, index.tokenizer, *index.train, *index.heldout):
            if checkpoint_id in held:
                await self.checkpoints.announce(checkpoint_id)

    async def load_index(self, dataset_id: bytes) -> DatasetIndex:
        await self.fetch(dataset_id, index_limits(), "dataset")
        try:
            return await self.offload(dataset_store.load_index, self.directory, dataset_id)
        except (CheckpointError, ValueError) as error:
            raise DataUnavailable(f"dataset {dataset_id.hex()}: {error}") from None

    async def load_shards(self, index: DatasetIndex, shard_ids: Collection[bytes]) -> list[np.ndarray]:
        """The tokens of `shard_ids`, fetched first where not held; `DataUnavailable` if one failed."""
        await self.fetch_all(index, shard_ids)
        try:
            return [await self.offload(dataset_store.load_shard, self.directory, index, shard_id) for shard_id in shard_ids]
        except CheckpointError as error:  # removed or damaged on disk since: fetched again next time
            raise DataUnavailable(f"dataset shard: {error}") from None

    async def fetch_all(self, index: DatasetIndex, shard_ids: Collection[bytes]) -> None:
        """Fetch the shards `shard_ids` side by side; the first `DataUnavailable`, once all ended."""
        failures: list[DataUnavailable] = []

        async def fetch_one(shard_id: bytes) -> None:
            async with self._fetching:
                try:
                    await self.fetch(shard_id, shard_limits(index), "dataset shard")
                except DataUnavailable as error:
                    failures.append(error)

        async with trio.open_nursery() as nursery:
            for shard_id in set(shard_ids):
                nursery.start_soon(fetch_one, shard_id)
        if failures:
            raise failures[0]

    async def forget_beyond(self, keep: int, used: Collection[bytes]) -> None:
        """Mark `used` as just used, then delete the least recently used shards this node fetched
        beyond the newest `keep` (shards packed here stay: they are the dataset's source). A
        dataset larger than a peer's disk never has to fit on it."""
        for shard_id in used:
            if shard_id in self.fetched:
                self.fetched.move_to_end(shard_id)
        doomed = list(self.fetched)[: max(0, len(self.fetched) - keep)]
        if doomed:
            for shard_id in doomed:
                del self.fetched[shard_id]
                self.checkpoints.withdraw(shard_id)
            await self.offload(remove_checkpoint_ids, self.directory, set(doomed))

    async def prepare(self, participant: RoundParticipant, compute: Any) -> DatasetIndex | None:
        """Fetch what `participant.data_needs()` names and attach it (`compute` runs the attaching);
        the dataset's index, or None when the run has no dataset. `DataUnavailable` if anything
        could not be had; the participant's `ParticipantError` if it does not fit the model."""
        needs: DataNeeds = participant.data_needs()
        index, held_out, init = None, [], None
        if needs.dataset is not None:
            index = await self.load_index(needs.dataset)
            await self.fetch(index.tokenizer, tokenizer_limits(), "tokenizer")  # an export ships it
            await self.announce_dataset(needs.dataset, index)
            held_out = await self.load_shards(index, index.heldout[:EVAL_SHARDS])
        if needs.init is not None:
            assert needs.init_limits is not None
            await self.fetch(needs.init, needs.init_limits, "initial weights")
            try:
                init, _ = await self.offload(load_checkpoint, self.directory, needs.init, needs.init_limits)
            except CheckpointError as error:
                raise DataUnavailable(f"initial weights {needs.init.hex()}: {error}") from None
        if index is not None or init is not None:
            await compute(participant.attach_data, index, held_out, init)
        return index


class RunData:
    """The dataset side of one participation: each round's assigned shards (see the module docstring)."""

    def __init__(self, fetcher: DatasetFetcher, dataset_id: bytes, index: DatasetIndex, *, seed: int, me: bytes,
                 tokens_per_round: int) -> None:
        self.fetcher, self.dataset_id, self.index, self.seed, self.me = fetcher, dataset_id, index, seed, me
        self.per_member = shards_per_member(index.shard_tokens, tokens_per_round)
        self.trained: OrderedDict[int, list[bytes]] = OrderedDict()  # round -> the shards handed to training

    def status(self) -> dict[str, Any]:
        """The dataset, and the shards (IDs, hex) we trained on in our latest rounds, by round."""
        return {"dataset": self.dataset_id.hex(), "shards_per_member": self.per_member,
                "train_shards": len(self.index.train),
                "rounds": {str(number): [shard.hex() for shard in shards] for number, shards in self.trained.items()}}

    def assigned_ids(self, round_number: int, roster: Collection[bytes]) -> list[bytes]:
        """The IDs of the shards round `round_number` assigns us among `roster` (we count in it)."""
        members = set(roster) | {self.me}
        positions = assigned(len(self.index.train), self.seed, round_number, sorted(members), self.me, self.per_member)
        return [self.index.train[position] for position in positions]

    async def shards(self, round_number: int, roster: Collection[bytes]) -> list[np.ndarray]:
        """The tokens of our shards of round `round_number`, fetched if need be; retried until they
        come (a cancelled round's work stops it)."""
        wanted = self.assigned_ids(round_number, roster)
        pause = RETRY_PAUSE
        while True:
            try:
                shards = await self.fetcher.load_shards(self.index, wanted)
            except DataUnavailable as error:
                logger.warning("round %d: our data is not here yet, again in %.0f s: %s", round_number, pause, error)
            else:
                self._record(round_number, wanted)
                await self.fetcher.forget_beyond(max(KEPT_SHARDS, 4 * self.per_member), wanted)
                return shards
            await trio.sleep(pause)
            pause = min(2 * pause, MAX_RETRY_PAUSE)

    def _record(self, round_number: int, shard_ids: list[bytes]) -> None:
        self.trained[round_number] = shard_ids
        self.trained.move_to_end(round_number)
        while len(self.trained) > KEPT_RECORDS:
            self.trained.popitem(last=False)

    def tokenizer(self) -> bytes:
        """The dataset's tokenizer.json, verified (blocking; `prepare` fetched it with the index)."""
        return dataset_store.load_tokenizer(self.fetcher.directory, self.index)

    async def prefetch(self, round_number: int, roster: Collection[bytes]) -> None:
        """Fetch round `round_number`'s shards for `roster` now, so the round finds them held."""
        try:
            await self.fetcher.fetch_all(self.index, self.assigned_ids(round_number, roster))
        except DataUnavailable as error:
            logger.info("round %d: prefetching our shards failed (fetched again when it starts): %s", round_number, error)
