"""The op registry: one `OpType` per kind of op, a file each (base.py says what an entry holds),
and the wire format every op shares (wire.py: content, seal, decoding).

    join  leave  admit       membership: who asks in, who leaves, whom the run vouches for
    commit                   a member's payload for a round
    proposal prevote precommit recover
                             the agreement of each round (node/agreement/tendermint.py)
    checkpoint attest        where a certified state is stored
    score                    contribution scores (crdt/scores.py)
    shard_result dispute     sharded exchange (node/exchange/)
    hparams snapshot evidence
                             hyperparameter changes, compaction, proofs of equivocation
"""

from __future__ import annotations

from locomesh.protocol.kinds import MAX_SEALED_OP

from .admit import ADMIT
from .attest import ATTEST
from .base import MAX_PARENTS, OpType, Rule
from .checkpoint import CHECKPOINT
from .commit import COMMIT
from .dispute import DISPUTE
from .evidence import EVIDENCE, SEAL_OVERHEAD
from .hparams import HPARAMS
from .join import JOIN
from .leave import LEAVE
from .precommit import PRECOMMIT
from .prevote import PREVOTE
from .proposal import PROPOSAL
from .recover import RECOVER
from .score import SCORE
from .shard_result import SHARD_RESULT
from .snapshot import SNAPSHOT

REGISTRY: dict[str, OpType] = {op_type.name: op_type for op_type in (
    JOIN, LEAVE, ADMIT, COMMIT, PROPOSAL, PREVOTE, PRECOMMIT, RECOVER, CHECKPOINT, ATTEST, SCORE, SHARD_RESULT,
    DISPUTE, HPARAMS, SNAPSHOT, EVIDENCE,
)}
OP_KINDS = frozenset(f"crdt.{name}" for name in REGISTRY)
# The largest op on the wire: evidence, which carries two of the largest other ops.
assert EVIDENCE.max_size + SEAL_OVERHEAD <= MAX_SEALED_OP, "protocol/kinds.py's MAX_SEALED_OP is too small"


def op_type(kind_or_name: str) -> OpType:
    """The registry entry of `crdt.<name>` or `<name>`."""
    return REGISTRY[kind_or_name[5:] if kind_or_name.startswith("crdt.") else kind_or_name]


from .wire import (  # noqa: E402 - the wire format reads the registry above
    MAX_OP_WIRE, Op, OpId, Wire, content_id, decode_op, decode_wire, encode_op, op_content, op_id, parse_wire,
    seal_ops,
)

__all__ = [
    "MAX_OP_WIRE", "MAX_PARENTS", "OP_KINDS", "REGISTRY", "Op", "OpId", "OpType", "Rule", "Wire", "content_id", "decode_op",
    "decode_wire", "encode_op", "op_content", "op_id", "op_type", "parse_wire", "seal_ops",
]
