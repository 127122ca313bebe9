"""NAT-PMP (RFC 6886): ask the home gateway for a TCP port mapping, over UDP port 5351.

Sans-IO part: `encode_*` build the two requests we send (external address,
map TCP port) and `decode_*` check a reply against what we asked, raising
`MappingError` for anything else (wrong length, version, opcode, port, or a
non-zero result code, named as the RFC names it). A mapping request with
lifetime 0 deletes the mapping (RFC 6886 section 3.4).

Trio part: `NatPmpClient` sends a request on a UDP socket *connected* to the
gateway (so the kernel drops datagrams from anyone else, as section 3.1
asks), waits 250 ms for the reply, doubling the wait on every retry as the
RFC says, but gives up after `tries` sends (the RFC's nine tries take 64 s;
a best-effort mapper would rather fall back to UPnP sooner).

PCP (RFC 6887), NAT-PMP's successor on the same port, is not spoken: a PCP
gateway answers our version-0 request with UNSUPP_VERSION (result 1), which
ends the attempt with a clear error.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

import trio

from locomesh.node.nat.mapping_errors import MappingError

PORT = 5351
VERSION = 0
OP_EXTERNAL_ADDRESS = 0
OP_MAP_TCP = 2
REPLY_BIT = 128
FIRST_WAIT = 0.25
TRIES = 4
MAX_DATAGRAM = 1100  # RFC 6886 replies are 12 or 16 bytes; anything bigger is not NAT-PMP

RESULT_CODES = {
    1: "unsupported version",
    2: "not authorized / refused",
    3: "network failure",
    4: "out of resources",
    5: "unsupported opcode",
}


@dataclass(frozen=True)
class NatPmpMapping:
    internal_port: int
    external_port: int
    lifetime: int  # seconds the gateway grants; 0 means the mapping was deleted


def encode_external_address_request() -> bytes:
    return struct.pack("!BB", VERSION, OP_EXTERNAL_ADDRESS)


def encode_map_request(internal_port: int, external_port: int, lifetime: int) -> bytes:
    """Map TCP `internal_port`, suggesting `external_port` (0: any), for `lifetime` s (0: delete)."""
    if not 0 < internal_port < 65536 or not 0 <= external_port < 65536 or not 0 <= lifetime < 2**32:
        raise ValueError("a port is 1-65535 (external: 0 for any) and a lifetime fits 32 bits")
    return struct.pack("!BBHHHI", VERSION, OP_MAP_TCP, 0, internal_port, external_port, lifetime)


def decode_external_address_reply(data: bytes) -> str:
    """The gateway's external IPv4 address from a 12-byte reply."""
    _check_header(data, OP_EXTERNAL_ADDRESS, 12)
    address = ipaddress.IPv4Address(data[8:12])
    if address.is_unspecified:
        raise MappingError("no-external-address", "the gateway has no external address yet (0.0.0.0)")
    return str(address)


def decode_map_reply(data: bytes, *, internal_port: int) -> NatPmpMapping:
    """The mapping from a 16-byte reply to our request for `internal_port`."""
    _check_header(data, OP_MAP_TCP, 16)
    internal, external, lifetime = struct.unpack("!HHI", data[8:16])
    if internal != internal_port:
        raise MappingError("bad-reply", f"NAT-PMP reply is for port {internal}, we asked for {internal_port}")
    if lifetime and not 0 < external < 65536:
        raise MappingError("bad-reply", f"NAT-PMP reply maps to port {external}")
    return NatPmpMapping(internal_port=internal, external_port=external, lifetime=lifetime)


def _check_header(data: bytes, opcode: int, length: int) -> None:
    if len(data) < 4:
        raise MappingError("bad-reply", f"NAT-PMP reply of {len(data)} bytes")
    version, op, result = struct.unpack("!BBH", data[:4])
    if version != VERSION:
        raise MappingError("bad-reply", f"NAT-PMP reply of version {version}")
    if op != REPLY_BIT + opcode:
        raise MappingError("bad-reply", f"NAT-PMP reply opcode {op}, expected {REPLY_BIT + opcode}")
    if result != 0:
        reason = RESULT_CODES.get(result, "unknown result code")
        raise MappingError("gateway-refused", f"NAT-PMP result {result} ({reason})")
    if len(data) != length:
        raise MappingError("bad-reply", f"NAT-PMP reply of {len(data)} bytes, expected {length}")


class NatPmpClient:
    """Requests to one gateway; every method returns within about `FIRST_WAIT * (2**tries - 1)` seconds."""

    def __init__(self, gateway: str, *, port: int = PORT, tries: int = TRIES, first_wait: float = FIRST_WAIT) -> None:
        self.gateway = gateway
        self.port = port
        self.tries = tries
        self.first_wait = first_wait

    async def external_address(self) -> str:
        return decode_external_address_reply(await self._exchange(encode_external_address_request()))

    async def map_tcp(self, internal_port: int, external_port: int, lifetime: int) -> NatPmpMapping:
        request = encode_map_request(internal_port, external_port, lifetime)
        return decode_map_reply(await self._exchange(request), internal_port=internal_port)

    async def unmap_tcp(self, internal_port: int) -> None:
        await self.map_tcp(internal_port, 0, 0)

    async def _exchange(self, request: bytes) -> bytes:
        """Send `request` until a reply comes, waiting `first_wait` then twice as long each time."""
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            try:
                await sock.connect((self.gateway, self.port))
            except OSError as error:
                raise MappingError("no-gateway", f"cannot reach {self.gateway}:{self.port}: {error}") from None
            wait = self.first_wait
            for _ in range(self.tries):
                try:
                    await sock.send(request)
                    with trio.move_on_after(wait):
                        return await sock.recv(MAX_DATAGRAM)
                except OSError as error:  # e.g. ICMP port unreachable: nobody speaks NAT-PMP there
                    raise MappingError("no-gateway", f"NAT-PMP at {self.gateway}: {error}") from None
                wait *= 2
        raise MappingError("timeout", f"no NAT-PMP reply from {self.gateway} after {self.tries} tries")
