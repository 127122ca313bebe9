"""The run registry: create runs, list the runs this node knows, find any public run by ID.

A node service (see `locomesh.node.service`) that owns the node's `Discovery`
(the Kademlia DHT, `locomesh.dht`) and its `RunStore` (the data dir's
``runs/``). RPC methods:

    run.create(task, settings={}, public=False, name="", seed=None) -> run summary + {"published"}
        (settings named in training.run_settings.RULES set hyperparameters; the others configure
        the task; both are checked as a joiner checks them, error BAD_RUN naming the setting)
    run.list() -> [run summary]
    run.info(run_id, refresh=False) -> run summary + {"manifest": body, "source": "local" | "dht"}
        (refresh: ask the DHT even for a run this node holds; only another peer's copy counts)
    run.browse(task=None, limit=50) -> {"runs": [listing], "keepers_found", ...}: the directory
        of public runs, found without any run ID (node/runs/directory.py)

A run ID in any method (here and in node/rounds/service.py) is the full one or its start, as `run
list` and `run browse` print it (`resolve`): resolved among the runs the node holds and those its
browses listed (kept in memory, the newest `MAX_LISTED`), and, for ``run.info`` and ``run.join``,
in the directory of public runs, browsed for it. A start of no run found is RUN_NOT_FOUND ("no
such run").

On start it loads the stored runs, starts the DHT, and, once the routing
table holds a peer, republishes every public run it created or joined and
its own peer record. Given the node's replicas, it keeps the cards of the
public runs it is a card keeper of published (node/runs/cards.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from locomesh.crdt import Replica
from locomesh.dht.discovery import Discovery, DiscoveryError
from locomesh.protocol import ProtocolError, public_key_from_peer_id
from locomesh.protocol.kinds import ADMISSIONS
from locomesh.protocol.runs import (
    SHORT_ID_CHARS, format_run_id, parse_run_id, run_id_prefix, short_run_id, sign_manifest,
)

from locomesh.training.run_settings import RULES, RunSettingsError, check_run_settings, default_hparams

from locomesh.node.datadir import CHECKPOINT_DIR
from locomesh.node.datasets.creation import check_local_dataset, store_initial_weights
from locomesh.node.rpc.dispatch import RpcError
from locomesh.node.runs.cards import CardPublisher, Offload
from locomesh.node.runs.directory import MAX_LIMIT, BrowseResult, browse
from locomesh.node.runs.store import KnownRun, RunStore
from locomesh.node.runtime import Node

logger = logging.getLogger(__name__)

# The settings a new run starts from (docs/architecture.md, "Runs"), as `training.run_settings` defines and checks them.
DEFAULT_HPARAMS: dict[str, Any] = default_hparams()
RUN_NOT_FOUND = -32004
BAD_RUN = -32006  # a run whose settings or task `check_run_settings` refuses (run.create, run.join)
MAX_LISTED = 1000  # run IDs remembered from `run browse` (the newest): browse prints short IDs, which must resolve


class RunRegistryService:
    """Serves ``run.*`` RPC methods and keeps this node's runs published. See the module docstring."""

    name = "runs"

    def __init__(self, data_dir: str | os.PathLike, *, replicas: Callable[[], Iterable[Replica]] | None = None,
                 offload: Offload = trio.to_thread.run_sync, clock: Callable[[], float] = time.time) -> None:
        """`replicas()`: the run replicas the node holds (the CRDT service's), for the cards this
        node keeps; None: it publishes no cards. `offload` runs a card's footprint (a thread)."""
        self.store = RunStore(data_dir)
        self.checkpoint_dir = Path(data_dir) / CHECKPOINT_DIR  # where `--init` weights are stored
        self.discovery: Discovery | None = None
        self.cards: CardPublisher | None = None
        self._replicas = replicas
        self._offload = offload
        self._clock = clock  # records' dates: the wall clock (the simulator's virtual one)
        self._node: Node | None = None
        self._listed: dict[bytes, None] = {}  # the runs the directory listed here, oldest first

    async def run(self, node: Node, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._node = node
        self.store.load()
        self.discovery = Discovery(node.host, node.identity, clock=self._clock, rng=node.rng)
        for name, method in (("run.create", self._rpc_create), ("run.list", self._rpc_list),
                             ("run.info", self._rpc_info), ("run.browse", self._rpc_browse)):
            node.rpc.register(name, method)
        if self._replicas is not None:
            self.cards = CardPublisher(self.discovery, self._replicas, offload=self._offload)
        node.add_status_field("runs", lambda: [short_run_id(run.run_id) for run in self.store.runs() if run.origin != "seen"])
        node.add_status_field("dht_routing_table", self.discovery.routing_table_size)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.discovery.run)
            nursery.start_soon(self._publish_after_bootstrap)
            if self.cards is not None:
                nursery.start_soon(self.cards.run)
            task_status.started()

    async def _publish_after_bootstrap(self) -> None:
        assert self.discovery is not None and self._node is not None
        await self.discovery.wait_seeded()
        for run in self.store.runs():
            if run.origin != "seen" and run.envelope.body["public"]:
                await self._publish(run)
        try:
            await self.discovery.publish_peer_record([str(addr) for addr in self._node.host.get_transport_addrs()])
        except DiscoveryError as error:
            logger.info("publishing our peer record failed: %s", error)

    async def _publish(self, run: KnownRun) -> bool:
        assert self.discovery is not None
        try:
            await self.discovery.publish_run(run.manifest)
            return True
        except (DiscoveryError, ProtocolError) as error:
            logger.warning("publishing run %s failed: %s", short_run_id(run.run_id), error)
            return False

    # --- run IDs --------------------------------------------------------------------------

    def known_ids(self) -> list[bytes]:
        """The runs whose short IDs this node resolves: those it holds a manifest of, then those a
        `run browse` here listed (browse prints short IDs; `run join` must take them)."""
        return list(dict.fromkeys([*(run.run_id for run in self.store.runs()), *self._listed]))  # each once

    def knows(self, run_id: bytes) -> bool:
        return self.store.get(run_id) is not None or run_id in self._listed

    async def resolve(self, run_id: Any, *, look_up: bool = False) -> bytes:
        """The run `run_id` names: a full ID (base32 or hex), or a prefix of one this node knows
        (`known_ids`). With `look_up`, a prefix it knows nothing of is looked for in the directory
        of public runs, as `run browse` lists them: a short ID printed by another node's browse
        works here too. `RpcError`: invalid params for text that is no ID (or an ambiguous
        prefix), RUN_NOT_FOUND for a prefix of no run found."""
        if not isinstance(run_id, str):
            raise RpcError.invalid_params("run_id must be a string")
        prefix = run_id_prefix(run_id)
        if prefix is not None and not self._matches(prefix):
            # Only a start as long as browse prints (80 bits) is looked for among the directory's
            # runs: hostile peers can list runs, and a shorter start is cheap to grind a clash for.
            looked_up = look_up and len(prefix) >= SHORT_ID_CHARS
            if looked_up:
                await self._browse_directory()
            if not self._matches(prefix):
                raise RpcError(RUN_NOT_FOUND, _no_run_starts_with(prefix, looked_up=looked_up))
        try:
            return parse_run_id(run_id, self.known_ids())
        except ProtocolError as error:
            raise RpcError.invalid_params(error.reason) from None

    def _matches(self, prefix: str) -> bool:
        return any(format_run_id(run).startswith(prefix) for run in self.known_ids())

    async def _browse_directory(self) -> None:
        """List the directory's public runs, so that their short IDs resolve."""
        assert self.discovery is not None
        self._remember_listed(await browse(self.discovery, limit=MAX_LIMIT))

    def _remember_listed(self, result: BrowseResult) -> None:
        for listing in result.listings:
            self._listed.pop(listing.run_id, None)  # to the end: the newest are kept
            self._listed[listing.run_id] = None
        while len(self._listed) > MAX_LISTED:
            del self._listed[next(iter(self._listed))]

    async def find(self, run_id: bytes, *, refresh: bool = False) -> tuple[KnownRun, str]:
        """The run `run_id` and where its manifest came from: "local" if this node holds it, else
        "dht" (then kept as "seen"); with `refresh`, only another peer's copy in the DHT counts.
        `RpcError` RUN_NOT_FOUND if nobody has it, -32000 if the lookup failed."""
        run = None if refresh else self.store.get(run_id)
        if run is not None:
            return run, "local"
        assert self.discovery is not None
        try:
            found = await self.discovery.find_run(run_id, local=not refresh)
        except DiscoveryError as error:
            raise RpcError(-32000, f"run lookup failed: {error}") from None
        if found is None:
            raise RpcError(RUN_NOT_FOUND, f"no public run {format_run_id(run_id)} found in the DHT (only a run "
                                          "created with --public is published; a private one is found through its members)")
        return await self._offload(self.store.add, found[0], "seen"), "dht"  # an fsync'd write

    # --- RPC ------------------------------------------------------------------------------

    async def _rpc_create(
        self, task: str, settings: dict | None = None, public: bool = False, name: str = "", seed: int | None = None,
        init: str | None = None, admission: str = "open", admitted: list[str] | None = None,
    ) -> dict[str, Any]:
        """`init`: the path of the weights file or checkpoint directory the run starts from
        (node/datasets/creation.py). `admission`: who may join ("open", "creator", "electorate":
        crdt/membership.py); `admitted`: peer IDs with a say from their join (the creator's team)."""
        assert self._node is not None
        if not isinstance(public, bool):
            raise RpcError.invalid_params("public must be true or false")
        if admission not in ADMISSIONS:
            raise RpcError.invalid_params(f"admission is one of {', '.join(ADMISSIONS)}, not {str(admission)[:32]!r}")
        admitted_keys = _keys_of(admitted or [])
        if init is not None and not isinstance(init, str):
            raise RpcError.invalid_params("init must be a path")
        if seed is None:
            seed = self._node.rng.randrange(2**63)
        hparams, task_config = split_settings(_settings(settings))
        try:  # the check every joiner makes: a run nobody could train is never signed
            if init is not None:
                task_config = await trio.to_thread.run_sync(
                    store_initial_weights, self.checkpoint_dir, init, task, task_config)
            _checked, built = await trio.to_thread.run_sync(check_run_settings, task, task_config, hparams)
            await trio.to_thread.run_sync(check_local_dataset, self.checkpoint_dir, built)
        except (RunSettingsError, ProtocolError) as error:  # a stored index or checkpoint that is damaged, too
            raise RpcError(BAD_RUN, f"bad run settings: {error}") from None
        except OSError as error:
            raise RpcError(BAD_RUN, f"bad run settings: {init}: {error.strerror}") from None
        try:
            manifest = sign_manifest(
                self._node.identity,
                task=task,
                name=name,
                task_config=task_config,
                seed=seed,
                hparams=hparams,
                public=public,
                created=int(time.time()),
                admission=admission,
                admitted=admitted_keys,
            )
        except (ProtocolError, TypeError, ValueError) as error:
            raise RpcError.invalid_params(error.reason) from None
        run = self.store.add(manifest, "created")
        published = await self._publish(run) if public else False
        return {**summary(run), "published": published}

    async def _rpc_list(self) -> list[dict[str, Any]]:
        return [summary(run) for run in self.store.runs()]

    async def _rpc_info(self, run_id: str, refresh: bool = False) -> dict[str, Any]:
        """A run's manifest: ours if we know the run, else from the DHT; `refresh` asks the DHT
        whatever we hold, and takes only another peer's copy."""
        assert self.discovery is not None
        if not isinstance(refresh, bool):
            raise RpcError.invalid_params("refresh must be true or false")
        run, source = await self.find(await self.resolve(run_id, look_up=True), refresh=refresh)
        return {**summary(run), "source": source, "manifest": _jsonable(run.envelope.body)}

    async def _rpc_browse(self, task: str | None = None, limit: int = 50) -> dict[str, Any]:
        """The directory of public runs (node/runs/directory.py), of `task` if given."""
        assert self.discovery is not None
        if task is not None and (not isinstance(task, str) or not 0 < len(task) <= 128):
            raise RpcError.invalid_params("task must be a task name")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_LIMIT:
            raise RpcError.invalid_params(f"limit must be an integer from 1 to {MAX_LIMIT}")
        result = await browse(self.discovery, task=task, limit=limit)
        self._remember_listed(result)
        return result.as_json()


def _keys_of(peer_ids: Any) -> list[bytes]:
    """The public keys of a list of peer IDs; `RpcError` for anything else."""
    if not isinstance(peer_ids, list) or len(peer_ids) > 1024:
        raise RpcError.invalid_params("admitted must be a list of at most 1024 peer IDs")
    try:
        return [public_key_from_peer_id(peer) for peer in peer_ids]
    except (ProtocolError, TypeError, ValueError):
        raise RpcError.invalid_params("admitted must list peer IDs (as `locomesh status` prints them)") from None


def summary(run: KnownRun) -> dict[str, Any]:
    """What `run list` shows of a run (JSON-ready)."""
    body = run.envelope.body
    return {
        "run_id": format_run_id(run.run_id),
        "short_id": short_run_id(run.run_id),
        "name": body["name"],
        "task": body["task"],
        "public": body["public"],
        "created": body["created"],
        "creator": run.envelope.author_peer_id,
        "origin": run.origin,
    }


def _no_run_starts_with(prefix: str, *, looked_up: bool) -> str:
    where = "this node knows or the directory of public runs lists" if looked_up else "this node knows"
    return (f"no such run: no run {where} starts with {prefix!r} (`locomesh run list` shows the runs this node "
            "knows, `locomesh run browse` the public ones; a private run's full ID comes from its creator)")


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hyperparameters, task config): run settings (`RULES`) override the defaults, the rest configure the task."""
    hparams = {**DEFAULT_HPARAMS, **{key: value for key, value in settings.items() if key in RULES}}
    return hparams, {key: value for key, value in settings.items() if key not in RULES}


def _settings(settings: Any) -> dict[str, Any]:
    if settings is None:
        return {}
    if not isinstance(settings, dict) or not all(isinstance(key, str) for key in settings):
        raise RpcError.invalid_params("settings must be an object of key: value")
    return dict(settings)


def _jsonable(value: Any) -> Any:
    """Manifest bodies hold bytes (public keys): JSON gets them as hex."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value
