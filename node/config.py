"""The daemon's configuration: one validated dataclass, from a TOML file, the environment and flags.

Precedence, lowest first: built-in defaults < the TOML file < ``LOCOMESH_*``
environment variables < command-line flags. The file is ``--config FILE``
(or ``LOCOMESH_CONFIG``); without one, ``<data dir>/config.toml`` is read if
it exists. The data dir itself comes from ``--data-dir``, ``LOCOMESH_DATA_DIR``
or the platform's user data dir (`platformdirs.user_data_dir("locomesh")`),
never from the file that lives inside it.

=================  ======================  ============================  ==========================
key (TOML)         environment             flag                          default
=================  ======================  ============================  ==========================
listen             LOCOMESH_LISTEN (a,b)   --listen MULTIADDR (repeat)   ["/ip4/0.0.0.0/tcp/0"]
bootstrap          LOCOMESH_BOOTSTRAP      --bootstrap MULTIADDR         []
rpc_port           LOCOMESH_RPC_PORT       --rpc-port N                  0 (any free port)
log_format         LOCOMESH_LOG_FORMAT     --log-format text|json        "text"
log_level          LOCOMESH_LOG_LEVEL      --log-level LEVEL             "info"
attack             LOCOMESH_ATTACK         --attack NAME                 "" (honest)
relay              LOCOMESH_RELAY          (file / environment only)     "auto"
nat_traversal      LOCOMESH_NAT_TRAVERSAL  (file / environment only)     "on"
port_mapping       LOCOMESH_PORT_MAPPING   --no-upnp (sets "off")        "on"
archive            LOCOMESH_ARCHIVE        --archive (sets "on")         "off"
device             LOCOMESH_DEVICE         --device SPEC                 "auto"
local_workers      LOCOMESH_LOCAL_WORKERS  --local-workers N             0 (one per GPU)
=================  ======================  ============================  ==========================

``attack`` turns the node into a test adversary: it trains like everyone else, then commits the
named attack's payload (`locomesh.training.attacks`, e.g. ``sign_flip_x100``) instead of its own.
It exists so that tests and simulations can show the aggregation holding; honest users leave it empty.

``relay`` says when this node relays for others (circuit relay v2, bounded): ``auto`` once its
reachability check finds it public, ``on`` always, ``off`` never. ``nat_traversal = "off"`` stops it
from reserving relay slots when private and from hole punching (`locomesh.node.nat`).
``port_mapping = "off"`` stops it from asking the home gateway (NAT-PMP, UPnP IGD) to forward its port.

``archive = "on"`` makes the node an archive of the runs it trains in: every payload of every round
(the others' too, once fetched and checked) goes to its checkpoint store and stays there, so that
``locomesh run audit`` can replay any round (`locomesh.node.rounds.audit`). It costs disk: per
round, about the sum of the round's payloads, i.e. contributors x payload size (int8: about one
byte per parameter each, 4-bit half that, fp32 four), never removed. Off, only the last few
rounds' own payloads and states are kept.

``device`` is where the inner steps of the runs this node joins run: ``auto`` (the first CUDA GPU,
else Apple's MPS, else the CPU), ``cpu``, ``cuda`` (cuda:0), ``cuda:N`` or ``mps``
(`locomesh.training.devices`). Inner steps run in bf16 on a GPU that has it; the outer step stays on
the CPU, bit-exact, so peers on any hardware agree on every bit. ``local_workers`` is how many
processes train data-parallel on this node (`locomesh.training.distributed`): 0, the default, is
one per GPU for ``auto`` and ``cuda`` on a machine with several GPUs, else one; N asks for the
first N GPUs, or for ``cpu`` N CPU processes (tests, machines with several CPU sockets). Here only
the syntax is checked: whether the devices are there is known when a run is joined, and a join
that asks for what the machine lacks fails saying so.

A list given at a higher level replaces the lower one (it is not merged).
Every bad value raises `ConfigError` with a one-line message naming where the
value came from; unknown keys in the file are errors too (a typo must not be
silently ignored). This module does not import libp2p: multiaddrs are checked
with the `multiaddr` package alone.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "LOCOMESH_"
DEFAULT_LISTEN = ("/ip4/0.0.0.0/tcp/0",)
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
RELAY_MODES = ("auto", "on", "off")  # = locomesh.node.nat.relay_service.RELAY_MODES (no libp2p import here)
ON_OFF = ("on", "off")
MAX_LOCAL_WORKERS = 1024  # processes of one node's data-parallel group: a sanity bound, not a tuning
CONFIG_FILE_NAME = "config.toml"
_MAX_CONFIG_FILE = 1024 * 1024


class ConfigError(Exception):
    """A configuration value that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    listen: tuple[str, ...] = DEFAULT_LISTEN
    bootstrap: tuple[str, ...] = ()
    rpc_port: int = 0
    log_format: str = "text"
    log_level: str = "info"
    attack: str = ""
    relay: str = "auto"
    nat_traversal: str = "on"
    port_mapping: str = "on"
    archive: str = "off"
    device: str = "auto"
    local_workers: int = 0
    config_file: Path | None = field(default=None, compare=False)

    def validate(self) -> NodeConfig:
        """Check every field; return self, or raise `ConfigError`."""
        if not self.listen:
            raise ConfigError("listen: at least one address is needed")
        for address in self.listen:
            _check_multiaddr(address, "listen", need_peer=False)
        for address in self.bootstrap:
            _check_multiaddr(address, "bootstrap", need_peer=True)
        if isinstance(self.rpc_port, bool) or not isinstance(self.rpc_port, int) or not 0 <= self.rpc_port <= 65535:
            raise ConfigError(f"rpc_port: {self.rpc_port!r} is not a port number (0-65535)")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format: {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.attack:
            from locomesh.training.attacks import ATTACKS  # numpy only; the daemon needs it for training anyway

            if self.attack not in ATTACKS:
                raise ConfigError(f"attack: {self.attack!r} is not one of {', '.join(sorted(ATTACKS))}")
        if self.relay not in RELAY_MODES:
            raise ConfigError(f"relay: {self.relay!r} is not one of {', '.join(RELAY_MODES)}")
        if self.nat_traversal not in ON_OFF:
            raise ConfigError(f"nat_traversal: {self.nat_traversal!r} is not one of {', '.join(ON_OFF)}")
        if self.port_mapping not in ON_OFF:
            raise ConfigError(f"port_mapping: {self.port_mapping!r} is not one of {', '.join(ON_OFF)}")
        if self.archive not in ON_OFF:
            raise ConfigError(f"archive: {self.archive!r} is not one of {', '.join(ON_OFF)}")
        self._check_devices()
        return self

    def _check_devices(self) -> None:
        from locomesh.training.devices import DeviceError, check_spec  # no torch: syntax only

        try:
            check_spec(self.device)
        except DeviceError as error:
            raise ConfigError(f"device: {error}") from None
        workers = self.local_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= MAX_LOCAL_WORKERS:
            raise ConfigError(f"local_workers: {workers!r} is not a count of processes (0-{MAX_LOCAL_WORKERS}; "
                              "0: one per GPU)")


_SETTABLE = (
    "listen", "bootstrap", "rpc_port", "log_format", "log_level", "attack", "relay", "nat_traversal", "port_mapping",
    "archive", "device", "local_workers",
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``LOCOMESH_*`` variable this configuration does not read (a typo is otherwise
    silently ignored), naming the closest known variable."""
    known = [key.upper() for key in (*_SETTABLE, "data_dir", "config")]
    warnings = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):] not in known:
            close = difflib.get_close_matches(name[len(ENV_PREFIX):], known, n=1)
            hint = (f" (did you mean {ENV_PREFIX}{close[0]}?)" if close
                    else f" (known: {', '.join(ENV_PREFIX + key for key in known)})")
            warnings.append(f"environment variable {name} is not a locomesh setting; ignored{hint}")
    return warnings


def default_data_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("locomesh"))


def resolve_data_dir(flag: str | os.PathLike | None, environ: Mapping[str, str]) -> Path:
    """The data dir: the flag, else ``LOCOMESH_DATA_DIR``, else the platform default."""
    chosen = flag if flag is not None else environ.get(ENV_PREFIX + "DATA_DIR") or None
    return Path(chosen).expanduser() if chosen is not None else default_data_dir()


def load_config(
    *,
    data_dir: str | os.PathLike | None = None,
    config_file: str | os.PathLike | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Defaults < file < environment < `flags` (only the keys present and not None count)."""
    environ = os.environ if environ is None else environ
    directory = resolve_data_dir(data_dir, environ)
    path = _config_path(config_file, environ, directory)
    config = NodeConfig(data_dir=directory, config_file=path)
    if path is not None:
        config = replace(config, **_from_file(path))
    config = replace(config, **_from_env(environ))
    given = {key: value for key, value in (flags or {}).items() if value is not None}
    for key in ("listen", "bootstrap"):
        if key in given:
            given[key] = tuple(given[key])
    config = replace(config, **given)
    return config.validate()


def _config_path(flag: str | os.PathLike | None, environ: Mapping[str, str], data_dir: Path) -> Path | None:
    chosen = flag if flag is not None else environ.get(ENV_PREFIX + "CONFIG") or None
    if chosen is not None:
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    default = data_dir / CONFIG_FILE_NAME
    return default if default.is_file() else None


def _from_file(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_CONFIG_FILE:
            raise ConfigError(f"{path}: a config file is at most {_MAX_CONFIG_FILE} bytes")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    unknown = sorted(data.keys() - set(_SETTABLE))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(_SETTABLE)})")
    values = {}
    for key, value in data.items():
        values[key] = _typed(key, value, f"{path}: {key}")
    return values


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in _SETTABLE:
        name = ENV_PREFIX + key.upper()
        text = environ.get(name)
        if text is None or text == "":
            continue
        if key in ("listen", "bootstrap"):
            values[key] = tuple(part.strip() for part in text.split(",") if part.strip())
        elif key == "rpc_port":
            values[key] = _parse_port(text, name)
        elif key == "local_workers":
            values[key] = _parse_count(text, name)
        else:
            values[key] = text.strip().lower()
    return values


def _typed(key: str, value: Any, where: str) -> Any:
    """A file value in the dataclass's type, or `ConfigError`."""
    if key in ("listen", "bootstrap"):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where}: expected a list of multiaddr strings")
        return tuple(value)
    if key in ("rpc_port", "local_workers"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string")
    return value.lower()


def _parse_port(text: str, where: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ConfigError(f"{where}: {text[:40]!r} is not a port number") from None


def _parse_count(text: str, where: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ConfigError(f"{where}: {text[:40]!r} is not a whole number") from None


def _check_multiaddr(text: str, where: str, *, need_peer: bool) -> None:
    from multiaddr import Multiaddr

    try:
        address = Multiaddr(text)
        protocols = [protocol.name for protocol in address.protocols()]
    except Exception as error:  # noqa: BLE001 - the multiaddr package raises several types
        raise ConfigError(f"{where}: {text[:120]!r} is not a multiaddr ({error})") from None
    if "tcp" not in protocols or not {"ip4", "ip6", "dns", "dns4", "dns6"} & set(protocols):
        raise ConfigError(f"{where}: {text[:120]!r} is not a TCP address (like /ip4/127.0.0.1/tcp/4001)")
    if need_peer and "p2p" not in protocols:
        raise ConfigError(f"{where}: {text[:120]!r} lacks the peer ID (.../p2p/12D3KooW...)")
