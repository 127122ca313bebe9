"""Port mapping on the home gateway (NAT-PMP, then UPnP IGD): best effort, for private nodes.

Theory of operation
-------------------
The service watches the reachability verdict (`locomesh.node.nat.reachability`)
every `check_interval` seconds and acts by this table::

    state       event                                   next        action
    off         (config port_mapping = "off")           off         nothing, ever
    waiting     verdict private                         mapping     ask the gateway
    waiting     verdict public                          not-needed
    not-needed  verdict private                         mapping     ask the gateway
    mapping     NAT-PMP or UPnP grants a mapping        mapped      hold it; ask for a reachability probe now
    mapping     both fail                               failed      retry after `retry_interval`
    failed      retry time and verdict not public       mapping
    mapped      half the lease gone                     mapped      renew (same protocol and external port)
    mapped      renewal fails                           failed      drop the mapping
    mapped      shutdown                                (end)       delete it, bounded by SHUTDOWN_GRACE

While mapped, the external address is offered to the reachability check as
one of ours (`candidate_addrs`), which probes at once (`on_mapped`: a private
node otherwise probes only every ten minutes); only once a dial-back proves it
(`confirmed` lists it) is it *advertised* (`advertised_addrs`, put in our
DHT peer record by the relay service). A gateway that maps the port but
does not forward it therefore never makes us claim an address that does
not work. Gateways are LAN devices, so everything they answer goes through
the strict parsers of `natpmp` / `upnp` and a bad answer is a typed
`MappingError`: logged, shown in the status, never fatal.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from locomesh.node.service import SHUTDOWN_GRACE

from locomesh.node.addresses import tcp_address, tcp_endpoint
from locomesh.node.nat.mapping_errors import MappingError
from locomesh.node.nat.natpmp import NatPmpClient
from locomesh.node.nat.reachability import PRIVATE, PUBLIC
from locomesh.node.nat.upnp import SSDP_ADDRESS, UpnpClient

if TYPE_CHECKING:
    from locomesh.node.runtime import Node

logger = logging.getLogger(__name__)

LEASE = 3600
CHECK_INTERVAL = 5.0
RETRY_INTERVAL = 600.0
NATPMP, UPNP = "nat-pmp", "upnp"
UPNP_ONLY_PERMANENT = "UPnP error 725"  # OnlyPermanentLeasesSupported
ROUTE_TABLE = "/proc/net/route"


@dataclass
class Mapping:
    protocol: str  # NATPMP or UPNP
    external_ip: str
    external_port: int
    internal_port: int
    lease: int  # seconds granted (UPnP: as asked; 0 there means "until deleted")
    granted_at: float  # trio clock

    @property
    def address(self) -> str:
        return tcp_address(self.external_ip, self.external_port)

    def renew_at(self) -> float:
        return self.granted_at + (self.lease / 2 if self.lease else RETRY_INTERVAL)


class GatewayClients:
    """NAT-PMP and UPnP clients for one gateway; `obtain` tries them in that order."""

    def __init__(
        self, gateway: str | None, *, natpmp_port: int = 5351, ssdp_address: tuple[str, int] = SSDP_ADDRESS,
        natpmp_tries: int = 4, search_wait: float = 2.0,
    ) -> None:
        self.natpmp = NatPmpClient(gateway, port=natpmp_port, tries=natpmp_tries) if gateway else None
        self.upnp = UpnpClient(ssdp_address=ssdp_address, search_wait=search_wait)

    async def obtain(self, internal_port: int, external_port: int, lease: int) -> Mapping:
        """A mapping from whichever protocol grants one; `MappingError` naming both failures otherwise."""
        errors = []
        for protocol, attempt in ((NATPMP, self._natpmp), (UPNP, self._upnp)):
            try:
                return await attempt(internal_port, external_port, lease)
            except MappingError as error:
                logger.info("port mapping by %s failed: %s", protocol, error)
                errors.append(f"{protocol}: {error}")
        raise MappingError("no-mapping", "; ".join(errors))

    async def renew(self, held: Mapping, lease: int) -> Mapping:
        """The same mapping again, by the protocol that granted it (same external port)."""
        attempt = self._natpmp if held.protocol == NATPMP else self._upnp
        return await attempt(held.internal_port, held.external_port, lease)

    async def _natpmp(self, internal_port: int, external_port: int, lease: int) -> Mapping:
        if self.natpmp is None:
            raise MappingError("no-gateway", "no default gateway known")
        external_ip = await self.natpmp.external_address()
        granted = await self.natpmp.map_tcp(internal_port, external_port, lease)
        if granted.lifetime == 0:
            raise MappingError("bad-reply", "NAT-PMP granted a mapping of lifetime 0")
        return Mapping(NATPMP, external_ip, granted.external_port, internal_port, granted.lifetime, trio.current_time())

    async def _upnp(self, internal_port: int, external_port: int, lease: int) -> Mapping:
        gateway = self.upnp.gateway or await self.upnp.discover()
        internal_client = _local_ip_towards(gateway.control_url.host)
        try:
            try:
                await self.upnp.add_port_mapping(
                    internal_client=internal_client, port=internal_port, external_port=external_port, lease=lease
                )
            except MappingError as error:
                if UPNP_ONLY_PERMANENT not in error.reason:
                    raise
                lease = 0  # an IGD:1 router that takes only permanent mappings; we still delete it at shutdown
                await self.upnp.add_port_mapping(
                    internal_client=internal_client, port=internal_port, external_port=external_port, lease=lease
                )
            external_ip = _checked_ipv4(await self.upnp.external_address())
        except MappingError as error:
            if error.code in ("no-gateway", "timeout"):
                self.upnp.gateway = None  # it moved or went away: search again next time
            raise
        return Mapping(UPNP, external_ip, external_port, internal_port, lease, trio.current_time())

    async def release(self, mapping: Mapping) -> None:
        if mapping.protocol == NATPMP and self.natpmp is not None:
            await self.natpmp.unmap_tcp(mapping.internal_port)
        elif mapping.protocol == UPNP:
            await self.upnp.delete_port_mapping(mapping.external_port)


class PortMappingService:
    """Maps our TCP listen port on the gateway while we are private; status field ``port_mapping``."""

    name = "portmap"

    def __init__(
        self,
        reachability: Callable[[], str],
        confirmed: Callable[[], list[str]],
        *,
        enabled: bool = True,
        clients: GatewayClients | None = None,
        lease: int = LEASE,
        check_interval: float = CHECK_INTERVAL,
        retry_interval: float = RETRY_INTERVAL,
        on_mapped: Callable[[], None] = lambda: None,
    ) -> None:
        self._reachability = reachability
        self._confirmed = confirmed
        self.enabled = enabled
        self._clients = clients
        self.lease = lease
        self.check_interval = check_interval
        self.retry_interval = retry_interval
        self._on_mapped = on_mapped  # the reachability check's "probe soon": test the new address now
        self.state = "waiting" if enabled else "off"
        self.reason = "" if enabled else "turned off (port_mapping = off)"
        self.mapping: Mapping | None = None
        self._node: Node | None = None

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        node.add_status_field("port_mapping", self.status)
        task_status.started()
        if not self.enabled:
            return
        if self._clients is None:
            self._clients = GatewayClients(default_gateway())
        try:
            await self._keep_mapped()
        finally:
            await self._release()

    async def _keep_mapped(self) -> None:
        retry_at = -float("inf")
        while True:
            verdict = self._reachability()
            if self.mapping is not None and trio.current_time() >= self.mapping.renew_at():
                await self._renew()
            elif self.mapping is None and verdict == PUBLIC:
                self.state, self.reason = "not-needed", "reachable without a mapping"
            elif self.mapping is None and verdict == PRIVATE and trio.current_time() >= retry_at:
                if not await self._map():
                    retry_at = trio.current_time() + self.retry_interval
            await trio.sleep(self.check_interval)

    async def _map(self) -> bool:
        port = self._listen_port()
        if port is None:
            self.state, self.reason = "failed", "no TCP listen address to map"
            return False
        self.state, self.reason = "mapping", ""
        try:
            self.mapping = await self._require_clients().obtain(port, port, self.lease)
        except MappingError as error:
            self.state, self.reason = "failed", error.reason
            return False
        self.state = "mapped"
        self._on_mapped()
        logger.info("gateway mapped %s -> port %d by %s", self.mapping.address, port, self.mapping.protocol)
        return True

    async def _renew(self) -> None:
        held = self.mapping
        assert held is not None
        try:
            self.mapping = await self._require_clients().renew(held, self.lease)
        except MappingError as error:
            self.mapping, self.state, self.reason = None, "failed", f"renewal failed: {error.reason}"
            logger.info("port mapping renewal failed: %s", error)

    async def _release(self) -> None:
        mapping, self.mapping = self.mapping, None
        if mapping is None or self._clients is None:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_GRACE):
            try:
                await self._clients.release(mapping)
                logger.info("removed the port mapping %s", mapping.address)
            except MappingError as error:
                logger.info("removing the port mapping %s failed: %s", mapping.address, error)

    # --- what others read -------------------------------------------------------------------

    def candidate_addrs(self) -> list[str]:
        """The mapped external address, for the reachability check to try."""
        return [self.mapping.address] if self.mapping is not None else []

    def advertised_addrs(self) -> list[str]:
        """The mapped external address once a dial-back has proved it works."""
        proved = {tcp_endpoint(address) for address in self._confirmed()}
        return [address for address in self.candidate_addrs() if tcp_endpoint(address) in proved]

    def status(self) -> dict[str, Any]:
        """The ``port_mapping`` status field."""
        status: dict[str, Any] = {"state": self.state, "reason": self.reason}
        if self.mapping is not None:
            status.update(
                protocol=self.mapping.protocol,
                external_addr=self.mapping.address,
                lease_s=self.mapping.lease,
                renew_in_s=round(max(0.0, self.mapping.renew_at() - trio.current_time()), 1),
                confirmed=bool(self.advertised_addrs()),
            )
        return status

    def _listen_port(self) -> int | None:
        node = self._node
        assert node is not None, "the service is not running"
        for address in node.host.get_transport_addrs():
            endpoint = tcp_endpoint(str(address).split("/p2p/")[0])
            if endpoint is not None and ":" not in endpoint[0]:
                return endpoint[1]
        return None

    def _require_clients(self) -> GatewayClients:
        assert self._clients is not None, "the service is not running"
        return self._clients


def default_gateway(route_table: str = ROUTE_TABLE) -> str | None:
    """The IPv4 default gateway from Linux's routing table; None elsewhere or when there is none."""
    try:
        with open(route_table, encoding="ascii") as table:
            lines = table.read(64 * 1024).splitlines()[1:]
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "00000000" and int(fields[3], 16) & 0x2:  # RTF_GATEWAY
            try:
                return socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little"))
            except (ValueError, OverflowError):
                continue
    return None


def _checked_ipv4(text: str) -> str:
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        raise MappingError("bad-reply", f"UPnP gateway reports external address {text[:60]!r}") from None
    if address.is_unspecified:
        raise MappingError("no-external-address", "the UPnP gateway has no external address yet")
    return str(address)


def _local_ip_towards(host: str) -> str:
    """Our address on the route to `host` (what a UPnP gateway must forward to); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return probe.getsockname()[0]
        except OSError as error:
            raise MappingError("no-gateway", f"no route to the gateway {host}: {error}") from None
