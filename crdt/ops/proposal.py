"""`proposal`: the proposer of attempt `attempt` of round `round` in epoch `epoch` proposes a value
(Tendermint's PROPOSAL, node/agreement/tendermint.py): `set`, the commits the round aggregates;
`members`, the joins, leaves, admissions and evidence whose changes take effect after it; `last`,
precommits of the round before that certified it (who was there). All three are op IDs the
proposal depends on, so a replica holds what the value names before it holds the proposal.
`valid` is Tendermint's validRound plus one (0: none). crdt/value.py reads the value and says
whether it is valid, alike on every replica."""

from locomesh.protocol.schema import Int, List

from .base import (
    ATTEMPT, EPOCH, HASH, KiB, LIVE_ROUND, MAX_ATTEMPT, MAX_CHANGES, MAX_LAST, MAX_SET, Equivocation, OpType, Rule,
)

PROPOSAL = OpType(
    "proposal", "the value the author proposes for attempt `attempt` of round `round` in epoch `epoch`",
    {
        "round": LIVE_ROUND, "epoch": EPOCH, "attempt": ATTEMPT, "valid": Int(0, MAX_ATTEMPT + 1),
        "set": List(HASH, max_len=MAX_SET, min_len=1),
        "members": List(HASH, max_len=MAX_CHANGES),
        "last": List(HASH, max_len=MAX_LAST),
    },
    48 * KiB,  # every list at its longest, with msgpack framing: about 36 KiB
    Rule(2, key=("round", "epoch", "attempt")),
    Equivocation(key=("round", "epoch", "attempt"), statement=("valid", "set", "members", "last")),
    referable=True,  # by its ID: what a round's record names as the proposal it decided
    refs=("set", "members", "last"),
    sorted_lists=("set", "members", "last"),
)
