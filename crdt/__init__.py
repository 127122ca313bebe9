"""locomesh.crdt: the run state as a signed, Byzantine-tolerant CRDT (pure, sans-IO).

- `ops`: the op format (unsigned content, whose SHA-256 is the op ID, plus a seal);
- `seal`: one signature over a batch of ops, a Merkle path per op;
- `replica`: the DAG store: validation, the bounded pending buffer, heads;
- `facts` and `view`: what the ops say, and the run state derived from it; `electorate`: who
  weighs in a round (contributors, earned influence, attempts, certificates);
- `scores`: contribution scores, the scoring committee and the median of its reports;
- `evidence`: self-verifying proofs of equivocation; `snapshot`: certified compaction;
- `sync`: the anti-entropy state machine (heads, want, ops).
"""

from .evidence import evidence_fields, guilty_author
from .facts import Facts
from .genesis import Genesis
from .ops import Op, OpId, decode_op, encode_op, op_id
from .replica import Receipt, Replica
from .snapshot import facts_of_downset, load_snapshot, snapshot_fields
from .sync import SyncPuller, SyncServer
from .view import Checkpoint, RunState, Snapshot, derive, is_quorum

__all__ = [
    "Checkpoint", "Facts", "Genesis", "Op", "OpId", "Receipt", "Replica", "RunState", "Snapshot", "SyncPuller",
    "SyncServer",
    "decode_op", "derive", "encode_op", "evidence_fields", "facts_of_downset", "guilty_author", "is_quorum",
    "load_snapshot", "op_id", "snapshot_fields",
]
