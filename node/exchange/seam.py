"""The one seam a round's participation drives: which exchange a round uses, and its four steps.

A participation asks, per round: `choose` (allgather or sharded, and why: `mode.choose`), then
`store` our payload (what the commit names), `fetch` what each other commit names (before the
proposal: the whole payload in allgather, one checked shard in sharded exchange; there `confirm`
then waits until it would outlive its author, and `unconfirmed` is what our own proposal leaves
out), `gather` what
the followed set needs (its payloads, or every shard's result) and `apply` it (the outer step).
A third exchange adds an implementation of these steps beside `allgather.py` and `sharded.py`,
and a name in `mode.EXCHANGES`; the participation does not change.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

from locomesh.crdt import Replica
from locomesh.node.transfer.download import DownloadProgress

from .allgather import PayloadExchange
from .work import RoundWork
from .mode import ExchangeChoice, choose
from .sharded import ShardedExchange

logger = logging.getLogger(__name__)


class RoundExchange:
    """Allgather and sharded exchange for one run; each round uses the one `choose` picked for it."""

    def __init__(self, replica: Replica, participant: Any, allgather: PayloadExchange, sharded: ShardedExchange) -> None:
        self.replica, self.participant = replica, participant
        self.allgather, self.sharded = allgather, sharded
        self.last_choice: ExchangeChoice | None = None

    def choose(self, round_number: int) -> ExchangeChoice:
        """The exchange of round `round_number`: from the run's settings and the round's
        electorate (crdt/membership.py: fixed when the round before was certified), so that every
        member of the round picks the same."""
        choice = self._for(len(self.replica.electorate(round_number)))
        if self.last_choice is None or choice.mode != self.last_choice.mode:
            logger.info("round %d: %s exchange (%s)", round_number, choice.mode, choice.reason)
        self.last_choice = choice
        return choice

    def predict(self, round_number: int) -> str:
        """The exchange round `round_number` will most likely use, before the round before it is
        certified (to train ahead for it): its electorate will be about that round's. A wrong guess
        costs the payload trained ahead, once."""
        return self._for(len(self.replica.electorate(round_number - 1))).mode

    def _for(self, members: int) -> ExchangeChoice:
        layout = self.participant.shard_layout()
        return choose(self.participant.settings.exchange, members,
                      byzantine_fraction=self.participant.settings.byzantine_fraction, shards=layout.count,
                      payload_bytes=self.participant.max_sharded_payload_size(),
                      aggregate_bytes=sum(self.participant.result_size(i) for i in range(layout.count)))

    def _of(self, work: RoundWork) -> PayloadExchange | ShardedExchange:
        return self.sharded if work.sharded else self.allgather

    async def committed_before(self, work: RoundWork) -> Any:
        """The payload we committed to for `work`'s round before a restart, or None."""
        return await self._of(work).committed_before(work.round)

    async def store(self, work: RoundWork, payload: bytes) -> tuple[bytes, int]:
        """Keep our payload and offer it; (what the commit names, its size)."""
        return await self._of(work).store(work.round, payload)

    async def fetch(self, work: RoundWork, author: bytes, payload_id: bytes, size: int) -> bool:
        """Is `author`'s committed payload there (fetched whole into `work.payloads` in allgather)?"""
        if work.sharded:
            self.sharded.choice = work.exchange
            with self._counting(work):
                return await self.sharded.fetch(work.round, author, payload_id, size)
        progress = DownloadProgress(payload_id)
        try:
            payload = await self.allgather.fetch(work.round, author, payload_id, size, progress)
        finally:
            work.bytes_fetched += progress.bytes_fetched
        if payload is not None:
            work.payloads[author] = payload
        return payload is not None

    async def confirm(self, work: RoundWork, author: bytes) -> None:
        """After `fetch` found `author`'s payload: in sharded exchange, wait until it would outlive
        its author (`ShardedExchange.confirm`); allgather holds it whole already."""
        if work.sharded:
            await self.sharded.confirm(work.round, author)

    def unconfirmed(self, work: RoundWork | None, authors: Any) -> frozenset[bytes]:
        """Which of `authors` our own proposal must leave out for now (`ShardedExchange.unconfirmed`)."""
        if work is None or not work.sharded:
            return frozenset()
        return self.sharded.unconfirmed(work.round, authors)

    async def gather(self, work: RoundWork, authors: tuple[bytes, ...], *, electorate: frozenset[bytes]) -> Any:
        """What the outer step over `authors` needs (`ProposalWithheld` if it cannot be had)."""
        if work.sharded:
            self.sharded.choice = work.exchange
            with self._counting(work):
                return await self.sharded.gather(work.round, authors, electorate=electorate)
        return {author: work.payloads[author] for author in authors if author in work.payloads}

    async def apply(self, work: RoundWork, gathered: Any, compute: Any) -> Any:
        """The outer step (call it holding the compute lock)."""
        if work.sharded:
            return await self.sharded.apply(gathered)
        return await compute(self.participant.aggregate, gathered)

    @contextmanager
    def _counting(self, work: RoundWork) -> Iterator[None]:
        """Keep `work.bytes_fetched` at what the sharded exchange downloaded for its round."""
        try:
            yield
        finally:
            work.bytes_fetched = self.sharded.bytes_fetched.get(work.round, 0)

    def release_before(self, round_number: int | None = None) -> None:
        self.allgather.release_before(round_number)
        self.sharded.release_before(round_number)
