"""The exchange: how a round's payloads travel and become the round's aggregate.

A round's participation (`node/rounds/participation.py`) drives one seam, `seam.RoundExchange`:
store our payload, check the others', gather what the outer step needs, apply it. Two exchanges
implement it, one file each:

* `allgather`: every member fetches every payload (content-addressed checkpoints, multi-source)
  and aggregates the whole vector;
* `sharded`: each shard of the aggregate is computed by a committee and checked by recomputation,
  so that what a member downloads and computes stays flat as the run grows. Beside it:
  `sharded_machine` (one member's part in a round, a sans-IO state machine), `shard_transfer`
  (shards and results on libp2p streams) and `committees` (committee sizes and draws);
* `mode`: which of the two a round uses (the run's `exchange` setting: allgather, sharded, auto).
"""
