"""One simulated connection: two bounded one-way pipes, timed by `links.Direction`.

A `Pipe` carries bytes one way. `write` stamps each chunk with the virtual
time it becomes readable (the link model decides) and queues it; `read`
sleeps until the first queued chunk has arrived and hands out up to `n`
bytes of it. Bytes written but not yet read count against the pipe's
buffer: once ``profile.buffer`` bytes are in flight, `write` waits for the
reader (back-pressure: a slow reader, or a slow link, slows the writer down,
as TCP's windows do). A write larger than the buffer goes in buffer-sized
pieces.

Ends of a pipe:

* the writer closes it: the reader gets the remaining bytes, then ``b""``
  (end of stream) once the last byte and the FIN have arrived;
* either side breaks it (a crash, a partition, a reset): pending and later
  reads and writes raise `ConnectionBroken` at once; bytes in flight are lost.

`SimStream` is one end of a connection (the `ReadWriteCloser` py-libp2p
wraps in a `RawConnection`): it writes to one pipe and reads from the other.

Cost notes (a thousand-node run passes millions of chunks through here):

* `write` does not yield to the scheduler when the buffer has room (it only
  raises `Cancelled` if its scope is cancelled, as a checkpoint would): a
  socket write with room in the send buffer returns at once too, and a yield
  per write was a scheduler round trip per Yamux frame.
* A waiting reader is woken once per chunk, when it arrives, by the shared
  timer (`wakeups.Wakeups`), not when it is written and then again by a
  deadline of its own. Arrival times lie on that timer's grid when it has
  one (off by default: it cost reproducibility, see `wakeups`).
* Readers and writers wait in separate parking lots: a chunk written does
  not wake a writer waiting for room, nor a read a waiting reader.
"""

from __future__ import annotations

from collections import deque

import trio
from libp2p.io.abc import ReadWriteCloser
from libp2p.io.exceptions import IOException

from .links import Direction
from .wakeups import Wakeups

Endpoint = tuple[str, int]


class ConnectionBroken(IOException):
    """The simulated connection was reset (crash, partition, or a deliberate reset)."""


class Pipe:
    """Bytes one way, in order, readable at their arrival time, at most `buffer` in flight.

    `wakeups` is the timer that wakes readers (a simulation shares one; a
    pipe on its own gets its own).
    """

    def __init__(self, direction: Direction, wakeups: Wakeups | None = None) -> None:
        self._direction = direction
        self._wakeups = wakeups if wakeups is not None else Wakeups()
        self._capacity = direction.profile.buffer
        self._chunks: deque[tuple[float, bytes]] = deque()
        self._in_flight = 0
        self._eof_at: float | None = None
        self._broken: str | None = None
        self._readable = trio.lowlevel.ParkingLot()  # readers wait here for the next arrival
        self._room = trio.lowlevel.ParkingLot()  # writers wait here for buffer space
        self._wake_at: float | None = None  # the wake-up already asked of the timer, if any

    @property
    def in_flight(self) -> int:
        """Bytes written and not yet read."""
        return self._in_flight

    async def write(self, data: bytes) -> None:
        """Queue `data`; waits while the buffer is full. Raises `ConnectionBroken`."""
        view = memoryview(data)
        while view:
            self._check_writable()
            while self._in_flight >= self._capacity:
                await self._room.park()
                self._check_writable()
            piece = bytes(view[: self._capacity - self._in_flight])
            view = view[len(piece) :]
            arrival = self._wakeups.round_up(self._direction.arrival(trio.current_time(), len(piece)))
            self._chunks.append((arrival, piece))
            self._in_flight += len(piece)
            if len(self._chunks) == 1 and self._readable:
                self._wake_readers_at(arrival)
        await trio.lowlevel.checkpoint_if_cancelled()

    async def read(self, n: int | None = None) -> bytes:
        """Up to `n` bytes (all of the next chunk if None); ``b""`` at end of stream."""
        while True:
            self._check_readable()
            if self._chunks:
                arrival = self._chunks[0][0]
                if arrival <= trio.current_time():
                    return self._take(n)
                self._wake_readers_at(arrival)
            elif self._eof_at is not None:
                if self._eof_at <= trio.current_time():
                    return b""
                self._wake_readers_at(self._eof_at)
            await self._readable.park()  # woken by the timer, `write` (a first chunk) or `break_`

    def close(self) -> None:
        """The writer is done: the reader sees end of stream after the last byte (and one more delay)."""
        if self._eof_at is None and self._broken is None:
            self._eof_at = self._wakeups.round_up(self._direction.arrival(trio.current_time(), 0))
            if not self._chunks and self._readable:
                self._wake_readers_at(self._eof_at)

    def break_(self, reason: str) -> None:
        """Reset: wake everyone; all further reads and writes fail."""
        if self._broken is None:
            self._broken = reason
            self._chunks.clear()
            self._in_flight = 0
            self._readable.unpark_all()
            self._room.unpark_all()

    def _wake_readers_at(self, instant: float) -> None:
        """Ask the timer to wake this pipe's readers at `instant`, unless a wake-up that early is pending."""
        if self._wake_at is not None and trio.current_time() < self._wake_at <= instant:
            return  # (one due now may have fired already: then ask again; a spare wake-up is harmless)
        self._wake_at = instant
        self._wakeups.wake_at(instant, self._readable)

    def _take(self, n: int | None) -> bytes:
        arrival, chunk = self._chunks[0]
        if n is None or n >= len(chunk):
            self._chunks.popleft()
            taken = chunk
        else:
            taken, rest = chunk[:n], chunk[n:]
            self._chunks[0] = (arrival, rest)
        self._in_flight -= len(taken)
        if self._room:
            self._room.unpark_all()
        return taken

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise ConnectionBroken(self._broken)
        if self._eof_at is not None:
            raise ConnectionBroken("write after close")

    def _check_readable(self) -> None:
        if self._broken is not None:
            raise ConnectionBroken(self._broken)


class SimStream(ReadWriteCloser):
    """One end of a simulated connection, as py-libp2p sees a socket."""

    def __init__(self, outgoing: Pipe, incoming: Pipe, *, local: Endpoint, remote: Endpoint) -> None:
        self.outgoing = outgoing
        self.incoming = incoming
        self.local = local
        self.remote = remote
        self.closed = False

    async def read(self, n: int | None = None) -> bytes:
        return await self.incoming.read(n)

    async def write(self, data: bytes) -> None:
        await self.outgoing.write(data)

    async def close(self) -> None:
        """Send end of stream and stop reading (like closing a socket)."""
        self.closed = True
        self.outgoing.close()
        self.incoming.break_("closed locally")
        await trio.lowlevel.checkpoint()

    def reset(self, reason: str) -> None:
        """Break both directions now (no end of stream: the peer sees an error)."""
        self.closed = True
        self.outgoing.break_(reason)
        self.incoming.break_(reason)

    def get_remote_address(self) -> Endpoint:
        return self.remote

    def get_local_address(self) -> Endpoint:
        return self.local
