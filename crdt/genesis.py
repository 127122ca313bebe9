"""The run's genesis: the signed manifest every rule of the run state starts from.

Only what the CRDT needs is kept: who may write at all (admission), who may change
hyperparameters, and the hyperparameters at round 0. The manifest's author (the creator)
is always admitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import load_manifest


@dataclass(frozen=True)
class Genesis:
    run_id: bytes
    creator: bytes
    admission: str  # "open" or "allowlist"
    allowlist: frozenset[bytes]
    hparam_writers: frozenset[bytes]
    hparams: dict[str, Any]
    manifest: bytes
    influence: str = "earned"  # "earned" or "joined" (crdt/electorate.py)

    @classmethod
    def from_manifest(cls, manifest_bytes: bytes) -> Genesis:
        """Verify a signed `run.manifest` envelope; raise `ProtocolError` if it is not one."""
        run_id, envelope = load_manifest(manifest_bytes)
        body = envelope.body
        return cls(
            run_id=run_id,
            creator=envelope.author,
            admission=body["admission"],
            allowlist=frozenset(body["allowlist"]),
            hparam_writers=frozenset(body["hparam_writers"]),
            hparams=dict(body["hparams"]),
            manifest=manifest_bytes,
            influence=body.get("influence", "earned"),
        )

    def admits(self, author: bytes) -> bool:
        """May `author` write to this run at all?"""
        return self.admission == "open" or author == self.creator or author in self.allowlist

    @property
    def trusted(self) -> frozenset[bytes]:
        """The keys that weigh in quorums from their join: the creator and the allowlist."""
        return self.allowlist | {self.creator}

    def check_author(self, author: bytes) -> None:
        if not self.admits(author):
            raise ProtocolError("not-admitted", "the author is not on this run's allowlist")
