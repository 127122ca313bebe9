"""The run's genesis: the signed manifest every rule of the run state starts from.

Only what the CRDT needs is kept: who may change hyperparameters and their values at round 0, who
is admitted and how (crdt/membership.py), and the agreement's settings. The manifest's author (the
creator) has a say from genesis: it is round 1's electorate.
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
    admission: str  # "open", "creator" or "electorate"
    admitted: frozenset[bytes]  # admitted at genesis: a say from the round their join is admitted in
    hparam_writers: frozenset[bytes]
    hparams: dict[str, Any]
    manifest: bytes
    earn_rounds: int = 3
    absent_rounds: int = 3

    @classmethod
    def from_manifest(cls, manifest_bytes: bytes) -> Genesis:
        """Verify a signed `run.manifest` envelope; raise `ProtocolError` if it is not one."""
        run_id, envelope = load_manifest(manifest_bytes)
        body = envelope.body
        return cls(
            run_id=run_id,
            creator=envelope.author,
            admission=body["admission"],
            admitted=frozenset(body["admitted"]),
            hparam_writers=frozenset(body["hparam_writers"]),
            hparams=dict(body["hparams"]),
            manifest=manifest_bytes,
            earn_rounds=body["earn_rounds"],
            absent_rounds=body["absent_rounds"],
        )

    @property
    def trusted(self) -> frozenset[bytes]:
        """The keys with a say as soon as they take part: the creator and the keys admitted at genesis."""
        return self.admitted | {self.creator}

    def check_author(self, author: bytes, op_type: str) -> None:
        """`ProtocolError` if `author` may not write ops of `op_type` at all: hyperparameter changes
        come from the keys the genesis names only. Who may take part is the membership's rule."""
        if op_type == "hparams" and author not in self.hparam_writers:
            raise ProtocolError("not-writer", "only keys named at genesis may change hyperparameters")
