"""`evidence`: two signed statements by one author that conflict (crdt/evidence.py checks them with
nothing but the two ops and the run ID). Anyone may write it: a node that only replicates a run
must be able to spread a fork's proof. Its row is the author it convicts; a round's value that
names it makes the ban take effect (crdt/membership.py)."""

from locomesh.protocol.schema import Bytes, Str

from .base import HASH, KEY, KiB, OpType, Row, Rule
from .proposal import PROPOSAL

SEAL_OVERHEAD = 1 * KiB  # signature, index, count and 8 sibling hashes, with msgpack framing: < 400 bytes
_STATEMENT = Bytes(1, PROPOSAL.max_size + SEAL_OVERHEAD)  # the largest op an author can contradict


def _row(op, convicts):
    assert convicts is not None, "evidence is verified before its facts are added"
    return (op.id, op.author, convicts)


EVIDENCE = OpType(
    "evidence", "ops `a` and `b` are two conflicting statements of one author",
    {"reason": Str(1, 32), "a": _STATEMENT, "b": _STATEMENT},
    2 * _STATEMENT.max_len + 4 * KiB,
    Rule(16, key=(), members_only=False),
    referable=True,
    custom_row=_row,
    custom_row_spec=Row((HASH, KEY, KEY)),
)
