"""Daemon logging: to stderr, as readable lines or as JSON lines (one object per record).

JSON records carry ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg`` and,
for an exception, ``exc`` (the formatted traceback).

py-libp2p logs its internals freely, failed dials at ERROR among them (one
per unreachable address of a peer: routine). Its records are shown as DEBUG
ones, at level debug only; the node counts what matters (protocol errors,
failed dials) itself. py-libp2p also cuts its loggers off from ours when it
is imported (no handler, no propagation: its warnings and errors then reach
stderr bare, through logging's last-resort handler); `join_libp2p_logging`,
called once it is imported, joins them back.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

_NOISY = ("libp2p", "multiaddr", "async_service")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _Libp2pAtDebug(logging.Filter):
    """py-libp2p's records, whatever their level, as DEBUG records: shown at level debug only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] not in _NOISY:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def join_libp2p_logging() -> None:
    """Route py-libp2p's loggers through ours again (call after importing libp2p; see the module docstring)."""
    for name in _NOISY:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def configure_logging(*, level: str, fmt: str) -> None:
    """Send all logging to stderr in format `fmt` ("text" or "json") at `level` ("debug".."error")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Libp2pAtDebug())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = logging.DEBUG if level == "debug" else logging.WARNING
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(quiet, root.level))
