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
private_addresses  ..._PRIVATE_ADDRESSES   (file / environment only)     "off"
archive            LOCOMESH_ARCHIVE        --archive (sets "on")         "off"
device             LOCOMESH_DEVICE         --device SPEC                 "auto"
local_workers      LOCOMESH_LOCAL_WORKERS  --local-workers N             0 (one per GPU)
memory_limit       LOCOMESH_MEMORY_LIMIT   --memory-limit SIZE           0 (free memory is the limit)
upload_limit       LOCOMESH_UPLOAD_LIMIT   --upload-limit RATE           0 (no cap)
download_limit     ..._DOWNLOAD_LIMIT      --download-limit RATE         0 (no cap)
train_threads      LOCOMESH_TRAIN_THREADS  --train-threads N             0 (torch's default)
schedule           LOCOMESH_SCHEDULE a,b   --schedule WINDOW (repeat)    [] (any time)
only_when_idle     ..._ONLY_WHEN_IDLE      --only-when-idle (sets "on")  "off"
only_on_ac_power   ..._ONLY_ON_AC_POWER    --only-on-ac-power ("on")     "off"
=================  ======================  ============================  ==========================

``attack`` turns the node into a test adversary: it trains like everyone else, then commits the
named attack's payload (`locomesh.training.attacks`, e.g. ``sign_flip_x100``) instead of its own.
It exists so that tests and simulations can show the aggregation holding; honest users leave it empty.

``relay`` says when this node relays for others (circuit relay v2, bounded): ``auto`` once its
reachability check finds it public, ``on`` always, ``off`` never. ``nat_traversal = "off"`` stops it
from reserving relay slots when private and from hole punching (`locomesh.node.nat`).
``port_mapping = "off"`` stops it from asking the home gateway (NAT-PMP, UPnP IGD) to forward its port.
``private_addresses = "on"`` lets the dials a peer asks for (reachability dial-backs, hole punches)
go to loopback and private addresses: for a swarm on one machine or one LAN (`locomesh swarm` sets
it). Off, the default, they go to public unicast addresses only, so no peer can make the node probe
its own host or LAN (`locomesh.node.addresses`).

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
the syntax is checked; `node start` refuses a device the machine lacks before anything starts
(`node/daemon.py`), and a join that asks for more than the machine has fails saying so.

``memory_limit`` is how much memory the node may use for training, as bytes or a size such as
``"8GiB"`` or ``"512MiB"``: a join whose run needs more (`locomesh.training.footprint`: the model,
its optimizer, activations, the outer step and the payloads held) is refused, saying how much it
needs. 0, the default, sets no limit beyond the memory the machine has available at the join.

``upload_limit`` and ``download_limit`` cap the node's total rate each way, in bytes per second or
a rate such as ``"10MB/s"``, ``"512KiB/s"`` or ``"8Mbit/s"`` (`parse_rate`): every libp2p
connection (streams, DHT, gossip, the relay service's circuits) and the checkpoint data plane
share one token bucket per direction (`locomesh.node.bandwidth`). ``train_threads`` is how many
CPU threads torch uses for the inner steps (0: torch's default); the outer step is single-threaded
NumPy either way. ``schedule`` lists the local-time windows in which the node trains
(``"22:00-07:00"`` runs across midnight; empty: any time); ``only_when_idle = "on"`` trains only
while other processes leave the CPU mostly idle, ``only_on_ac_power = "on"`` only while the
machine is on mains power, where the platform tells (`locomesh.node.schedule`). Outside them the
node stays a member and sits rounds out; it never stalls the others.

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
MAX_TRAIN_THREADS = 1024  # a sanity bound, as MAX_LOCAL_WORKERS
MAX_RATE = 10**12  # bytes per second: a sanity bound on a rate cap (a terabyte a second)
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
    private_addresses: str = "off"
    archive: str = "off"
    device: str = "auto"
    local_workers: int = 0
    memory_limit: int = 0  # bytes; 0: no limit beyond the available memory
    upload_limit: int = 0  # bytes per second; 0: no cap
    download_limit: int = 0
    train_threads: int = 0  # 0: torch's default
    schedule: tuple[str, ...] = ()  # "HH:MM-HH:MM" local-time windows; empty: any time
    only_when_idle: str = "off"
    only_on_ac_power: str = "off"
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
        if self.private_addresses not in ON_OFF:
            raise ConfigError(f"private_addresses: {self.private_addresses!r} is not one of {', '.join(ON_OFF)}")
        if self.archive not in ON_OFF:
            raise ConfigError(f"archive: {self.archive!r} is not one of {', '.join(ON_OFF)}")
        self._check_devices()
        if isinstance(self.memory_limit, bool) or not isinstance(self.memory_limit, int) or self.memory_limit < 0:
            raise ConfigError(f"memory_limit: {self.memory_limit!r} is not a size in bytes (0: no limit)")
        self._check_limits()
        return self

    def _check_limits(self) -> None:
        for key in ("upload_limit", "download_limit"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RATE:
                raise ConfigError(f"{key}: {value!r} is not a rate in bytes per second (0: no cap)")
        threads = self.train_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= MAX_TRAIN_THREADS:
            raise ConfigError(f"train_threads: {threads!r} is not a count of threads (0-{MAX_TRAIN_THREADS}; "
                              "0: torch's default)")
        from locomesh.node.schedule import ScheduleError, parse_window  # pure: datetime only

        for window in self.schedule:
            try:
                parse_window(window)
            except ScheduleError as error:
                raise ConfigError(f"schedule: {error}") from None
        for key in ("only_when_idle", "only_on_ac_power"):
            if getattr(self, key) not in ON_OFF:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not one of {', '.join(ON_OFF)}")

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
    "private_addresses", "archive", "device", "local_workers", "memory_limit", "upload_limit", "download_limit", "train_threads",
    "schedule", "only_when_idle", "only_on_ac_power",
)
_LISTS = ("listen", "bootstrap", "schedule")


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
    for key in _LISTS:
        if key in given:
            given[key] = tuple(given[key])
    for key in ("upload_limit", "download_limit"):
        if key in given:
            given[key] = _parse_rate(given[key], f"--{key.replace('_', '-')}")
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
        if key in _LISTS:
            values[key] = tuple(part.strip() for part in text.split(",") if part.strip())
        elif key == "rpc_port":
            values[key] = _parse_port(text, name)
        elif key == "local_workers":
            values[key] = _parse_count(text, name)
        elif key == "memory_limit":
            values[key] = _parse_size(text, name)
        elif key in ("upload_limit", "download_limit"):
            values[key] = _parse_rate(text, name)
        elif key == "train_threads":
            values[key] = _parse_count(text, name)
        else:
            values[key] = text.strip().lower()
    return values


def _typed(key: str, value: Any, where: str) -> Any:
    """A file value in the dataclass's type, or `ConfigError`."""
    if key in _LISTS:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            kind = "windows (HH:MM-HH:MM)" if key == "schedule" else "multiaddr"
            raise ConfigError(f"{where}: expected a list of {kind} strings")
        return tuple(value)
    if key in ("upload_limit", "download_limit"):
        return _parse_rate(value, where)
    if key == "memory_limit":
        return _parse_size(value, where)
    if key in ("rpc_port", "local_workers", "train_threads"):
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


def human_size(count: int) -> str:
    """A byte count as people read it: ``10 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.1 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_size(text: Any) -> int:
    """A byte count as people write it: ``8GiB``, ``512 MiB``, ``2G``, ``1.5GB``, ``123``, or an int.
    K/M/G/T alone and with ``iB`` are binary, with ``B`` decimal. `ValueError` saying what is wrong."""
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"{text!r} is not a size (like 8GiB, 512MiB or 1000000)")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text} is not a size: it is negative")
        return text
    cleaned = text.strip().replace(" ", "")
    number = cleaned.rstrip("KMGTPiBkmgtpib")
    unit = cleaned[len(number):].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not 0 <= value < float("inf"):
        raise ValueError(f"{text[:40]!r} is not a size (like 8GiB, 512MiB or 1000000)")
    return int(value * _SIZE_UNITS[unit])


_SIZE_UNITS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtp", start=1):
    _SIZE_UNITS |= {_letter: 1024**_power, _letter + "ib": 1024**_power, _letter + "b": 1000**_power}


def _parse_size(value: Any, where: str) -> int:
    try:
        return parse_size(value)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_rate(text: Any) -> int:
    """Bytes per second as people write a rate: ``10MB/s``, ``512KiB/s``, ``8Mbit/s``, ``2M``, ``125000``,
    or an int; ``0``, ``off`` or ``none``: no cap. Byte units as `parse_size` reads them, ``/s`` optional;
    ``kbit``/``Mbit``/``Gbit`` are decimal bits (``Kibit``... binary). `ValueError` saying what is wrong."""
    if isinstance(text, str):
        cleaned = text.strip().replace(" ", "")
        lowered = cleaned.lower()
        if lowered in ("off", "none"):
            return 0
        if lowered.endswith("/s"):
            cleaned, lowered = cleaned[:-2], lowered[:-2]
        if lowered.endswith("bit"):
            return _parse_bits(cleaned[: -len("bit")], text)
        text_or_size: Any = cleaned
    else:
        text_or_size = text
    try:
        return parse_size(text_or_size)
    except ValueError:
        raise ValueError(f"{str(text)[:40]!r} is not a rate (like 10MB/s, 512KiB/s, 8Mbit/s or 0 for none)") from None


def _parse_bits(number_and_prefix: str, text: str) -> int:
    prefixes = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}
    lowered = number_and_prefix.lower()
    prefix = next((p for p in sorted(prefixes, key=len, reverse=True) if p and lowered.endswith(p)), "")
    try:
        value = float(lowered[: len(lowered) - len(prefix)])
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"{text[:40]!r} is not a rate (like 10MB/s, 512KiB/s, 8Mbit/s or 0 for none)")
    return int(value * prefixes[prefix] / 8)


def _parse_rate(value: Any, where: str) -> int:
    try:
        return parse_rate(value)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


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
