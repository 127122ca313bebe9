"""`attest`: the author computed the state of round `round` and checkpoint `id` holds it."""

from .base import KiB, OpType, Rule
from .checkpoint import CHECKPOINT_FIELDS

ATTEST = OpType(
    "attest", "the author says checkpoint `id` holds round `round`'s state",
    CHECKPOINT_FIELDS, 4 * KiB,
    Rule(4),  # a checkpoint counts as an attestation already: a few candidates
)
