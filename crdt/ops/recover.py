"""`recover`: the author saw no certificate of round `round` + 1 in epoch `epoch` for the run's
`recover_after` and asks for a recovery epoch that goes on from certified round `round` (state
hash `state`, b"" for round 0). It carries its lock: the attempt it last precommitted a value in,
plus one (0: none), and that value. One recover per author per epoch: a second is evidence. When
more than half of that round's electorate signed (exactly half with the creator among them),
epoch `epoch` + 1 starts, whose first round a majority decides; it must decide the highest proven
lock the signers carry, and its value names the recovers it counts: the members it names stay in
the electorate, the others leave it (crdt/chain.py, crdt/membership.py)."""

from locomesh.protocol.schema import Int

from .base import EPOCH, KiB, MAX_ATTEMPT, NIL_OR_HASH, ROUND, Equivocation, OpType, Rule

RECOVER = OpType(
    "recover", "the author asks epoch `epoch` + 1 to go on from certified round `round`",
    {"round": ROUND, "epoch": EPOCH, "state": NIL_OR_HASH, "lock": Int(0, MAX_ATTEMPT + 1), "value": NIL_OR_HASH},
    4 * KiB,
    Rule(2, key=("epoch",)),
    Equivocation(key=("epoch",), statement=("round", "state", "lock", "value")),
    referable=True,  # a recovery epoch's value names the recovers it counts (crdt/value.py)
)
