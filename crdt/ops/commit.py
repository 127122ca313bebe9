"""`commit`: the author's commitment to its encoded pseudo-gradient for round `round`: the payload's
checkpoint ID (SHA-256 of its manifest, training/checkpoint_manifest.py), which names every chunk's
hash, and its length. A round's value names the commits it aggregates, by op ID."""

from locomesh.protocol.schema import Int

from .base import HASH, LIVE_ROUND, KiB, Equivocation, OpType, Rule

MAX_PAYLOAD_SIZE = 2**31

COMMIT = OpType(
    "commit", "the author's payload for round `round` is `hash`, `size` bytes long",
    {"round": LIVE_ROUND, "hash": HASH, "size": Int(1, MAX_PAYLOAD_SIZE)}, 4 * KiB,
    Rule(2),
    # Two commitments differing in hash or size: one payload cannot match both.
    Equivocation(key=("round",), statement=("hash", "size")),
    referable=True,
)
