"""`locomesh node start`: the node, its data dir, its local RPC, and its signals, in one process.

Start-up, in order: refuse a training device this machine does not have
(`missing_device`: the user named it, so a start that cannot train there says
so in one line and exits 2, not at the first join); take the data dir's lock; check that nothing listens on
our addresses yet (`locomesh.node.host.addresses_in_use`); delete the
temporaries that writes cut short by a crash left (`locomesh.node.files`);
load (or create, once) the identity; build the node with its services;
listen; start the RPC server on 127.0.0.1; write a fresh cookie and
``rpc.json``. From that moment clients can find and drive the daemon (see
`locomesh.node.datadir`).

Shut-down starts on SIGINT, SIGTERM or the ``node.shutdown`` RPC: the RPC
server stops taking connections and answers what it was serving, the
services are cancelled (each persists what it must, bounded by
`locomesh.node.service.SHUTDOWN_GRACE`), connections and listeners are
closed, ``rpc.json`` and the cookie are removed, and the process exits 0.
A second signal exits at once (status 128 + signal number); a shutdown
that takes longer than `SHUTDOWN_TIMEOUT` seconds is cut short (status 1).

A full disk met by the daemon's own writes (the lock, the key, the cookie,
rpc.json, listen.port) or by any write whose error reaches the daemon ends it
with one line that names the file ("no space left on device: PATH; free some space or use
--data-dir DIR on another disk"): a `DataDirError` (`datadir.cannot_write`),
never a traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio
from multiaddr import Multiaddr

from locomesh.protocol import Identity
from locomesh.node.files import remove_stray_temporaries

from locomesh.node.assembly import node_services
from locomesh.node.config import NodeConfig
from locomesh.node.dashboard import Dashboard
from locomesh.node.datadir import DISK_FULL, DataDir, RpcInfo, cannot_write, load_or_create_identity
from locomesh.node.host import addresses_in_use
from locomesh.node.logs import join_libp2p_logging
from locomesh.node.ping import PingService
from locomesh.node.rpc.dispatch import RpcDispatcher
from locomesh.node.rpc.server import RpcServer
from locomesh.node.service import DRAIN_SECONDS
from locomesh.node.runtime import AddressInUse, Node
from locomesh.node.service import Service
from locomesh.node.streams import sole_exception

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = DRAIN_SECONDS + 10.0  # a run's graceful leave, then what the services persist
EXIT_NO_DEVICE = 2  # as a bad configuration (`cli.client.EXIT_USAGE`): the user's --device to change
_SIGNALS = (signal.SIGINT, signal.SIGTERM)

ServiceFactory = Callable[[NodeConfig], Sequence[Service]]


def default_services(config: NodeConfig) -> list[Service]:
    """The services every daemon runs, in start order (`locomesh.node.assembly`, nothing injected)."""
    return node_services(config).in_start_order()


def run_daemon(config: NodeConfig, *, services: ServiceFactory = default_services) -> int:
    """Run a daemon in the foreground until it is told to stop; return the exit status.

    Returns `EXIT_NO_DEVICE`, having said why in one line, if this machine lacks
    the training devices of `config`. Raises `DataDirError` or `IdentityError`
    before anything starts if the data dir is taken or its key unusable,
    `DataDirError` whenever a write meets a full disk, `AddressInUse` (a
    `ListenError`) if something listens on one of our addresses already, and
    `ListenError` if an address cannot be listened on for another reason.
    """
    join_libp2p_logging()  # libp2p is imported by now (this module imports it)
    missing = missing_device(config.device, config.local_workers)
    if missing:
        # One line on stderr, as `cli.common.fail` prints the start's other refusals (node/ does not import the CLI).
        print(f"locomesh: device: {missing}; start the node with --device auto or cpu, or the device this machine "
              "has", file=sys.stderr)
        return EXIT_NO_DEVICE
    datadir = DataDir(config.data_dir)
    datadir.lock()
    try:
        listen = _with_last_port(config.listen, datadir.last_listen_port())
        busy = addresses_in_use(listen)
        if busy:
            raise AddressInUse(f"address in use: {', '.join(str(address) for address in busy)}")
        _remove_stray_temporaries(datadir)
        identity = load_or_create_identity(datadir.identity_path)
        try:
            trio.run(_serve, config, listen, datadir, identity, services)
        except (BaseExceptionGroup, OSError) as error:
            raise _disk_full_as_data_dir_error(sole_exception(error), datadir) from None
        logger.info("stopped cleanly")
        return 0
    finally:
        datadir.remove_rpc_files()
        datadir.unlock()


def missing_device(spec: str, local_workers: int) -> str | None:
    """Why this machine cannot give the training devices `spec` and `local_workers` ask for, or
    None. "cpu", and "auto" with one worker per GPU, are always there: those skip loading torch
    (a second or two of start-up)."""
    if spec == "cpu" or (spec == "auto" and not local_workers):
        return None
    from locomesh.training.devices import DeviceError, local_devices

    try:
        local_devices(spec, local_workers)
    except DeviceError as error:
        return str(error)
    return None


def _disk_full_as_data_dir_error(error: BaseException, datadir: DataDir) -> BaseException:
    """`error` as the one line of a full disk (`cannot_write`) if a full disk is what it is, found
    in a group too (a service's write that failed), else `error` itself."""
    full = _disk_full(error)
    if full is None:
        return error
    logger.debug("a write met a full disk", exc_info=full)  # where, for --log-level debug
    return cannot_write(full.filename or datadir.path, full)


def _disk_full(error: BaseException) -> OSError | None:
    if isinstance(error, BaseExceptionGroup):
        return next((found for inner in error.exceptions if (found := _disk_full(inner)) is not None), None)
    return error if isinstance(error, OSError) and error.errno in DISK_FULL else None


def _with_last_port(listen: Sequence[str], last_port: int | None) -> list[Multiaddr]:
    """`listen`, where a TCP address asks for any port (0), the port this data dir listened on last, if it
    is free now: peers' records of us, and a port forward a user made, stay right across restarts."""
    addresses = [Multiaddr(address) for address in listen]
    if last_port is None:
        return addresses
    kept = []
    for address in addresses:
        text = str(address)
        if text.endswith("/tcp/0"):
            candidate = Multiaddr(text[: -len("0")] + str(last_port))
            address = address if addresses_in_use([candidate]) else candidate
        kept.append(address)
    return kept


def _remember_listen_port(node: Node, datadir: DataDir) -> None:
    """Write the TCP port we listen on, for the next start (`_with_last_port`)."""
    for address in node.host.get_transport_addrs():
        try:
            port = int(address.value_for_protocol("tcp"))
        except Exception:  # noqa: BLE001 - a non-TCP address has no port to keep
            continue
        if port:
            datadir.write_listen_port(port)
            return


def _ping_service(services: Sequence[Service]) -> PingService | None:
    """The node's ping service among `services` (what the dashboard measures round trips with), if any."""
    return next((service for service in services if isinstance(service, PingService)), None)


def _remove_stray_temporaries(datadir: DataDir) -> None:
    """Delete what writes cut short by a crash left (we hold the lock: nobody else writes here)."""
    removed = remove_stray_temporaries(datadir.path, older_than=time.time())
    if removed:
        logger.info("removed %d temporary files left by an earlier daemon that stopped mid-write", removed)


async def _serve(
    config: NodeConfig, listen: list[Multiaddr], datadir: DataDir, identity: Identity, services: ServiceFactory
) -> None:
    built = services(config)
    node = Node.create(
        identity,
        listen_addrs=listen,
        services=built,
        bootstrap=[Multiaddr(address) for address in config.bootstrap],
    )
    register_node_methods(node)
    requests = node.metrics.counter("locomesh_rpc_requests_total", "JSON-RPC calls, by method.", labels=("method",))
    rejected = node.metrics.counter(
        "locomesh_rpc_rejected_total", "RPC requests refused, by reason.", labels=("reason",)
    )
    count_call = lambda method: requests.inc(method=method)  # noqa: E731
    reject = lambda reason: rejected.inc(reason=reason)  # noqa: E731
    server = RpcServer(
        RpcDispatcher(node.rpc, on_call=count_call),
        cookie=datadir.new_cookie(),
        metrics=node.metrics,
        on_reject=reject,
        site=Dashboard(node, ping=_ping_service(built), on_call=count_call, on_reject=reject),
    )
    async with trio.open_nursery() as guards:
        guards.start_soon(_watch_signals, node)
        guards.start_soon(_shutdown_watchdog, node)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run)
                _remember_listen_port(node, datadir)
                port = await nursery.start(server.run, config.rpc_port)
                datadir.write_rpc_info(RpcInfo(port=port, pid=os.getpid(), peer_id=node.peer_id))
                logger.info("ready: peer %s, RPC and dashboard on 127.0.0.1:%d, data dir %s", node.peer_id, port, config.data_dir)
                await node.wait_stop_requested()
                logger.info("shutting down")
                server.stop()
        finally:
            guards.cancel_scope.cancel()


def register_node_methods(node: Node) -> None:
    """The ``node.*`` RPC methods (``node.ping`` comes with the ping service)."""

    async def status() -> dict[str, Any]:
        return node.status()

    async def peers() -> list[dict[str, Any]]:
        return node.peer_list()

    async def shutdown() -> dict[str, Any]:
        node.request_stop()
        return {"stopping": True}

    async def debug() -> dict[str, Any]:
        return process_facts()

    async def methods() -> list[str]:
        return node.rpc.names()

    for name, function in {
        "node.status": status,
        "node.peers": peers,
        "node.shutdown": shutdown,
        "node.debug": debug,
        "node.methods": methods,
    }.items():
        node.rpc.register(name, function)


def process_facts() -> dict[str, Any]:
    """Facts about this process that tests and benchmarks check (torch must not be loaded at start)."""
    return {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "rss_bytes": _rss_bytes(),
        "modules_loaded": len(sys.modules),
        "torch_imported": "torch" in sys.modules,
    }


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


async def _watch_signals(node: Node) -> None:
    with trio.open_signal_receiver(*_SIGNALS) as signals:
        async for signum in signals:
            if node.stopping:
                logger.warning("second %s: exiting at once", signal.Signals(signum).name)
                os._exit(128 + signum)
            logger.info("%s received", signal.Signals(signum).name)
            node.request_stop()


async def _shutdown_watchdog(node: Node) -> None:
    await node.wait_stop_requested()
    await trio.sleep(SHUTDOWN_TIMEOUT)
    logger.error("shutdown took over %g s; exiting anyway", SHUTDOWN_TIMEOUT)
    os._exit(1)
