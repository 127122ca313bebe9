"""Upload slots: how many checkpoint answers a provider writes at once, to whom, and for how long.

A slot is held by one answer (a manifest or a chunk) from the moment its
request is taken until its last byte is written: a share of the provider's
uplink, a thread reading the store, a payload in memory. There are few of
them (`MAX_UPLOADS`); a request that finds none free is answered ``busy`` at
once (the asker backs off, then asks again or asks another provider), never
queued. Three rules keep any asker from holding them all:

* **Shares.** One peer holds at most `MAX_UPLOADS_PER_PEER` slots at once,
  however many streams (libp2p or data plane) it asks on. A download keeps
  `download.MAX_WINDOW` requests in flight per provider, so an honest asker
  fits in its share; one that asks for more gets ``busy`` for the rest, and
  its window shrinks (`schedule`).
* **Members first.** Strangers (peers that `is_member` says have no standing
  in any run this node replicates: `CrdtService.has_standing`, trusted at
  genesis or earned by a certified round; a join alone is free) hold at most
  `MAX_STRANGER_UPLOADS` slots together; the others are kept for members, who
  may also use the strangers' free ones. So keys made up in bulk, joined or
  not, cannot crowd a run's members out of their payload fetches, while a
  joiner (a stranger until a round accepts it) still finds room beside a lone
  squatter. Without `is_member` (a node that knows no run) nobody is told
  apart and every slot is open to all.
* **Deadlines.** An answer must be written within `write_deadline(size)`: a
  fixed allowance plus its size at `MIN_UPLOAD_RATE` (or at this node's own
  upload cap shared by every slot, where that is slower: the provider's cap
  is not the reader's fault). A reader that stops reading, or reads slower
  than that, loses its slot then. Its stream is reset, never reused: part of
  a frame has gone out and nothing else can follow it (on libp2p the
  connection's writes stay whole, `node.whole_writes`; only that stream is
  torn). An honest asker on a link too slow for its window sees failures,
  and its schedule halves the window, which speeds each remaining request.

`UploadSlots` is sans-IO (no streams, no clock): the service takes a slot per
request and gives it back when the answer is written or abandoned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_UPLOADS = 16  # answers written at once, by everyone together
MAX_UPLOADS_PER_PEER = 4  # by one peer: a download's window (download.MAX_WINDOW)
MAX_STRANGER_UPLOADS = 8  # by all strangers together: the rest are kept for members of a run
WRITE_BASE = 2.0  # seconds every answer is allowed on top of its size's worth: round trips, a slow start
# Bytes per second an asker must read an answer at, at least, to keep its slot: low enough for a
# volunteer's slow downlink shared by a download's whole window (half a megabit a stream).
MIN_UPLOAD_RATE = 64 * 1024

MemberTest = Callable[[str], bool]


def write_deadline(size: int, *, upload_cap: float = 0.0, slots: int = MAX_UPLOADS) -> float:
    """Seconds an answer of `size` bytes may take to write: `WRITE_BASE` plus `size` at the slower
    of `MIN_UPLOAD_RATE` and this node's `upload_cap` (bytes per second, 0: none) split over `slots`."""
    rate = float(MIN_UPLOAD_RATE)
    if upload_cap > 0:
        rate = min(rate, upload_cap / max(1, slots))
    return WRITE_BASE + size / rate


@dataclass
class Slot:
    """One slot taken by `peer_id` (`member`: counted among the members' then); `release` gives it back (once)."""

    peer_id: str
    member: bool
    _owner: UploadSlots | None = field(default=None, repr=False)

    def release(self) -> None:
        """Give the slot back; a second call does nothing."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._give_back(self)


class UploadSlots:
    """At most `total` slots held at once, `per_peer` by one peer, `strangers` by non-members together."""

    def __init__(
        self, total: int = MAX_UPLOADS, *, per_peer: int = MAX_UPLOADS_PER_PEER,
        strangers: int = MAX_STRANGER_UPLOADS, is_member: MemberTest | None = None,
    ) -> None:
        if min(total, per_peer, strangers) < 0:
            raise ValueError("slot counts cannot be negative")
        self.total = total
        self.per_peer = per_peer
        # Without a way to tell members, there is nobody to keep slots for.
        self.strangers = total if is_member is None else min(strangers, total)
        self._is_member = is_member
        self.in_use = 0
        self.strangers_in_use = 0
        self._by_peer: Counter[str] = Counter()

    def held_by(self, peer_id: str) -> int:
        """How many slots `peer_id` holds now."""
        return self._by_peer[peer_id]

    def take(self, peer_id: str) -> Slot | None:
        """A slot for `peer_id`, or None when the rules above leave it none (answer ``busy``)."""
        if self.in_use >= self.total or self._by_peer[peer_id] >= self.per_peer:
            return None
        member = self._is_member is not None and self._is_member(peer_id)
        if not member and self.strangers_in_use >= self.strangers:
            return None
        self.in_use += 1
        self.strangers_in_use += 0 if member else 1
        self._by_peer[peer_id] += 1
        return Slot(peer_id, member, self)

    def _give_back(self, slot: Slot) -> None:
        self.in_use -= 1
        self.strangers_in_use -= 0 if slot.member else 1
        self._by_peer[slot.peer_id] -= 1
        if not self._by_peer[slot.peer_id]:
            del self._by_peer[slot.peer_id]
