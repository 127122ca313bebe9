"""Sharded exchange: would a payload outlive its author? Asked before a proposal may name it.

Theory of operation
-------------------
A proposal names contributors; each shard of each named payload must then reach that shard's
committee. A member that fetched its own seats and a private sample of a payload knows that its
author served it, not that every committee has its shard: an author that crashes right after
its commit, having served only some of them, would leave a proposal that nobody can aggregate,
and each member proposes once per round. So our own proposal names a payload only once, for
every shard, a member other than its author holds it: a member of the shard's committee (it
fetched it for its seat), or we ourselves. Then the shard outlives its author, and whoever
aggregates it fetches it from that member.

One `Availability` per (round, committees) asks, for each shard with payloads not yet seen held,
one committee member at a time (a different one each poll) which of those payloads' shard it
holds: a ``held`` request of `shard_transfer` naming all of them, answered with a bitmap. Shards
are asked together, and the members that wait for an answer share one poll (`confirm`): a round
costs a member about one small request per shard and poll, however many contributors it has.
A shard that no committee member is seen holding after SELF_FETCH_AFTER polls, or whose committee
we hold no connection to (it crashed, or cannot be reached from here), we fetch ourselves: it costs a shard where a committee
is gone, and a payload whose author went too is then left out, as it must be.

What a liar can do: a committee member that says it holds a shard it does not can make a payload
look safe; should its author then crash, the proposal that names it is given up as any withheld
one is (a delay, never a wrong aggregate: what is aggregated is checked against the commit's root).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import trio

from locomesh.protocol import peer_id_from_public_key

from .shard_transfer import MAX_HELD_AUTHORS, ShardFetchError, fetch_held

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # between two polls, while payloads wait to be seen held
HELD_TIMEOUT = 2.0  # one held request answered within this (a poll waits for its slowest)
SELF_FETCH_AFTER = 2  # polls that found a shard at no committee member before we fetch it ourselves


class Availability:
    """Which payloads of round `round_number` have every shard held by a member other than their
    author. `committees` (`ShardedExchange.committees`) say whom to ask; they may be replaced when
    a new attempt draws others (what was seen held stays held: holdings do not follow committees)."""

    def __init__(self, exchange: Any, round_number: int, committees: list[list[bytes]],
                 stalled: Callable[[], bool]) -> None:
        self.x, self.round, self.committees, self.stalled = exchange, round_number, committees, stalled
        self.unseen: dict[bytes, set[int]] = {}  # author -> shards not yet seen held by another member
        self.confirmed: set[bytes] = set()  # authors all of whose shards were seen held so
        self.asked: dict[tuple[bytes, int], int] = {}  # (author, shard) -> polls that found it nowhere yet
        self.ours: set[tuple[bytes, int]] = set()  # (author, shard) to fetch ourselves (`_poll` says)
        self.polls = 0
        self._polling = trio.Lock()

    async def confirm(self, author: bytes) -> bool:
        """True once every shard of `author`'s payload is seen held by a member other than `author`
        (here, or at a member of that shard's committee; a shard whose committee is `author`
        alone needs none); False once the round stalls first (`ShardedExchange._stalled`), after
        which `author` is asked about no more."""
        if author in self.confirmed:
            return True
        unseen = self.unseen.setdefault(
            author, {j for j, members in enumerate(self.committees) if set(members) - {author}})
        while unseen:
            if self.stalled():
                logger.info("round %d: shards %s of %s are held by no other member we know of", self.round,
                            sorted(unseen), peer_id_from_public_key(author))
                self.unseen.pop(author, None)
                return False
            polls = self.polls
            async with self._polling:
                if self.polls == polls:  # nobody polled while we waited for the lock
                    await self._poll()
                    self.polls += 1
            async with trio.open_nursery() as nursery:  # outside the lock: a slow fetch holds up no one else
                for j in sorted(unseen):
                    if (author, j) in self.ours:
                        nursery.start_soon(self._fetch_ourselves, author, j)
            if unseen:
                await trio.sleep(POLL_SECONDS)
        self.confirmed.add(author)
        return True

    async def _poll(self) -> None:
        """Look at our own holdings; ask, for each shard and unseen payload, a member of the
        shard's committee other than its author (one we hold a connection to, a different one
        each poll): one request per (shard, member), each bounded by HELD_TIMEOUT. What was found
        nowhere SELF_FETCH_AFTER polls long, or has no committee member we are connected to, goes
        to `ours` (the waiting `confirm` fetches it)."""
        x, me = self.x, self.x.me
        wanted: dict[tuple[int, bytes], list[bytes]] = {}
        for author, shards in self.unseen.items():
            for j in list(shards):
                if author != me and x.holdings.input(x.run_id, self.round, author, j):
                    shards.discard(j)
                    continue
                self.asked[(author, j)] = asked = self.asked.get((author, j), 0) + 1
                others = [m for m in self.committees[j] if m not in (author, me)]
                reachable = [m for m in others if peer_id_from_public_key(m) in x.node.peers]
                if asked > SELF_FETCH_AFTER or not reachable:
                    self.ours.add((author, j))
                else:
                    wanted.setdefault((j, reachable[self.polls % len(reachable)]), []).append(author)
        async with trio.open_nursery() as nursery:
            for (j, member), authors in sorted(wanted.items()):
                nursery.start_soon(self._ask, j, member, sorted(authors))

    async def _fetch_ourselves(self, author: bytes, shard: int) -> None:
        """Fetch shard `shard` of `author`'s payload (from its author, its committee, anyone) to hold it."""
        x = self.x
        commit = x.replica.commits(self.round).get(author)
        if commit is not None and author != x.me:
            sources = [author, *self.committees[shard], *sorted(x.replica.state.members)]
            if await x._input(self.round, author, commit[0], shard, list(dict.fromkeys(sources))) is not None:
                self.unseen.get(author, set()).discard(shard)

    async def _ask(self, shard: int, member: bytes, authors: list[bytes]) -> None:
        """Ask `member` which of `authors` have shard `shard` held there."""
        for start in range(0, len(authors), MAX_HELD_AUTHORS):
            chunk = authors[start:start + MAX_HELD_AUTHORS]
            try:
                held = await fetch_held(self.x.node, peer_id_from_public_key(member), self.x.run_id, self.round,
                                        shard, chunk, timeout=HELD_TIMEOUT)
            except ShardFetchError as error:
                logger.debug("round %d: held request for shard %d to %s: %s", self.round, shard,
                             peer_id_from_public_key(member), error)
                return
            for author in held:
                self.unseen.get(author, set()).discard(shard)
