"""Daemon logging: to stderr, as readable lines or as JSON lines (one object per record).

JSON records carry ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg`` and,
for an exception, ``exc`` (the formatted traceback). py-libp2p logs a lot at
INFO about its internals; it is held at WARNING unless the level is DEBUG.
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


def configure_logging(*, level: str, fmt: str) -> None:
    """Send all logging to stderr in format `fmt` ("text" or "json") at `level` ("debug".."error")."""
    handler = logging.StreamHandler(sys.stderr)
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
