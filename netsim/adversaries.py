"""Adversaries for the `train` scenario: run members (and strangers) that attack the run through
the daemon's own services. Each is the real service with one behaviour turned hostile, so what
the honest nodes face is exactly what a modified daemon could send. The simulator's only; the
daemon never imports this.

- `WithholdingCheckpointService`: commits its payloads like anyone and stays connected, but never
  serves a payload (its own or one it fetched); as the round's first proposer its set names its
  own payload, which nobody can fetch (issue #18, findings 1 and 7).
"""

from __future__ import annotations

from locomesh.node import checkpoint_wire as wire
from locomesh.node.checkpoint_service import CheckpointService
from locomesh.training.checkpoint_manifest import CheckpointError


class WithholdingCheckpointService(CheckpointService):
    """A checkpoint service that answers not-found for every round payload it holds."""

    def _read(self, request: wire.Request) -> bytes | None:
        try:
            if self._manifest(request.checkpoint_id).metadata.get("kind") == "payload":
                return None
        except (OSError, CheckpointError):
            return None
        return super()._read(request)
