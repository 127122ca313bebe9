"""zstd that never inflates past a stated cap.

A peer can send a few kilobytes that decompress to gigabytes (a zstd bomb). The
rules here:

- a frame must declare its content size in its header, and that size must be
  within the caller's cap; then it is inflated in one shot into a buffer of
  exactly that size, so it cannot grow past it;
- exactly one frame, nothing after it (trailing bytes would give one payload
  many byte forms, and commitments are hashes of bytes).
"""

from __future__ import annotations

import zstandard

from .errors import ProtocolError

_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK_RLE = 1
_BLOCK_RESERVED = 3


def compress(data: bytes, *, level: int = 3) -> bytes:
    """zstd-compress `data` as one frame that records its content size."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def compress_bound(raw_size: int) -> int:
    """An upper bound on the size of the one frame `compress` makes of `raw_size` bytes, at any
    level: zstd's own worst case (ZSTD_compressBound: raw + raw/256, plus up to 64 bytes for small
    inputs) with room for the frame header and checksum."""
    return raw_size + (raw_size >> 8) + 256


def decompress(frame: bytes | bytearray | memoryview, *, max_output: int) -> bytes:
    """Inflate one zstd frame (any bytes-like object: it is read, never copied) into at most
    `max_output` bytes, or raise `ProtocolError`."""
    frame = memoryview(frame).cast("B")
    declared = _declared_size(frame)
    if declared > max_output:
        raise ProtocolError("too-large", f"frame declares {declared} bytes, over the cap of {max_output}")
    if _frame_length(frame) != len(frame):
        raise ProtocolError("trailing-bytes", "bytes follow the zstd frame")
    try:
        out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max_output)
    except zstandard.ZstdError as exc:
        raise ProtocolError("bad-compression", f"corrupt zstd frame: {exc}") from None
    if len(out) != declared:
        raise ProtocolError("bad-compression", "frame inflates to other than its declared size")
    return out


def _declared_size(frame: memoryview) -> int:
    if bytes(frame[: len(_MAGIC)]) != _MAGIC:
        raise ProtocolError("bad-compression", "not a zstd frame")
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise ProtocolError("bad-compression", f"unreadable zstd frame header: {exc}") from None
    if size < 0:
        raise ProtocolError("bad-compression", "zstd frame must declare its content size")
    return size


def _frame_length(frame: memoryview) -> int:
    """The length of the one zstd frame at the start of `frame`, read off its block headers."""
    try:
        pos = zstandard.frame_header_size(frame)  # magic number included
    except zstandard.ZstdError as exc:
        raise ProtocolError("bad-compression", f"unreadable zstd frame header: {exc}") from None
    has_checksum = bool(frame[4] & 0x04)
    while True:
        if pos + 3 > len(frame):
            raise ProtocolError("truncated", "zstd frame ends inside a block header")
        header = int.from_bytes(frame[pos : pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == _BLOCK_RESERVED:
            raise ProtocolError("bad-compression", "reserved zstd block type")
        pos += 3 + (1 if kind == _BLOCK_RLE else size)
        if last:
            break
    pos += 4 if has_checksum else 0
    if pos > len(frame):
        raise ProtocolError("truncated", "zstd frame is cut short")
    return pos
