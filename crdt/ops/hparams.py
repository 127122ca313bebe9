"""`hparams`: a change of hyperparameters taking effect at round `round`; written only by the keys
the genesis names (crdt/genesis.py), exempt from the limits. Its row keeps the changes packed."""

from locomesh.protocol import pack
from locomesh.protocol.schema import Bytes, Map, Scalar

from .base import HASH, KEY, MAX_OP_SIZE, ROUND, OpType, Row


def _row(op, _convicts):
    return (op.body["round"], op.id, op.author, pack(op.body["changes"]))


HPARAMS = OpType(
    "hparams", "from round `round`, these hyperparameters change",
    {"round": ROUND, "changes": Map(Scalar(), max_len=64)}, MAX_OP_SIZE,
    None,
    custom_row=_row,
    custom_row_spec=Row((ROUND, HASH, KEY, Bytes(1, 64 * 1024))),
)
