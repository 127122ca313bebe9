"""py-libp2p's circuit relay v2, with each circuit relayed and ended on its own.

py-libp2p's `CircuitV2Protocol` keeps the streams of the circuits it relays in
`_active_relays`, keyed by *peer ID*, and when one direction of a circuit
ended it closed whatever streams that key held: those of the newest circuit
of the same peer, not its own. A node behind a NAT holds several circuits
through each of its relays (one per peer that reached it there), so one
circuit ending (DCUtR closes the relayed leg after a hole punch) killed
another, live one. It also took the end of a stream (`StreamEOF`, a
half-close) for an error, retried the read three times with sleeps and then
tore both streams down. In netsim `nat` (30 nodes) this left 6-9 of 100 pairs
with no connection at all after their relayed connect had succeeded.

`CircuitRelay` replaces only the data pump, `_relay_data`, which py-libp2p
runs once per direction of a circuit: it copies from its source until the
source ends, then half-closes its destination, so the other direction goes
on until its own end; an error, the circuit's duration cap or its byte cap
resets both streams of *this* circuit. Only its own entries leave
`_active_relays` (py-libp2p's `stop()` still closes whatever is left there).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import trio
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.relay.circuit_v2 import protocol as libp2p_relay
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.tools.constants import MAX_READ_LEN

from locomesh.node.streams import close_quietly, reset_quietly

logger = logging.getLogger(__name__)


class CircuitRelay(CircuitV2Protocol):
    """`CircuitV2Protocol` whose circuits end one by one (see the module docstring)."""

    async def _relay_data(
        self,
        src_stream: Any,
        dst_stream: Any,
        peer_id: Any,
        deadline: float | None = None,
        circuit_data_limit: list[int] | None = None,
    ) -> None:
        """Copy `src_stream` to `dst_stream` until the source ends (then half-close the
        destination) or the circuit breaks, runs past `deadline` (`time.monotonic()`, as py-libp2p
        reads it) or past its shared byte budget `circuit_data_limit` (then reset both)."""
        try:
            while True:
                data = await self._read(src_stream, deadline)
                if not data:
                    await close_quietly(dst_stream)
                    return
                if circuit_data_limit is not None:
                    if len(data) > circuit_data_limit[0]:
                        raise _CircuitOver(f"data limit of the circuit with {peer_id} reached")
                    circuit_data_limit[0] -= len(data)
                with trio.fail_after(self.write_timeout):
                    await dst_stream.write(data)
        except Exception as error:  # noqa: BLE001 - a reset, a timeout, a cap: this circuit is over
            logger.debug("circuit with %s ends: %s: %s", peer_id, type(error).__name__, error)
            await reset_quietly(src_stream)
            await reset_quietly(dst_stream)
        finally:
            self._forget(src_stream)

    @staticmethod
    async def _read(stream: Any, deadline: float | None) -> bytes:
        """The next bytes of `stream`, or b"" at its end; `_CircuitOver` at `deadline`."""
        # The deadline is on the clock py-libp2p's relay module reads (netsim swaps it for virtual time).
        left = None if deadline is None else deadline - libp2p_relay.time.monotonic()
        try:
            with trio.fail_after(max(left, 0.0)) if left is not None else nullcontext():
                return await stream.read(MAX_READ_LEN)
        except StreamEOF:
            return b""
        except trio.TooSlowError:
            raise _CircuitOver("duration limit of the circuit reached") from None

    def _forget(self, stream: Any) -> None:
        for key, streams in list(self._active_relays.items()):
            if any(held is stream for held in streams):
                del self._active_relays[key]


class _CircuitOver(Exception):
    """A circuit reached one of its caps."""
