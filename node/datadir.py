"""The data dir: what a daemon keeps on disk, and how a client finds the daemon through it.

    <data dir>/
        identity.key   the node's Ed25519 key (PEM, 0600), created once, reused at every start
        config.toml    optional configuration (see `locomesh.node.config`)
        daemon.lock    held with an exclusive fcntl lock while a daemon runs; holds its PID
        rpc.json       {"port", "pid", "peer_id"}: where the running daemon's RPC listens
        rpc.cookie     the RPC secret for this start (0600), 64 hex characters
        listen.port    the TCP port it last listened on; a listen address with port 0 takes it again if free
        runs/          the runs it knows (`locomesh.node.runs.store`)
        crdt/          each run's op log: every op it applied there (`locomesh.node.replication.op_log`)
        rounds/        each run's newest finished rounds here, and a mark once left (`locomesh.node.rounds.history`)
        checkpoints/   the checkpoint store: states, payloads, datasets (`locomesh.node.transfer.store`)

The identity key is PKCS#8 PEM, written atomically and readable by the owner alone
(`load_or_create_identity`; a looser mode found on it is tightened). `rpc.json` and
`rpc.cookie` are written atomically once the RPC answers, and removed on a clean shutdown. A
client therefore trusts them only while the lock is held (`daemon_running`): a daemon that
crashed leaves stale files but
no lock, because the kernel drops the lock with the process.

A write that fails (a full disk above all) raises `DataDirError` with one line that names the
file and what to do (`cannot_write`), never a bare `OSError`: `node start` shows it as is.

This module does not import libp2p or trio: the CLI client uses it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from locomesh.node.files import atomic_write
from locomesh.protocol import Identity

IDENTITY_FILE = "identity.key"
LOCK_FILE = "daemon.lock"
LISTEN_PORT_FILE = "listen.port"
RPC_INFO_FILE = "rpc.json"
COOKIE_FILE = "rpc.cookie"
CHECKPOINT_DIR = "checkpoints"
COOKIE_BYTES = 32
_MAX_INFO_FILE = 64 * 1024
_LOCK_ATTEMPTS = 10
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no room left, on the disk or in the user's quota


class DataDirError(Exception):
    """The data dir cannot be used (locked by another daemon, unwritable, or holding a bad file)."""


class IdentityError(Exception):
    """A key file that is missing, unreadable, or not an Ed25519 key."""


@dataclass(frozen=True)
class RpcInfo:
    port: int
    pid: int
    peer_id: str


class DataDir:
    """One node's directory. `lock()` before writing anything in it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    @property
    def identity_path(self) -> Path:
        return self.path / IDENTITY_FILE

    def lock(self) -> None:
        """Take the data dir for this process, or raise `DataDirError` if another daemon has it or it
        cannot be written."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            if error.errno in DISK_FULL:
                raise cannot_write(self.path, error) from None
            raise DataDirError(f"cannot use data dir {self.path}: {error.strerror}") from None
        if not _try_lock(fd):
            holder = _read_pid(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise DataDirError(f"another locomesh daemon{who} is using data dir {self.path}") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as error:
            os.close(fd)  # releases the lock: a daemon that cannot write here cannot run here
            raise cannot_write(self.path / LOCK_FILE, error) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    def new_cookie(self) -> str:
        """Write a fresh RPC cookie (0600, atomically) and return it."""
        cookie = secrets.token_hex(COOKIE_BYTES)
        write_file(self.path / COOKIE_FILE, cookie.encode("ascii"), mode=0o600)
        return cookie

    def write_rpc_info(self, info: RpcInfo) -> None:
        data = json.dumps({"port": info.port, "pid": info.pid, "peer_id": info.peer_id}).encode()
        write_file(self.path / RPC_INFO_FILE, data, mode=0o644)

    def last_listen_port(self) -> int | None:
        """The TCP port the last daemon on this data dir listened on, if it wrote one that parses."""
        try:
            text = (self.path / LISTEN_PORT_FILE).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() and 0 < int(text) < 65536 else None

    def write_listen_port(self, port: int) -> None:
        write_file(self.path / LISTEN_PORT_FILE, f"{port}\n".encode("ascii"), mode=0o644)

    def remove_rpc_files(self) -> None:
        for name in (RPC_INFO_FILE, COOKIE_FILE):
            try:
                (self.path / name).unlink()
            except FileNotFoundError:
                pass

    # --- what a client reads ----------------------------------------------------------

    def daemon_running(self) -> bool:
        """True while some process holds the data dir's lock."""
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def read_rpc_info(self) -> RpcInfo | None:
        """Where the daemon's RPC listens, or None if no daemon has published it."""
        raw = self._read_small(RPC_INFO_FILE)
        if raw is None:
            return None
        try:
            data: Any = json.loads(raw)
            info = RpcInfo(port=data["port"], pid=data["pid"], peer_id=data["peer_id"])
        except (ValueError, KeyError, TypeError):
            raise DataDirError(f"{self.path / RPC_INFO_FILE} is damaged; remove it if no daemon runs") from None
        if not isinstance(info.port, int) or not 0 < info.port < 65536:
            raise DataDirError(f"{self.path / RPC_INFO_FILE} names no valid port")
        return info

    def read_cookie(self) -> str | None:
        raw = self._read_small(COOKIE_FILE)
        return None if raw is None else raw.decode("ascii", errors="replace").strip()

    def _read_small(self, name: str) -> bytes | None:
        try:
            with open(self.path / name, "rb") as file:
                return file.read(_MAX_INFO_FILE)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise DataDirError(f"cannot read {self.path / name}: {error.strerror}") from None


# --- the identity key -------------------------------------------------------------------


def save_identity(identity: Identity, path: str | os.PathLike) -> None:
    """Write the key as PKCS#8 PEM, atomically, readable by the owner alone; `DataDirError` if it
    cannot be written (`cannot_write`)."""
    pem = identity.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_file(path, pem, mode=0o600)


def load_identity(path: str | os.PathLike) -> Identity:
    """The identity whose key is at `path` (its mode tightened to 0600 if it was looser), or `IdentityError`."""
    path = Path(path)
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"cannot read identity key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"{path} is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return Identity(key)


def load_or_create_identity(path: str | os.PathLike) -> Identity:
    """The identity at `path`, created there on first use (`DataDirError` if it cannot be written)."""
    if Path(path).exists():
        return load_identity(path)
    identity = Identity.generate()
    save_identity(identity, path)
    return identity


# --- writing ----------------------------------------------------------------------------


def write_file(path: str | os.PathLike, data: bytes, *, mode: int) -> None:
    """`atomic_write` (nothing half-written is left), with a failure as `DataDirError` (`cannot_write`)."""
    try:
        atomic_write(path, data, mode=mode)
    except OSError as error:
        raise cannot_write(path, error) from None


def cannot_write(path: str | os.PathLike, error: OSError) -> DataDirError:
    """`error`, met writing at `path`, in one line that says what to do."""
    if error.errno in DISK_FULL:
        return DataDirError(f"{no_space(error)}: {path}; free some space or use --data-dir DIR on another disk")
    return DataDirError(f"cannot write {path}: {error.strerror}")


def no_space(error: OSError) -> str:
    """What a disk-full `error` (errno in `DISK_FULL`) means, in words."""
    return "disk quota exceeded" if error.errno == errno.EDQUOT else "no space left on device"


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on `fd`, retrying briefly: a client's `daemon_running` probe holds it for an instant."""
    for attempt in range(_LOCK_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _LOCK_ATTEMPTS:
                time.sleep(0.02)
    return False


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text.isdigit() else None
    except (OSError, UnicodeDecodeError):
        return None
