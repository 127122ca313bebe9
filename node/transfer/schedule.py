"""Which provider fetches which chunk: the sans-IO scheduler of a checkpoint download.

Theory of operation
-------------------
A download wants a set of chunks (those not stored yet, so a resumed download
asks only for the rest) from a list of providers. Nothing here does I/O: the
trio layer (`download`) runs a few workers per provider, each asks
`next_chunk(provider)` for work, fetches it, verifies it, and reports the
`Outcome` with `record(...)`. The schedule decides:

* **Pull, not push.** Chunks wait in one queue; a provider's worker takes the
  next one when the provider has room in its *window* (requests in flight).
  A fast provider comes back for work sooner, so it takes more chunks: this
  is work stealing from a shared queue.
* **A slow provider gets fewer.** That is the pull above: a provider takes
  new work only as fast as it delivers. Its window (requests in flight) is
  `max_window`, halved by failures and "busy" answers (AIMD: it grows by one
  per success). It is *not* scaled by the provider's observed rate: a
  provider held to a small window shows a low rate (its window divided by the
  round trip), which would keep its window small, so equal providers on a
  long path would drift into unequal windows and a download from k of them
  fell well short of k times one (netsim `checkpoint`). The rate (bytes/s,
  smoothed) is kept for display.
* **Endgame.** When the queue is empty, a provider that has finished its own
  work (every chunk still in flight there is also in flight elsewhere) may
  duplicate a chunk that one other provider is still fetching: the one at the
  provider with the most work left, assigned last there (it will arrive
  last). A copy never goes to a provider with work of its own, where it
  would share the uplink with, and so delay, chunks nobody else is fetching
  (netsim `checkpoint`: copies taken as soon as a window slot opened made
  the tail of a 4-provider download longer; docs/measurements.md). The first verified copy
  wins; `holders(index)` then names the providers still fetching it, whose
  requests the trio layer cancels (`SUPERSEDED`): their uplinks are needed
  for other chunks. A vanished provider cannot hold the tail back.
* **Liars lose.** A chunk that fails its hash check is a *strike* for the
  provider, goes back to the front of the queue, and is never asked of that
  provider again; after `max_strikes` strikes the provider is dropped from
  this download. "not-found" excludes the provider for that chunk, and drops
  it if it has delivered no chunk yet: a provider serves only checkpoints whose
  manifest it holds (`service`), so a first answer of not-found
  almost always means it holds none of it (a peer that has not fetched that
  payload yet), while one that has delivered chunks lost only some. Without the
  drop, every such provider was asked for every chunk: with 8 daemons, 6
  refusals per chunk of each payload, which cost more than the transfer itself.
  `max_failures` failures in a row (timeouts, broken streams) drop it too,
  and so do `max_busy` "busy" answers in a row (a provider that never has room).
* **The end.** `finished` when every wanted chunk is stored (`done`), or when
  nothing is in flight and no remaining provider may fetch any chunk still
  wanted; `failure()` then says which chunk could not be had. Chunks that can
  be stored are stored first, so a retry with other providers resumes.

Chunk transitions (a chunk is queued, in flight at one or more providers, or stored)::

    event       from        to                         effect on the provider
    ---------   ---------   ------------------------   ---------------------------------
    assign      queued      in flight                  in_flight + 1
    assign      in flight   in flight (endgame copy)   in_flight + 1
    stored      in flight   stored                     window + 1, rate updated
    bad         in flight   queued (front), excluded   strike; dropped at max_strikes
    failed      in flight   queued (front)             window halved; dropped after max_failures in a row
    busy        in flight   queued (front)             window halved; dropped after max_busy in a row
    not-found   in flight   queued (front), excluded   dropped if it delivered no chunk yet
    superseded  stored      stored                     none (another copy was stored first)
    (any)       stored      stored                     a late endgame copy: ignored

(a chunk still in flight at another provider stays in flight instead of being queued).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class Outcome(enum.Enum):
    STORED = "stored"  # verified against its hash and stored
    BAD = "bad"  # arrived, but failed verification: the provider lied
    FAILED = "failed"  # timeout, broken stream, unreachable provider
    BUSY = "busy"  # the provider is at its upload limit
    NOT_FOUND = "not-found"  # the provider does not have it
    SUPERSEDED = "superseded"  # cancelled: another provider's copy was stored first


class _Chunk(enum.Enum):
    QUEUED = "queued"
    IN_FLIGHT = "in flight"
    STORED = "stored"


# (chunk state, outcome) -> chunk state when no other provider still has the chunk in flight.
TRANSITIONS: dict[tuple[_Chunk, Outcome], _Chunk] = {
    (_Chunk.IN_FLIGHT, Outcome.STORED): _Chunk.STORED,
    (_Chunk.IN_FLIGHT, Outcome.BAD): _Chunk.QUEUED,
    (_Chunk.IN_FLIGHT, Outcome.FAILED): _Chunk.QUEUED,
    (_Chunk.IN_FLIGHT, Outcome.BUSY): _Chunk.QUEUED,
    (_Chunk.IN_FLIGHT, Outcome.NOT_FOUND): _Chunk.QUEUED,
    **{(_Chunk.STORED, outcome): _Chunk.STORED for outcome in Outcome},
}
_EXCLUDING = frozenset({Outcome.BAD, Outcome.NOT_FOUND})  # never ask that provider for that chunk again
_RATE_SMOOTHING = 0.3


@dataclass
class ProviderState:
    """What the schedule knows of one provider during this download."""

    peer_id: str
    cap: int  # AIMD part of the window: halved on failure/busy, +1 per success
    in_flight: int = 0
    stored: int = 0
    strikes: int = 0
    failures_in_a_row: int = 0
    busy_in_a_row: int = 0
    # Bytes/s, smoothed; 0 until its first chunk. A sample is chunk size x requests in flight there /
    # the request's time: requests in flight share the provider's uplink, so one request's own
    # size / time would fall as the window grows and shrink the windows of providers that are busiest.
    rate: float = 0.0
    dropped: str | None = None  # why it was dropped, or None while active


@dataclass
class DownloadSchedule:
    """The schedule for `wanted` chunks (index -> compressed size) from `providers`."""

    wanted: dict[int, int]
    providers: list[str]
    max_window: int = 4
    max_strikes: int = 3
    max_failures: int = 3
    max_busy: int = 25
    _queue: deque[int] = field(init=False)
    _state: dict[int, _Chunk] = field(init=False)
    _holders: dict[int, set[str]] = field(init=False)  # chunk -> providers it is in flight at
    _flying: dict[int, int] = field(init=False)  # chunk in flight -> when it was last assigned (a count)
    _assignments: int = field(init=False, default=0)
    _excluded: dict[int, set[str]] = field(init=False)
    peers: dict[str, ProviderState] = field(init=False)
    stored: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if min(self.max_window, self.max_strikes, self.max_failures, self.max_busy) < 1:
            raise ValueError("max_window, max_strikes, max_failures and max_busy must be at least 1")
        self._queue = deque(sorted(self.wanted))
        self._state = {index: _Chunk.QUEUED for index in self.wanted}
        self._holders = {index: set() for index in self.wanted}
        self._flying = {}
        self._excluded = {index: set() for index in self.wanted}
        self.peers = {peer: ProviderState(peer, cap=self.max_window) for peer in dict.fromkeys(self.providers)}

    # --- questions -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.stored == len(self.wanted)

    def failure(self) -> str | None:
        """Why the download cannot finish, or None while it can (or is done)."""
        active = [peer for peer, state in self.peers.items() if state.dropped is None]
        for index, state in self._state.items():
            if state is _Chunk.STORED or self._holders[index]:
                continue
            if not any(peer not in self._excluded[index] for peer in active):
                if active:
                    return f"no remaining provider can serve chunk {index}"
                return "every provider was dropped: " + "; ".join(f"{p}: {st.dropped}" for p, st in self.peers.items())
        return None

    @property
    def finished(self) -> bool:
        """Done, or nothing left that any remaining provider may fetch (chunks that can be stored are stored first)."""
        if self.done:
            return True
        if any(self._holders.values()):
            return False
        active = [peer for peer, state in self.peers.items() if state.dropped is None]
        return not any(
            state is _Chunk.QUEUED and any(peer not in self._excluded[index] for peer in active)
            for index, state in self._state.items()
        )

    def holders(self, index: int) -> frozenset[str]:
        """The providers chunk `index` is in flight at (after it was stored: copies the trio layer may cancel)."""
        return frozenset(self._holders[index])

    def window(self, peer_id: str) -> int:
        """How many requests `peer_id` may have in flight: its AIMD cap (1 to `max_window`)."""
        return self.peers[peer_id].cap

    # --- transitions -----------------------------------------------------------------------

    def next_chunk(self, peer_id: str) -> int | None:
        """A chunk for `peer_id` to fetch now (it is then in flight there), or None: no room or no work."""
        peer = self.peers[peer_id]
        if peer.dropped is not None or peer.in_flight >= self.window(peer_id):
            return None
        index = self._from_queue(peer_id)
        if index is None:
            index = self._endgame_copy(peer_id)
        if index is not None:
            self._state[index] = _Chunk.IN_FLIGHT
            self._holders[index].add(peer_id)
            self._assignments += 1
            self._flying[index] = self._assignments
            peer.in_flight += 1
        return index

    def record(self, peer_id: str, index: int, outcome: Outcome, *, seconds: float = 0.0) -> None:
        """Apply what became of `peer_id`'s request for chunk `index` (assigned by `next_chunk`)."""
        peer = self.peers[peer_id]
        if peer_id not in self._holders[index]:
            raise ValueError(f"chunk {index} is not in flight at {peer_id}")
        self._holders[index].discard(peer_id)
        if not self._holders[index]:
            del self._flying[index]
        concurrent = peer.in_flight  # this request and the ones sharing the provider's uplink with it
        peer.in_flight -= 1
        before = self._state[index]
        self._update_peer(peer, outcome, self.wanted[index] * concurrent, seconds)
        if outcome in _EXCLUDING:
            self._excluded[index].add(peer_id)
        after = TRANSITIONS[(before, outcome)]
        if after is _Chunk.QUEUED and self._holders[index]:
            after = _Chunk.IN_FLIGHT  # another provider is still fetching it
        if after is _Chunk.QUEUED:
            self._queue.appendleft(index)
        if after is _Chunk.STORED and before is not _Chunk.STORED:
            self.stored += 1
        self._state[index] = after

    def _update_peer(self, peer: ProviderState, outcome: Outcome, sample_bytes: int, seconds: float) -> None:
        """`sample_bytes`: the chunk's bytes times the requests in flight at the provider (see `rate`)."""
        if outcome is Outcome.SUPERSEDED:
            return  # cancelled by us, not a sign of how the provider does
        peer.busy_in_a_row = peer.busy_in_a_row + 1 if outcome is Outcome.BUSY else 0
        if outcome is Outcome.STORED:
            peer.stored += 1
            peer.failures_in_a_row = 0
            peer.cap = min(self.max_window, peer.cap + 1)
            if seconds > 0:
                sample = sample_bytes / seconds
                peer.rate = sample if peer.rate == 0 else (1 - _RATE_SMOOTHING) * peer.rate + _RATE_SMOOTHING * sample
        elif outcome is Outcome.BAD:
            peer.strikes += 1
            peer.cap = 1
            if peer.strikes >= self.max_strikes:
                peer.dropped = f"{peer.strikes} chunks failed verification"
        elif outcome is Outcome.FAILED:
            peer.failures_in_a_row += 1
            peer.cap = max(1, peer.cap // 2)
            if peer.failures_in_a_row >= self.max_failures:
                peer.dropped = f"{peer.failures_in_a_row} requests in a row failed"
        elif outcome is Outcome.NOT_FOUND and peer.stored == 0:
            peer.dropped = "does not hold the checkpoint"
        elif outcome is Outcome.BUSY:
            peer.cap = max(1, peer.cap // 2)
            if peer.busy_in_a_row >= self.max_busy:
                peer.dropped = f"busy {peer.busy_in_a_row} times in a row"

    def _from_queue(self, peer_id: str) -> int | None:
        """The first queued chunk `peer_id` may serve (skipping, not losing, the ones it may not)."""
        for position, index in enumerate(self._queue):
            if self._state[index] is _Chunk.QUEUED and peer_id not in self._excluded[index]:
                del self._queue[position]
                return index
        return None

    def _endgame_copy(self, peer_id: str) -> int | None:
        """With the queue empty and `peer_id` done with its own work: the chunk in flight at exactly one
        other provider that will arrive last (that provider has the most chunks of its own in flight,
        and of those it was assigned last), among the ones `peer_id` may serve."""
        if self._queue:  # queued chunks (even ones `peer_id` may not serve) come first
            return None
        alone = [  # chunks wanted still, in flight at one provider only
            index for index in self._flying if self._state[index] is _Chunk.IN_FLIGHT and len(self._holders[index]) == 1
        ]
        own_work = {peer: 0 for peer in self.peers}
        for index in alone:
            own_work[next(iter(self._holders[index]))] += 1
        if own_work[peer_id]:
            return None
        candidates = [index for index in alone if peer_id not in self._holders[index] | self._excluded[index]]
        return max(
            candidates, key=lambda index: (own_work[next(iter(self._holders[index]))], self._flying[index]), default=None
        )
