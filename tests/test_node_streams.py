"""Frame helpers and guarded handlers over real trio in-memory byte streams; the bootstrap backoff."""

from __future__ import annotations

import logging
import random

import pytest
import trio
import trio.testing

from locomesh.node.bootstrap import Backoff
from locomesh.node.streams import guarded, read_frame, read_frame_or_eof, write_frame
from locomesh.protocol import ProtocolError


class TrioByteStream:
    """A trio stream with the read/write/close/reset surface of a libp2p stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reset_called = False
        self.closed = False

    async def read(self, n: int | None = None) -> bytes:
        return await self.stream.receive_some(n)

    async def write(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def close(self) -> None:
        self.closed = True
        await self.stream.aclose()

    async def reset(self) -> None:
        self.reset_called = True
        await self.stream.aclose()


def pair() -> tuple[TrioByteStream, TrioByteStream]:
    left, right = trio.testing.memory_stream_pair()
    return TrioByteStream(left), TrioByteStream(right)


async def test_frames_round_trip():
    left, right = pair()
    await write_frame(left, b"hello", timeout=1)
    await write_frame(left, b"", timeout=1)
    assert await read_frame(right, max_size=5, timeout=1) == b"hello"
    assert await read_frame(right, max_size=5, timeout=1) == b""
    await left.stream.send_stream.aclose()
    assert await read_frame_or_eof(right, max_size=5, timeout=1) is None


async def test_an_oversized_frame_is_refused_before_its_payload_is_read():
    left, right = pair()
    await left.write((10**9).to_bytes(4, "big"))
    with pytest.raises(ProtocolError) as caught:
        await read_frame(right, max_size=100, timeout=1)
    assert caught.value.code == "too-large"


@pytest.mark.parametrize("sent, code", [(b"", "closed"), (b"\x00\x00", "truncated"), (b"\x00\x00\x00\x05abc", "truncated")])
async def test_a_stream_that_ends_mid_frame_is_truncated_and_one_closed_before_it_is_closed(sent, code):
    left, right = pair()
    await left.write(sent)
    await left.stream.send_stream.aclose()
    with pytest.raises(ProtocolError) as caught:
        await read_frame(right, max_size=100, timeout=1)
    assert caught.value.code == code


async def test_a_silent_peer_times_out(autojump_clock):
    left, right = pair()
    await left.write(b"\x00\x00\x00\x05ab")
    with pytest.raises(ProtocolError) as caught:
        await read_frame(right, max_size=100, timeout=5)
    assert caught.value.code == "timeout"


async def test_guarded_counts_logs_and_resets_on_error(caplog):
    errors: list[str] = []

    async def handler(stream):
        await read_frame(stream, max_size=4, timeout=1)

    left, right = pair()
    await left.write(b"\x00\x00\x01\x00")
    with caplog.at_level(logging.INFO):
        await guarded(handler, name="/test/1", on_error=errors.append)(right)
    assert errors == ["too-large"] and right.reset_called
    assert "/test/1" in caplog.text


async def test_guarded_catches_bugs_and_closes_on_success(caplog):
    errors: list[str] = []

    async def buggy(stream):
        raise KeyError("bug")

    async def fine(stream):
        await write_frame(stream, b"ok", timeout=1)

    _, right = pair()
    with caplog.at_level(logging.ERROR):
        await guarded(buggy, name="/test/1", on_error=errors.append)(right)
    assert errors == ["internal"] and right.reset_called
    assert "handler failed" in caplog.text

    left, right = pair()
    await guarded(fine, name="/test/1", on_error=errors.append)(right)
    assert right.closed and not right.reset_called
    assert await read_frame(left, max_size=2, timeout=1) == b"ok"


async def test_guarded_enforces_its_overall_deadline(autojump_clock):
    errors: list[str] = []

    async def slow(stream):
        await trio.sleep(100)

    _, right = pair()
    await guarded(slow, name="/test/1", on_error=errors.append, timeout=5)(right)
    assert errors == ["timeout"] and right.reset_called


async def test_guarded_lets_cancellation_through():
    async def slow(stream):
        await trio.sleep(100)

    _, right = pair()
    with trio.move_on_after(0.01) as scope:
        await guarded(slow, name="/test/1")(right)
    assert scope.cancelled_caught


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(base=1.0, cap=8.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(ceiling / 2 <= delay <= ceiling for delay, ceiling in zip(delays, ceilings))
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 1.0
    assert Backoff(base=1.0, cap=8.0, rng=random.Random(7)).next_delay() == delays[0]  # seeded: reproducible


async def test_guarded_counts_an_error_from_the_handlers_own_nursery_by_its_code():
    errors: list[str] = []

    async def handler(stream):
        async def child():
            raise ProtocolError("bad-field", "from a child task")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    _, right = pair()
    await guarded(handler, name="/test/1", on_error=errors.append)(right)
    assert errors == ["bad-field"]
