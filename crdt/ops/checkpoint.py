"""`checkpoint`: the author stored the state of certified round `round` as checkpoint `id`
(`size` bytes); it counts as its author's attestation of it (crdt/view.py)."""

from locomesh.protocol.schema import Int

from .base import HASH, KiB, ROUND, OpType, Rule

CHECKPOINT_FIELDS = {"round": ROUND, "id": HASH, "size": Int(0, 2**50)}

CHECKPOINT = OpType(
    "checkpoint", "the author stored round `round`'s state as checkpoint `id`",
    CHECKPOINT_FIELDS, 4 * KiB,
    Rule(2),  # one per round it aggregated, two after a restart in the middle of one
)
