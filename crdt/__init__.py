"""locomesh.crdt: the run state as a signed, Byzantine-tolerant CRDT (pure, sans-IO).

- `ops`: the op registry (a file per op type: fields, rule, facts row, equivocation) and the wire
  format (unsigned content, whose SHA-256 is the op ID, plus a seal);
- `seal`: one signature over a batch of ops, a Merkle path per op;
- `replica`: the DAG store: validation, the bounded pending buffer, heads;
- `facts`: what the ops say; `chain`: the certified history built from them as they arrive, with
  `value` (what a round decides, and the rules every member checks alike) and `membership` (who
  takes part and who has a say, round by round); `view`: the run state summarised;
- `limits`: what one author may write; `evidence`: self-verifying proofs of equivocation;
- `scores`: contribution scores; `snapshot`: certified compaction; `sync`: anti-entropy.
"""

from .chain import Certificate, Chain
from .evidence import evidence_fields, guilty_author
from .facts import Facts
from .genesis import Genesis
from .ops import Op, OpId, decode_op, encode_op, op_id
from .quorum import is_quorum
from .replica import Receipt, Replica
from .snapshot import facts_of_downset, load_snapshot, snapshot_fields
from .sync import SyncPuller, SyncServer
from .value import InvalidValue, Value
from .view import Checkpoint, RunState, Snapshot, derive

__all__ = [
    "Certificate", "Chain", "Checkpoint", "Facts", "Genesis", "InvalidValue", "Op", "OpId", "Receipt", "Replica",
    "RunState", "Snapshot", "SyncPuller", "SyncServer", "Value",
    "decode_op", "derive", "encode_op", "evidence_fields", "facts_of_downset", "guilty_author", "is_quorum",
    "load_snapshot", "op_id", "snapshot_fields",
]
