"""The runs a node knows, kept in its data dir so that a restart keeps (and republishes) them.

    <data dir>/runs/created/<run id>.manifest   runs this node created
    <data dir>/runs/joined/<run id>.manifest    runs it took part in
    <data dir>/runs/seen/<run id>.manifest      runs it looked up

Each file holds the signed manifest envelope exactly as signed (its SHA-256 is
the run ID), written atomically. On load every file is verified again; a file
that fails (edited, truncated, misnamed) is skipped with a warning and left
where it is, never deleted: losing a run's only copy is worse than a warning.
A run known under several origins counts under the strongest (created >
joined > seen).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from locomesh.protocol import Envelope, ProtocolError
from locomesh.node.files import atomic_write
from locomesh.protocol.kinds import RUN_MANIFEST
from locomesh.protocol.runs import format_run_id, load_manifest

logger = logging.getLogger(__name__)

ORIGINS = ("created", "joined", "seen")  # strongest first
SUFFIX = ".manifest"


@dataclass(frozen=True)
class KnownRun:
    run_id: bytes
    manifest: bytes
    envelope: Envelope
    origin: str


class RunStore:
    """Runs by ID, in memory and under `<data dir>/runs/`."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.root = Path(data_dir) / "runs"
        self._runs: dict[bytes, KnownRun] = {}

    def load(self) -> list[KnownRun]:
        """Read every stored run (bad files skipped with a warning); return them, strongest origin first."""
        for origin in reversed(ORIGINS):  # weakest first, so a stronger origin overwrites
            folder = self.root / origin
            if folder.is_dir():
                for path in sorted(folder.glob(f"*{SUFFIX}")):
                    self._load_file(path, origin)
        return self.runs()

    def _load_file(self, path: Path, origin: str) -> None:
        try:
            if path.stat().st_size > RUN_MANIFEST.max_size:
                raise ProtocolError("too-large", f"over the manifest cap of {RUN_MANIFEST.max_size} bytes")
            manifest = path.read_bytes()
            run_id, envelope = load_manifest(manifest)
            if path.name != format_run_id(run_id) + SUFFIX:
                raise ProtocolError("wrong-name", "the file name is not the manifest's run ID")
        except (OSError, ProtocolError) as error:
            logger.warning("skipping run file %s: %s", path, error)
            return
        self._runs[run_id] = KnownRun(run_id, manifest, envelope, origin)

    def add(self, manifest: bytes, origin: str) -> KnownRun:
        """Verify and keep `manifest` under `origin` (a weaker origin never replaces a stronger one)."""
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}")
        run_id, envelope = load_manifest(manifest)
        known = self._runs.get(run_id)
        if known is not None and ORIGINS.index(known.origin) <= ORIGINS.index(origin):
            return known
        atomic_write(self.root / origin / (format_run_id(run_id) + SUFFIX), manifest, mode=0o600)
        self._runs[run_id] = KnownRun(run_id, manifest, envelope, origin)
        return self._runs[run_id]

    def get(self, run_id: bytes) -> KnownRun | None:
        return self._runs.get(run_id)

    def runs(self) -> list[KnownRun]:
        """Every known run: created first, then joined, then seen; newest first within each."""
        return sorted(self._runs.values(), key=lambda run: (ORIGINS.index(run.origin), -run.envelope.body["created"], run.run_id))
