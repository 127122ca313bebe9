"""The import floors of docs/architecture.md, read from the source with `ast` (nothing is imported).

Layout: dependencies point one way, `protocol` <- `crdt`, `dht`, `training` <- `node` <- `netsim` <-
`cli`; `training` never imports libp2p; `crdt` and `protocol` never do I/O (no I/O module is
imported there); test and simulation plumbing (tests/, bench/) stays out of the production
packages, and so do bare imports of the folders (`import node`: only `locomesh.node` installs).

Node: node/ has floors. Its core (the modules at node/'s top level named in CORE) imports no
feature (the rooms in FEATURES) and nothing of the process (PROCESS); features and the process
may import the core. Every name at node/'s top level is on one floor, so a new module or room
has to be placed.

Every import counts: inside functions, under `if TYPE_CHECKING:`, and
`importlib.import_module("locomesh...")` with a constant name. What the code already breaks is
in KNOWN_VIOLATIONS; the test fails on any new violation and on an allow-listed one that is gone
(take it off the list, so the list only shrinks).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent

# Each production package -> the packages of the repository it may import (itself aside).
LAYERS: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "crdt": frozenset({"protocol"}),
    "dht": frozenset({"protocol"}),
    "training": frozenset({"protocol"}),
    "node": frozenset({"protocol", "crdt", "dht", "training"}),
    "netsim": frozenset({"protocol", "crdt", "dht", "training", "node"}),
    "cli": frozenset({"protocol", "crdt", "dht", "training", "node", "netsim"}),
}
NOT_PRODUCTION = frozenset({"tests", "bench"})  # the suite and the benchmarks: never imported by a package
IO_MODULES = frozenset({
    "trio", "anyio", "asyncio", "libp2p", "multiaddr", "socket", "ssl", "select", "selectors",
    "subprocess", "os", "pathlib", "shutil", "tempfile", "mmap", "fcntl", "urllib", "http",
    "httpx", "requests", "sqlite3",
})
THIRD_PARTY_BANS: dict[str, frozenset[str]] = {
    "training": frozenset({"libp2p", "multiaddr"}),  # training never imports libp2p
    "protocol": IO_MODULES,  # crdt and protocol never do I/O
    "crdt": IO_MODULES,
}

# node/'s floors, by name at node/'s top level ("__init__" is the package itself, kept light).
CORE = frozenset({
    "__init__", "runtime", "host", "service", "streams", "peers", "meter", "bandwidth",
    "rate_limit", "whole_writes", "metrics", "peer_scores", "bootstrap", "ping", "listen_port", "connections",
    "addresses",
    "dial_addrs",  # the addresses others can dial, for node.status (the runtime's)
    "stream_pool",  # idle streams kept per peer for reuse: the runtime closes them before its connections
    "rpc",  # the local RPC plumbing every service registers with (docs/architecture.md: the core's)
})
FEATURES = frozenset({
    "agreement", "exchange", "rounds", "transfer", "nat", "replication", "runs", "dashboard",
    "datasets", "doctor", "schedule",
})
# Rooms with a tighter rule than the floors': what each may import of the repository (itself aside).
ROOMS: dict[str, frozenset[str]] = {
    # the agreement is sans-IO: the run's CRDT and the wire formats, nothing of the node (#45, item 8)
    "locomesh.node.agreement": frozenset({"locomesh.crdt", "locomesh.protocol"}),
}
# (room, room it must not import): rounds/ drives the exchange, never the other way.
NOT_BACK: frozenset[tuple[str, str]] = frozenset({("locomesh.node.exchange", "locomesh.node.rounds")})
PROCESS = frozenset({"daemon", "assembly", "config", "datadir", "logs", "files"})

# (importing module, imported module) pairs the code has today that break a floor: to be moved
# (#38). Take a pair off when its import goes; add none.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TOP).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["locomesh", *parts])


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the production packages, by its installed dotted name."""
    return {
        _module_name(path): path
        for package in LAYERS for path in sorted((TOP / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _resolve(name: str) -> str:
    """A `locomesh` name as the longest module of the repository it names (`from x import f` names
    x.f, which is a module or else something of x's)."""
    modules = _modules()
    parts = name.split(".")
    while len(parts) > 2 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def _imported_names(module: str, path: Path) -> set[str]:
    """The absolute dotted names `module` imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.update(f"{prefix}.{alias.name}" if alias.name != "*" else prefix for alias in node.names)
        elif isinstance(node, ast.Call) and _calls_import_module(node):
            names.update(
                arg.value for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("locomesh.")
            )
    return names


def _calls_import_module(call: ast.Call) -> bool:
    """`import_module(...)`, or a call handed `import_module` (as trio.to_thread.run_sync is)."""
    def is_it(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "import_module") or (
            isinstance(node, ast.Attribute) and node.attr == "import_module"
        )
    return is_it(call.func) or any(is_it(arg) for arg in call.args)


@functools.cache
def _imports() -> dict[str, frozenset[str]]:
    """Each module -> what it imports: `locomesh` modules resolved, other names as written."""
    graph = {}
    for module, path in _modules().items():
        names = _imported_names(module, path)
        graph[module] = frozenset(
            _resolve(name) if name.split(".")[0] == "locomesh" and name.count(".") >= 1 else name
            for name in names if name
        )
    return graph


def _node_floor(module: str) -> str | None:
    """The name at node/'s top level that `module` belongs to, or None outside node/."""
    parts = module.split(".")
    if parts[:2] != ["locomesh", "node"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def _violations() -> dict[tuple[str, str], str]:
    """(importer, imported) -> the rule it breaks."""
    found: dict[tuple[str, str], str] = {}
    for module, imported in _imports().items():
        package = module.split(".")[1]
        for name in imported:
            parts = name.split(".")
            if parts[0] == "locomesh" and len(parts) > 1:
                target = parts[1]
                if target != package and target not in LAYERS[package]:
                    found[(module, name)] = f"{package} may import only {sorted(LAYERS[package])}"
                floor, target_floor = _node_floor(module), _node_floor(name)
                if floor in CORE and target_floor in FEATURES | PROCESS:
                    found[(module, name)] = "node's core imports no feature and nothing of the process"
            elif parts[0] in LAYERS:
                found[(module, name)] = f"a bare `{parts[0]}` is not installed: say locomesh.{parts[0]}"
            elif parts[0] in NOT_PRODUCTION:
                found[(module, name)] = "test and benchmark plumbing stays out of the packages"
            elif parts[0] in THIRD_PARTY_BANS.get(package, ()):
                found[(module, name)] = f"{package} must not import {parts[0]} (docs/architecture.md, Layers and imports)"
            found.update(_room_violations(module, name))
    return found


def _room_violations(module: str, name: str) -> dict[tuple[str, str], str]:
    found = {}
    for room, allowed in ROOMS.items():
        inside = module == room or module.startswith(room + ".")
        if inside and name.startswith("locomesh.") and not name.startswith(room) and not any(
                name == other or name.startswith(other + ".") for other in allowed):
            found[(module, name)] = f"{room} may import only {sorted(allowed)} of the repository"
        elif inside and name.split(".")[0] in IO_MODULES:
            found[(module, name)] = f"{room} is sans-IO: it must not import {name.split('.')[0]}"
    for room, other in NOT_BACK:
        if (module == room or module.startswith(room + ".")) and (name == other or name.startswith(other + ".")):
            found[(module, name)] = f"{room} must not import {other} (it drives {room}, not the other way)"
    return found


def test_the_scan_sees_the_code() -> None:
    """The scanner finds the modules and resolves imports (a broken one would pass everything)."""
    graph = _imports()
    assert len(graph) > 100
    assert "locomesh.node.streams" in graph["locomesh.node.runtime"]
    assert "locomesh.protocol" in graph["locomesh.crdt.ops"] or any(
        name.startswith("locomesh.protocol") for name in graph["locomesh.crdt.ops"]
    )
    assert "locomesh.training.participant" in graph["locomesh.node.rounds.service"]  # import_module
    assert "trio" in graph["locomesh.node.runtime"]
    assert "locomesh.node.agreement.tendermint" in graph["locomesh.node.agreement.seat"]
    assert _room_violations("locomesh.node.agreement.seat", "locomesh.node.rounds.machine")
    assert _room_violations("locomesh.node.exchange.seam", "locomesh.node.rounds.work")


def test_every_name_at_nodes_top_level_is_on_a_floor() -> None:
    names = {
        path.stem if path.is_file() else path.name
        for path in (TOP / "node").iterdir()
        if (path.suffix == ".py" and path.is_file()) or (path / "__init__.py").is_file()
    }
    floors = [CORE, FEATURES, PROCESS]
    unplaced = sorted(name for name in names if sum(name in floor for floor in floors) != 1)
    assert not unplaced, f"put each of these on exactly one of node's floors (CORE, FEATURES, PROCESS): {unplaced}"
    gone = sorted((CORE | FEATURES | PROCESS) - names)
    assert not gone, f"named on a floor but not in node/: {gone}"


def test_no_new_import_breaks_a_floor() -> None:
    new = {pair: rule for pair, rule in _violations().items() if pair not in KNOWN_VIOLATIONS}
    lines = [f"{importer} imports {imported}: {rule}" for (importer, imported), rule in sorted(new.items())]
    assert not new, "imports across a floor of docs/architecture.md:\n" + "\n".join(lines)


def test_the_known_violations_still_exist() -> None:
    """The allow-list only shrinks: a violation fixed is taken off it."""
    gone = sorted(KNOWN_VIOLATIONS - set(_violations()))
    assert not gone, f"no longer imported: take these off KNOWN_VIOLATIONS: {gone}"
