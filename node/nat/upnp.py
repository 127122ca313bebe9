"""UPnP IGD: find the gateway's WAN connection service and ask it for a TCP port mapping.

Sans-IO part, one function per message:

* `encode_msearch` / `decode_ssdp_reply`: SSDP discovery, an HTTP-over-UDP
  ``M-SEARCH`` for ``InternetGatewayDevice:1`` and the ``LOCATION`` of the
  device description in its answer;
* `find_control_url`: the ``controlURL`` of the first WANIPConnection or
  WANPPPConnection service in the description XML;
* `encode_soap` / `decode_soap`: an action call and its output arguments,
  or its ``UPnPError`` fault as `MappingError` ``gateway-refused``.

XML from the LAN is untrusted: `parse_xml` caps its size, takes UTF-8 only
(no BOM but UTF-8's, no NUL byte, no other declared encoding: a UTF-16
document once slipped a DTD past a byte-level filter), and parses with
defusedxml, refusing any DTD: without one there are no entity definitions,
so the "billion laughs" and external-entity attacks have nothing to expand.
Namespaces are matched by local name, as gateways are loose about them.

Anti-redirection rule: the description and control URLs must be on the
host that answered the SSDP search, so a device on the LAN cannot make us
send requests elsewhere.

Trio part: `UpnpClient.discover` sends the search (to `ssdp_address`,
multicast by default, configurable for tests) and fetches the description;
then `add_port_mapping`, `delete_port_mapping` and `external_address` are
one SOAP call each, every step under a timeout.
"""

from __future__ import annotations

import codecs
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from urllib.parse import urljoin
from xml.sax.saxutils import escape

import trio
from defusedxml import DefusedXmlException
from defusedxml import ElementTree as defused

from locomesh.node.nat import http_client
from locomesh.node.nat.http_client import Url
from locomesh.node.nat.mapping_errors import MappingError

SSDP_ADDRESS = ("239.255.255.250", 1900)
IGD_DEVICE = "urn:schemas-upnp-org:device:InternetGatewayDevice:1"
WAN_SERVICES = ("urn:schemas-upnp-org:service:WANIPConnection:", "urn:schemas-upnp-org:service:WANPPPConnection:")
MAX_XML = 64 * 1024
MAX_SSDP_REPLY = 2048
SEARCH_WAIT = 2.0
HTTP_TIMEOUT = 5.0
_DECLARED_ENCODING = re.compile(rb"""<\?xml[^>]*?\sencoding\s*=\s*["']([^"']{0,40})["']""")
_SOAP_ENV = "http://schemas.xmlsoap.org/soap/envelope/"


@dataclass(frozen=True)
class Gateway:
    control_url: Url
    service_type: str  # e.g. urn:schemas-upnp-org:service:WANIPConnection:1


# --- SSDP ---------------------------------------------------------------------------------


def encode_msearch(wait: float = SEARCH_WAIT) -> bytes:
    host, port = SSDP_ADDRESS
    return (
        f'M-SEARCH * HTTP/1.1\r\nHOST: {host}:{port}\r\nMAN: "ssdp:discover"\r\n'
        f"MX: {max(1, int(wait))}\r\nST: {IGD_DEVICE}\r\n\r\n"
    ).encode("ascii")


def decode_ssdp_reply(data: bytes, sender_ip: str) -> Url:
    """The description URL in an SSDP answer from `sender_ip`, which must be that URL's host."""
    if len(data) > MAX_SSDP_REPLY:
        raise MappingError("too-large", f"SSDP reply of {len(data)} bytes")
    if b"\r\n\r\n" not in data:  # some devices end the datagram after the last header line
        data = data.rstrip(b"\r\n") + b"\r\n\r\n"
    response = http_client.parse_response(data, eof=True)
    assert response is not None  # eof=True: complete or an error
    if response.status != 200:
        raise MappingError("bad-reply", f"SSDP reply with status {response.status}")
    if "location" not in response.headers:
        raise MappingError("bad-reply", "SSDP reply without LOCATION")
    return _same_host(Url.parse(response.headers["location"]), sender_ip)


def _same_host(url: Url, host: str) -> Url:
    if url.host != host:
        raise MappingError("bad-reply", f"{url} is not on the gateway {host} that answered")
    return url


# --- XML ----------------------------------------------------------------------------------


def parse_xml(data: bytes) -> ElementTree.Element:
    """Parse untrusted XML: at most `MAX_XML` bytes, UTF-8, no DTD (see the module docstring)."""
    if len(data) > MAX_XML:
        raise MappingError("too-large", f"XML of {len(data)} bytes, over {MAX_XML}")
    _check_utf8(data)
    try:
        return defused.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException:
        raise MappingError("bad-reply", "XML with a DTD or entity declaration is refused") from None
    except defused.ParseError as error:
        raise MappingError("bad-reply", f"malformed XML: {error}") from None


def _check_utf8(data: bytes) -> None:
    """`MappingError` unless `data` is UTF-8 throughout and says so, if it says anything."""
    body = data.removeprefix(codecs.BOM_UTF8)
    try:
        body.decode("utf-8")
        utf8 = b"\x00" not in body  # UTF-16 without a BOM is valid UTF-8, NULs and all; XML allows no NUL
    except UnicodeDecodeError:
        utf8 = False
    declared = _DECLARED_ENCODING.match(body)
    if not utf8 or (declared is not None and declared.group(1).lower() != b"utf-8"):
        raise MappingError("bad-reply", "XML that is not UTF-8 is refused")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child_text(element: ElementTree.Element, name: str) -> str:
    for child in element:
        if _local(child.tag) == name:
            return (child.text or "").strip()
    return ""


def find_control_url(description: bytes, location: Url) -> Gateway:
    """The WAN connection service's control URL in a device description fetched from `location`."""
    root = parse_xml(description)
    base = ""
    for element in root.iter():
        if _local(element.tag) == "URLBase":
            base = (element.text or "").strip()
    for element in root.iter():
        if _local(element.tag) != "service":
            continue
        service_type = _child_text(element, "serviceType")
        control = _child_text(element, "controlURL")
        if service_type.startswith(WAN_SERVICES) and control:
            return Gateway(control_url=_resolve(control, base, location), service_type=service_type)
    raise MappingError("bad-reply", "the gateway description has no WANIPConnection or WANPPPConnection service")


def _resolve(control: str, base: str, location: Url) -> Url:
    """`control` resolved against URLBase (or the description's own URL), on the gateway's host only."""
    return _same_host(Url.parse(urljoin(base or str(location), control)), location.host)


# --- SOAP ---------------------------------------------------------------------------------


def encode_soap(service_type: str, action: str, arguments: dict[str, str | int]) -> tuple[dict[str, str], bytes]:
    """The headers and body of a SOAP call of `action` with `arguments` (in this order)."""
    inner = "".join(f"<{name}>{escape(str(value))}</{name}>" for name, value in arguments.items())
    body = (
        '<?xml version="1.0"?>\r\n'
        f'<s:Envelope xmlns:s="{_SOAP_ENV}" s:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/">'
        f'<s:Body><u:{action} xmlns:u="{escape(service_type)}">{inner}</u:{action}></s:Body></s:Envelope>'
    ).encode("utf-8")
    headers = {"Content-Type": 'text/xml; charset="utf-8"', "SOAPAction": f'"{service_type}#{action}"'}
    return headers, body


def decode_soap(status: int, body: bytes, action: str) -> dict[str, str]:
    """The output arguments of `action`'s response, or `MappingError` (a fault: ``gateway-refused``)."""
    root = parse_xml(body)
    if status != 200:
        code, description = "", ""
        for element in root.iter():
            if _local(element.tag) == "UPnPError":
                code, description = _child_text(element, "errorCode"), _child_text(element, "errorDescription")
        detail = f"UPnP error {code} ({description[:80]})" if code else f"HTTP {status} without a UPnP error"
        raise MappingError("gateway-refused", f"{action}: {detail}")
    for element in root.iter():
        if _local(element.tag) == f"{action}Response":
            return {_local(child.tag): (child.text or "").strip() for child in element}
    raise MappingError("bad-reply", f"no {action}Response in the gateway's answer")


# --- trio ---------------------------------------------------------------------------------


class UpnpClient:
    """Talks to the first IGD that answers a search; `discover` must succeed before any action."""

    def __init__(
        self, *, ssdp_address: tuple[str, int] = SSDP_ADDRESS, search_wait: float = SEARCH_WAIT,
        http_timeout: float = HTTP_TIMEOUT,
    ) -> None:
        self.ssdp_address = ssdp_address
        self.search_wait = search_wait
        self.http_timeout = http_timeout
        self.gateway: Gateway | None = None

    async def discover(self) -> Gateway:
        """Search, then fetch and read the description of the first gateway that answers."""
        location = await self._search()
        response = await http_client.request("GET", location, timeout=self.http_timeout, max_body=MAX_XML)
        if response.status != 200:
            raise MappingError("bad-reply", f"{location} answered HTTP {response.status}")
        self.gateway = find_control_url(response.body, location)
        return self.gateway

    async def _search(self) -> Url:
        """The first valid SSDP answer within `search_wait` seconds (invalid ones are skipped)."""
        last_error: MappingError | None = None
        with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
            await sock.bind(("0.0.0.0", 0))
            with trio.move_on_after(self.search_wait):
                try:
                    await sock.sendto(encode_msearch(self.search_wait), self.ssdp_address)
                except OSError as error:
                    raise MappingError("no-gateway", f"cannot send an SSDP search: {error}") from None
                while True:
                    data, sender = await sock.recvfrom(MAX_SSDP_REPLY + 1)
                    try:
                        return decode_ssdp_reply(data, sender[0])
                    except MappingError as error:  # another device's noise must not hide the gateway
                        last_error = error
        if last_error is not None:
            raise last_error
        raise MappingError("timeout", f"no UPnP gateway answered within {self.search_wait} s")

    async def external_address(self) -> str:
        reply = await self._call("GetExternalIPAddress", {})
        return reply.get("NewExternalIPAddress", "")

    async def add_port_mapping(self, *, internal_client: str, port: int, external_port: int, lease: int) -> None:
        await self._call("AddPortMapping", {
            "NewRemoteHost": "",
            "NewExternalPort": external_port,
            "NewProtocol": "TCP",
            "NewInternalPort": port,
            "NewInternalClient": internal_client,
            "NewEnabled": 1,
            "NewPortMappingDescription": "locomesh",
            "NewLeaseDuration": lease,
        })

    async def delete_port_mapping(self, external_port: int) -> None:
        arguments: dict[str, str | int] = {"NewRemoteHost": "", "NewExternalPort": external_port, "NewProtocol": "TCP"}
        await self._call("DeletePortMapping", arguments)

    async def _call(self, action: str, arguments: dict[str, str | int]) -> dict[str, str]:
        if self.gateway is None:
            raise MappingError("no-gateway", "no UPnP gateway discovered")
        headers, body = encode_soap(self.gateway.service_type, action, arguments)
        response = await http_client.request(
            "POST", self.gateway.control_url, headers=headers, body=body, timeout=self.http_timeout, max_body=MAX_XML
        )
        return decode_soap(response.status, response.body, action)
