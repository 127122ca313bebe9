"""Port mapping against real gateway responders on loopback: NAT-PMP over UDP, UPnP IGD over SSDP + HTTP.

The responders below speak the wire protocols (RFC 6886; SSDP, HTTP/1.1 and
SOAP as UPnP IGD routers do) and can be told to misbehave: refuse, stay
silent, send garbage, huge or DTD-laden XML, or point elsewhere.
"""

from __future__ import annotations

import re
import struct
from http import HTTPStatus

import h11
import pytest
import trio
from multiaddr import Multiaddr

from locomesh.cli.status_cmd import format_status
from locomesh.node.nat import natpmp, upnp
from locomesh.node.nat.http_client import Url, parse_response, render_request
from locomesh.node.nat.mapping_errors import MappingError
from locomesh.node.nat.natpmp import NatPmpClient
from locomesh.node.nat.port_mapping import NATPMP, UPNP, GatewayClients, PortMappingService, default_gateway
from locomesh.node.nat.reachability import PRIVATE, PUBLIC
from locomesh.node.runtime import Node

LOOPBACK = "127.0.0.1"
NATPMP_EXTERNAL = "203.0.113.7"
UPNP_EXTERNAL = "203.0.113.9"


# --- responders -----------------------------------------------------------------------------


async def _read_request(stream: trio.SocketStream) -> tuple[str, dict[str, str], bytes]:
    """One HTTP request from `stream`, read with h11: (method, headers by lower-case name, body)."""
    connection = h11.Connection(h11.SERVER)
    method, headers, body = "", {}, b""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Request):
            method = event.method.decode()
            headers = {name.decode(): value.decode() for name, value in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return method, headers, body


def _response(status: int, body: bytes) -> bytes:
    """An HTTP/1.1 answer carrying `body` as XML, closing the connection."""
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Length: {len(body)}\r\n"
    return (head + "Content-Type: text/xml\r\nConnection: close\r\n\r\n").encode() + body


class FakeNatPmp:
    """A NAT-PMP gateway on a UDP port; `mode` picks its behaviour: ok, refuse, silent, garbage, wrong-port.

    With `forward_to` set it really forwards: a mapping opens a TCP port on
    127.0.0.1 (the "external" side, reported as `external`) that relays every
    connection to `forward_to`:<internal port>, as a router's port forward would.
    """

    def __init__(self, mode: str = "ok", *, forward_to: str | None = None, external: str = NATPMP_EXTERNAL) -> None:
        self.mode = mode
        self.forward_to = forward_to
        self.external = external
        self.port = 0
        self.requests: list[bytes] = []
        self.mappings: dict[int, tuple[int, int]] = {}  # internal port -> (external port, lifetime)
        self._nursery: trio.Nursery | None = None

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
                await sock.bind((LOOPBACK, 0))
                self.port = sock.getsockname()[1]
                task_status.started()
                while True:
                    data, sender = await sock.recvfrom(2048)
                    self.requests.append(data)
                    await self._open_forward(data)
                    reply = self.reply(data)
                    if reply is not None:
                        await sock.sendto(reply, sender)

    async def _open_forward(self, data: bytes) -> None:
        """For a new mapping request, listen on a fresh port that forwards to the internal one."""
        if self.forward_to is None or len(data) != 12 or self.mode != "ok":
            return
        internal, lifetime = struct.unpack("!HI", data[4:6] + data[8:12])
        if lifetime and internal not in self.mappings:
            listeners = await self._nursery.start(trio.serve_tcp, lambda s: _forward(s, self.forward_to, internal), 0)
            self.mappings[internal] = (listeners[0].socket.getsockname()[1], lifetime)

    def reply(self, data: bytes) -> bytes | None:
        if self.mode == "silent":
            return None
        if self.mode == "garbage":
            return b"\x00\x80" + b"\xff" * 40
        op = data[1]
        result = 2 if self.mode == "refuse" else 0
        header = struct.pack("!BBHI", 0, 128 + op, result, 1000)
        if op == 0:
            return header + bytes(map(int, self.external.split(".")))
        _, _, _, internal, external, lifetime = struct.unpack("!BBHHHI", data)
        if lifetime == 0:
            self.mappings.pop(internal, None)
        elif result == 0:
            self.mappings[internal] = (self.mappings.get(internal, (external or 40000, 0))[0], lifetime)
        granted = self.mappings.get(internal, (0, 0))[0]
        if self.mode == "wrong-port":
            internal += 1
        return header + struct.pack("!HHI", internal, granted, lifetime)


async def _forward(inbound: trio.SocketStream, host: str, port: int) -> None:
    """Relay bytes both ways between `inbound` and host:port until either side closes."""

    async def pump(source, sink) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    async with inbound, await trio.open_tcp_stream(host, port) as outbound, trio.open_nursery() as nursery:
        nursery.start_soon(pump, inbound, outbound)
        nursery.start_soon(pump, outbound, inbound)


DESCRIPTION = """<?xml version="1.0"?>
<root xmlns="urn:schemas-upnp-org:device-1-0"><device>
<deviceType>urn:schemas-upnp-org:device:InternetGatewayDevice:1</deviceType>
<deviceList><device><deviceType>urn:schemas-upnp-org:device:WANDevice:1</deviceType>
<deviceList><device><deviceType>urn:schemas-upnp-org:device:WANConnectionDevice:1</deviceType>
<serviceList><service>
<serviceType>urn:schemas-upnp-org:service:WANIPConnection:1</serviceType>
<controlURL>{control}</controlURL>
</service></serviceList></device></deviceList></device></deviceList></device></root>"""

FAULT = """<?xml version="1.0"?><s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body>
<s:Fault><faultcode>s:Client</faultcode><faultstring>UPnPError</faultstring><detail>
<UPnPError xmlns="urn:schemas-upnp-org:control-1-0"><errorCode>718</errorCode>
<errorDescription>ConflictInMappingEntry</errorDescription></UPnPError></detail></s:Fault></s:Body></s:Envelope>"""

BILLION_LAUGHS = b"""<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">
<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]><root>&lol2;</root>"""


class FakeIgd:
    """An SSDP responder and an HTTP server for the description and control URL.

    `mode`: ok, fault (AddPortMapping answers UPnP error 718), permanent (error
    725 unless the lease is 0, as some IGD:1 routers do), huge (a 200 KiB
    description), dtd (an entity bomb), elsewhere (LOCATION on another host),
    chunked (the description in chunked transfer coding), mute (no SSDP answer).
    """

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.ssdp_port = 0
        self.http_port = 0
        self.actions: list[tuple[str, dict[str, str]]] = []
        self.mappings: dict[int, dict[str, str]] = {}

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, self._http, 0)
            self.http_port = listeners[0].socket.getsockname()[1]
            await nursery.start(self._ssdp)
            task_status.started()

    async def _ssdp(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            await sock.bind((LOOPBACK, 0))
            self.ssdp_port = sock.getsockname()[1]
            task_status.started()
            while True:
                data, sender = await sock.recvfrom(2048)
                if self.mode == "mute" or upnp.IGD_DEVICE.encode() not in data or not data.startswith(b"M-SEARCH"):
                    continue
                host = "192.0.2.1" if self.mode == "elsewhere" else LOOPBACK
                await sock.sendto(b"HTTP/1.1 200 OK\r\nNoise\r\n\r\n", sender)  # a broken device answers first
                location = f"http://{host}:{self.http_port}/desc.xml"
                reply = f"HTTP/1.1 200 OK\r\nST: {upnp.IGD_DEVICE}\r\nLOCATION: {location}\r\n\r\n"
                await sock.sendto(reply.encode(), sender)

    async def _http(self, stream: trio.SocketStream) -> None:
        method, headers, body = await _read_request(stream)
        if method == "GET":
            await stream.send_all(self._description())
        else:
            status, body = self._control(headers["soapaction"], body)
            await stream.send_all(_response(status, body))
        await stream.aclose()

    def _description(self) -> bytes:
        if self.mode == "huge":
            body = DESCRIPTION.format(control="/ctl").encode() + b"<!-- " + b"x" * 200_000 + b" -->"
        elif self.mode == "dtd":
            body = BILLION_LAUGHS
        else:
            body = DESCRIPTION.format(control="/ctl").encode()
        if self.mode == "chunked":
            pieces = [body[i : i + 100] for i in range(0, len(body), 100)]
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        return _response(200, body)

    def _control(self, soap_action: str, body: bytes) -> tuple[int, bytes]:
        action = soap_action.strip('"').split("#")[1]
        arguments = dict(re.findall(rb"<(New\w+)>([^<]*)</New\w+>", body))
        arguments = {name.decode(): value.decode() for name, value in arguments.items()}
        self.actions.append((action, arguments))
        if action == "AddPortMapping":
            if self.mode == "fault":
                return 500, FAULT.encode()
            if self.mode == "permanent" and arguments["NewLeaseDuration"] != "0":
                return 500, FAULT.replace("718", "725").replace("Conflict", "OnlyPermanentLeasesSupported").encode()
            self.mappings[int(arguments["NewExternalPort"])] = arguments
        elif action == "DeletePortMapping":
            self.mappings.pop(int(arguments["NewExternalPort"]), None)
        inner = ""
        if action == "GetExternalIPAddress":
            inner = f"<NewExternalIPAddress>{UPNP_EXTERNAL}</NewExternalIPAddress>"
        reply = (
            f'<?xml version="1.0"?><s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body>'
            f'<u:{action}Response xmlns:u="urn:schemas-upnp-org:service:WANIPConnection:1">{inner}'
            f"</u:{action}Response></s:Body></s:Envelope>"
        )
        return 200, reply.encode()

    def client(self, **kwargs) -> upnp.UpnpClient:
        return upnp.UpnpClient(ssdp_address=(LOOPBACK, self.ssdp_port), search_wait=1.0, http_timeout=2.0, **kwargs)


# --- NAT-PMP ----------------------------------------------------------------------------------


def test_natpmp_messages_round_trip_and_bad_replies_are_typed():
    assert natpmp.encode_external_address_request() == b"\x00\x00"
    assert natpmp.encode_map_request(4001, 4001, 7200) == struct.pack("!BBHHHI", 0, 2, 0, 4001, 4001, 7200)
    reply = struct.pack("!BBHIHHI", 0, 130, 0, 5, 4001, 40001, 7200)
    assert natpmp.decode_map_reply(reply, internal_port=4001) == natpmp.NatPmpMapping(4001, 40001, 7200)
    external = struct.pack("!BBHI", 0, 128, 0, 5) + b"\xcb\x00\x71\x07"
    assert natpmp.decode_external_address_reply(external) == "203.0.113.7"
    bad = {
        "short": b"\x00",
        "version": struct.pack("!BBHIHHI", 1, 130, 0, 5, 4001, 40001, 7200),
        "opcode": struct.pack("!BBHIHHI", 0, 129, 0, 5, 4001, 40001, 7200),
        "length": reply + b"\x00",
        "port": struct.pack("!BBHIHHI", 0, 130, 0, 5, 4002, 40001, 7200),
        "unmapped": struct.pack("!BBHIHHI", 0, 130, 0, 5, 4001, 0, 7200),
    }
    for name, data in bad.items():
        with pytest.raises(MappingError) as caught:
            natpmp.decode_map_reply(data, internal_port=4001)
        assert caught.value.code == "bad-reply", name
    with pytest.raises(MappingError, match="result 4 .out of resources") as caught:
        natpmp.decode_map_reply(struct.pack("!BBHIHHI", 0, 130, 4, 5, 4001, 0, 0), internal_port=4001)
    assert caught.value.code == "gateway-refused"
    with pytest.raises(MappingError, match="0.0.0.0"):
        natpmp.decode_external_address_reply(struct.pack("!BBHI", 0, 128, 0, 5) + bytes(4))
    with pytest.raises(ValueError):
        natpmp.encode_map_request(0, 1, 1)


async def test_natpmp_client_maps_renews_and_deletes(nursery):
    gateway = FakeNatPmp()
    await nursery.start(gateway.serve)
    client = NatPmpClient(LOOPBACK, port=gateway.port, tries=2, first_wait=0.2)
    assert await client.external_address() == NATPMP_EXTERNAL
    mapping = await client.map_tcp(4001, 4001, 3600)
    assert (mapping.external_port, mapping.lifetime) == (4001, 3600)
    assert gateway.mappings == {4001: (4001, 3600)}
    await client.unmap_tcp(4001)
    assert gateway.mappings == {}


@pytest.mark.parametrize(("mode", "code"), [("refuse", "gateway-refused"), ("silent", "timeout"),
                                            ("garbage", "bad-reply"), ("wrong-port", "bad-reply")])
async def test_natpmp_client_misbehaving_gateways(nursery, mode, code):
    gateway = FakeNatPmp(mode)
    await nursery.start(gateway.serve)
    client = NatPmpClient(LOOPBACK, port=gateway.port, tries=2, first_wait=0.1)
    with pytest.raises(MappingError) as caught:
        await client.map_tcp(4001, 4001, 3600)
    assert caught.value.code == code
    assert len(gateway.requests) == (2 if mode == "silent" else 1)  # retried only while nothing answers


# --- HTTP and XML -------------------------------------------------------------------------------


def test_http_responses_by_length_chunks_and_end_of_stream():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    assert parse_response(ok[:-1], eof=False) is None
    assert parse_response(ok + b"extra", eof=False).body == b"hello"
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n"
    assert parse_response(chunked, eof=False).body == b"hello"
    assert parse_response(chunked[:-2], eof=False) is None
    assert parse_response(b"HTTP/1.0 404 Not Found\r\nServer: x\r\n\r\nno", eof=True).status == 404
    request = render_request("GET", Url.parse("http://10.0.0.1:5000/d.xml"))
    assert request.startswith(b"GET /d.xml HTTP/1.1\r\nHost: 10.0.0.1:5000\r\n")
    bad = {
        b"HTTP/2 200 OK\r\n\r\n": "bad-reply",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n": "bad-reply",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n": "bad-reply",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n": "too-large",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n": "bad-reply",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort": "bad-reply",  # the stream ended early
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 3000: "too-large",
    }
    for data, code in bad.items():
        with pytest.raises(MappingError) as caught:
            parse_response(data, eof=True)
        assert caught.value.code == code, data[:40]
    not_gateway_urls = (
        "https://10.0.0.1/", "http://router.lan/", "http://10.0.0.1/a b", "http://u:p@10.0.0.1/", "ftp://1.2.3.4/"
    )
    for text in not_gateway_urls:
        with pytest.raises(MappingError):
            Url.parse(text)


def test_descriptions_and_soap_replies_are_read_strictly():
    location = Url.parse("http://192.168.1.1:5000/desc.xml")
    gateway = upnp.find_control_url(DESCRIPTION.format(control="/ctl/IPConn").encode(), location)
    assert str(gateway.control_url) == "http://192.168.1.1:5000/ctl/IPConn"
    assert gateway.service_type == "urn:schemas-upnp-org:service:WANIPConnection:1"
    refused = {
        BILLION_LAUGHS: "bad-reply",
        b"<root>" + b"x" * (upnp.MAX_XML + 1) + b"</root>": "too-large",
        b"<root><unclosed></root>": "bad-reply",
        DESCRIPTION.format(control="http://192.0.2.5/steal").encode(): "bad-reply",  # another host
        DESCRIPTION.replace("WANIPConnection", "Layer3Forwarding").format(control="/c").encode(): "bad-reply",
    }
    for data, code in refused.items():
        with pytest.raises(MappingError) as caught:
            upnp.find_control_url(data, location)
        assert caught.value.code == code
    headers, body = upnp.encode_soap("urn:x:1", "AddPortMapping", {"NewPortMappingDescription": "a<b"})
    assert headers["SOAPAction"] == '"urn:x:1#AddPortMapping"' and b"a&lt;b" in body
    with pytest.raises(MappingError, match="UPnP error 718 .ConflictInMappingEntry") as caught:
        upnp.decode_soap(500, FAULT.encode(), "AddPortMapping")
    assert caught.value.code == "gateway-refused"
    with pytest.raises(MappingError, match="no GetExternalIPAddressResponse"):
        upnp.decode_soap(200, b"<a/>", "GetExternalIPAddress")
    with pytest.raises(MappingError, match="not on the gateway"):
        upnp.decode_ssdp_reply(b"HTTP/1.1 200 OK\r\nLOCATION: http://10.9.9.9/d.xml\r\n\r\n", "10.0.0.1")


# --- UPnP against the responder -----------------------------------------------------------------


async def test_upnp_client_discovers_maps_and_deletes(nursery):
    igd = FakeIgd("chunked")
    await nursery.start(igd.serve)
    client = igd.client()
    gateway = await client.discover()
    assert gateway.control_url == Url(LOOPBACK, igd.http_port, "/ctl")
    await client.add_port_mapping(internal_client="10.0.0.2", port=4001, external_port=4001, lease=3600)
    assert igd.mappings[4001]["NewInternalClient"] == "10.0.0.2"
    assert igd.mappings[4001]["NewLeaseDuration"] == "3600"
    assert await client.external_address() == UPNP_EXTERNAL
    await client.delete_port_mapping(4001)
    assert igd.mappings == {}


@pytest.mark.parametrize(("mode", "code"), [("huge", "too-large"), ("dtd", "bad-reply"), ("elsewhere", "bad-reply"),
                                            ("mute", "timeout"), ("fault", "gateway-refused")])
async def test_upnp_client_misbehaving_gateways(nursery, mode, code):
    igd = FakeIgd(mode)
    await nursery.start(igd.serve)
    client = igd.client()
    with pytest.raises(MappingError) as caught:
        await client.discover()
        await client.add_port_mapping(internal_client="10.0.0.2", port=4001, external_port=4001, lease=3600)
    assert caught.value.code == code
    assert igd.mappings == {}


# --- the service in a node ----------------------------------------------------------------------


class Verdict:
    """A reachability verdict and confirmed addresses that the test sets."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.confirmed: list[str] = []


async def run_mapper(nursery, identity, clients, verdict, **kwargs):
    mapper = PortMappingService(lambda: verdict.verdict, lambda: verdict.confirmed, clients=clients,
                                check_interval=0.05, **kwargs)
    node = Node.create(identity, listen_addrs=[Multiaddr(f"/ip4/{LOOPBACK}/tcp/0")], services=[mapper])
    await nursery.start(node.run)
    return node, mapper


async def start_gateway(nursery, *, natpmp_mode: str, igd_mode: str) -> tuple[FakeIgd, GatewayClients]:
    """A gateway speaking both protocols (each in its mode) and the clients that talk to it."""
    natpmp_server, igd = FakeNatPmp(natpmp_mode), FakeIgd(igd_mode)
    for server in (natpmp_server, igd):
        await nursery.start(server.serve)
    clients = GatewayClients(
        LOOPBACK, natpmp_port=natpmp_server.port, ssdp_address=(LOOPBACK, igd.ssdp_port), search_wait=1.0,
        natpmp_tries=2,
    )
    return igd, clients


async def wait_for(condition, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.02)


async def test_service_maps_by_natpmp_advertises_when_confirmed_and_unmaps_at_shutdown(nursery, identity_factory):
    gateway = FakeNatPmp()
    await nursery.start(gateway.serve)
    clients = GatewayClients(LOOPBACK, natpmp_port=gateway.port, ssdp_address=(LOOPBACK, 9), natpmp_tries=2)
    verdict = Verdict(PUBLIC)
    node, mapper = await run_mapper(nursery, identity_factory(61), clients, verdict, lease=4)
    await wait_for(lambda: mapper.state == "not-needed")
    assert gateway.requests == []  # a public node leaves the gateway alone
    verdict.verdict = PRIVATE
    await wait_for(lambda: mapper.state == "mapped")
    port = int(node.listen_addresses()[0].split("/")[4])
    address = f"/ip4/{NATPMP_EXTERNAL}/tcp/{port}"
    assert mapper.candidate_addrs() == [address] and mapper.advertised_addrs() == []
    status = node.status()["port_mapping"]
    shown = (status["protocol"], status["external_addr"], status["lease_s"], status["confirmed"])
    assert shown == (NATPMP, address, 4, False)
    verdict.confirmed = [address]
    assert mapper.advertised_addrs() == [address] and node.status()["port_mapping"]["confirmed"]
    requests = len(gateway.requests)
    await wait_for(lambda: len(gateway.requests) >= requests + 2, timeout=5.0)  # renewed at half the lease
    assert mapper.state == "mapped" and gateway.mappings[port][1] == 4
    node.request_stop()
    await wait_for(lambda: gateway.mappings == {})
    assert mapper.mapping is None


async def test_service_falls_back_to_upnp_and_survives_hostile_gateways(nursery, identity_factory):
    igd, clients = await start_gateway(nursery, natpmp_mode="garbage", igd_mode="ok")
    node, mapper = await run_mapper(nursery, identity_factory(62), clients, Verdict(PRIVATE))
    await wait_for(lambda: mapper.state == "mapped")
    port = int(node.listen_addresses()[0].split("/")[4])
    assert mapper.mapping.protocol == UPNP and mapper.candidate_addrs() == [f"/ip4/{UPNP_EXTERNAL}/tcp/{port}"]
    assert igd.mappings[port]["NewInternalClient"] == LOOPBACK
    igd.mode = "fault"
    mapper.mapping.granted_at -= 10_000  # due for renewal now; the gateway now refuses
    await wait_for(lambda: mapper.state == "failed")
    assert "UPnP error 718" in node.status()["port_mapping"]["reason"] and mapper.candidate_addrs() == []
    assert not node.stopping  # a bad gateway never takes the node down


async def test_service_takes_a_permanent_upnp_mapping_where_leases_are_refused(nursery, identity_factory):
    igd, clients = await start_gateway(nursery, natpmp_mode="silent", igd_mode="permanent")
    node, mapper = await run_mapper(nursery, identity_factory(64), clients, Verdict(PRIVATE))
    await wait_for(lambda: mapper.state == "mapped")
    port = int(node.listen_addresses()[0].split("/")[4])
    assert igd.mappings[port]["NewLeaseDuration"] == "0" and node.status()["port_mapping"]["lease_s"] == 0
    assert "permanent lease (re-added in" in format_status(node.status())
    node.request_stop()
    await wait_for(lambda: igd.mappings == {})  # deleted at shutdown all the same


async def test_service_reports_why_there_is_no_mapping(nursery, identity_factory):
    _, clients = await start_gateway(nursery, natpmp_mode="refuse", igd_mode="dtd")
    node, mapper = await run_mapper(nursery, identity_factory(63), clients, Verdict(PRIVATE), retry_interval=600)
    await wait_for(lambda: mapper.state == "failed")
    reason = node.status()["port_mapping"]["reason"]
    assert "nat-pmp: gateway-refused" in reason and "upnp: bad-reply" in reason and "DTD" in reason
    off = PortMappingService(lambda: PRIVATE, list, enabled=False)
    assert off.status() == {"state": "off", "reason": "turned off (port_mapping = off)"}


def test_default_gateway_from_the_route_table(tmp_path):
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\n"
    )
    assert default_gateway(str(table)) == "192.168.1.1"
    assert default_gateway(str(tmp_path / "missing")) is None


async def test_a_private_node_becomes_public_through_its_mapping(nursery, identity_factory):
    """End to end: the dial-back check refutes our listen port, the mapper maps it, the check proves the mapping.

    Node A listens on 127.0.0.2 but its connections leave from 127.0.0.1, where
    the dialer C, asked by A's two helpers, dials its ports back: nothing
    answers there, so A is private. Its
    gateway forwards a port on 127.0.0.1 to A's listen port; the next probes
    reach A through it, A turns public and advertises the mapped address.
    """
    from locomesh.node.nat.reach_service import ReachabilityService, advertised_addrs

    gateway = FakeNatPmp(forward_to="127.0.0.2", external=LOOPBACK)
    await nursery.start(gateway.serve)
    helpers = []  # the dialer C, then two helpers connected to it (C must not be connected to A)
    for index in (71, 72, 74):
        reach = ReachabilityService(first_delay=3600, allow_private_addrs=True)  # loopback: all private
        bootstrap = [Multiaddr(helper.listen_addresses()[0]) for helper in helpers]
        node = Node.create(identity_factory(index), listen_addrs=[Multiaddr(f"/ip4/{LOOPBACK}/tcp/0")],
                           services=[reach], bootstrap=bootstrap)
        await nursery.start(node.run)
        helpers.append(node)
    await wait_for(lambda: len(helpers[0].peers) == 2)
    clients = GatewayClients(LOOPBACK, natpmp_port=gateway.port, ssdp_address=(LOOPBACK, 9), natpmp_tries=2)
    mapper = PortMappingService(lambda: reach.verdict, lambda: reach.tracker.confirmed_addrs(), clients=clients,
                                check_interval=0.1, on_mapped=lambda: reach.probe_soon())
    reach = ReachabilityService(first_delay=0.5, retry_interval=0.3, allow_private_addrs=True,
                                addresses=lambda node: advertised_addrs(node) + mapper.candidate_addrs())
    node = Node.create(identity_factory(73), listen_addrs=[Multiaddr("/ip4/127.0.0.2/tcp/0")], services=[reach, mapper],
                       bootstrap=[Multiaddr(helper.listen_addresses()[0]) for helper in helpers[1:]])
    await nursery.start(node.run)
    await wait_for(lambda: mapper.state == "mapped", timeout=30.0)  # private first: the mapper waits for that
    mapped = mapper.candidate_addrs()[0]
    listen_port = node.listen_addresses()[0].split("/")[4]
    assert mapped.startswith(f"/ip4/{LOOPBACK}/tcp/") and mapped != f"/ip4/{LOOPBACK}/tcp/{listen_port}"
    await wait_for(lambda: reach.verdict == PUBLIC, timeout=30.0)
    assert mapper.advertised_addrs() == [mapped] and mapped in reach.tracker.confirmed_addrs()
    assert node.status()["port_mapping"]["confirmed"]


def test_status_shows_the_mapping_or_why_none_and_the_flag_turns_it_off(tmp_path):
    from locomesh.cli.main import build_parser
    from locomesh.node.config import ConfigError, load_config

    mapped = {"state": "mapped", "reason": "", "protocol": "upnp", "external_addr": "/ip4/203.0.113.9/tcp/4001",
              "lease_s": 3600, "renew_in_s": 1799.5, "confirmed": True}
    line = "port mapping     upnp /ip4/203.0.113.9/tcp/4001, lease 3600 s (renew in 1799.5 s), confirmed"
    assert line in format_status({"port_mapping": mapped})
    failed = {"state": "failed", "reason": "nat-pmp: timeout: no reply; upnp: timeout: no gateway"}
    assert "port mapping     failed: nat-pmp: timeout: no reply; upnp: timeout: no gateway" in format_status(
        {"port_mapping": failed}
    )
    args = build_parser().parse_args(["node", "start", "--data-dir", str(tmp_path), "--no-upnp"])
    assert args.no_upnp
    assert load_config(data_dir=tmp_path, flags={"port_mapping": "off"}, environ={}).port_mapping == "off"
    assert load_config(data_dir=tmp_path, environ={}).port_mapping == "on"
    (tmp_path / "config.toml").write_text('port_mapping = "sometimes"\n')
    with pytest.raises(ConfigError, match="port_mapping"):
        load_config(data_dir=tmp_path, environ={})


def test_every_address_a_dialback_proved_goes_into_the_peer_record():
    """A port-preserving NAT or a port forward: the dial-back proves <public ip>:<listen port> and the
    node turns public, reserving no relay. That address must then be in its peer record (the relay
    service's extra addresses), or nobody could reach it."""
    from locomesh.node.nat.services import nat_services

    reach, _mapper, relay = nat_services(relay="auto", nat_traversal="on", discovery=lambda: None, port_mapping="off")
    assert relay._extra_addrs() == []
    probe = reach.tracker.start_probe(b"n" * 16, "helper", ["/ip4/10.0.0.2/tcp/4001"])
    assert reach.tracker.on_dialback(b"n" * 16, "/ip4/198.51.100.7/tcp/4001", "dialer", opened_at=probe.sent_at)
    assert relay._extra_addrs() == ["/ip4/198.51.100.7/tcp/4001"]
