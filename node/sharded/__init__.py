"""Sharded exchange: each shard of the round's aggregate computed by a small committee, checked by
recomputation, so that a peer's traffic and work per round do not grow with the number of peers.

- `plan.py`: how large committees must be, and how many shards each peer recomputes, for a wrong
  result to stand with a bounded probability (the README's "Sharded exchange" gives the table);
- `aggregation.py`: one peer's part in one round's sharded aggregation, a sans-IO state machine
  (seats, checks, the committee's signed hashes, recomputation, accusations).

Who sits on which committee is drawn with the other round roles (`node/rounds/orders.py`); the
arithmetic (shard payloads, Merkle commitments, per-shard aggregation) is `training/shards.py`.
"""
