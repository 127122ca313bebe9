"""Replicating each run's state (the CRDT of `locomesh.crdt`) over libp2p.

Modules, one job each:

* `service`: `CrdtService`: GossipSub for new ops, anti-entropy for the rest, per-peer budgets;
* `anti_entropy`: when to pull from whom (sans-IO schedule);
* `op_log`: every applied op of a run on disk, our own synced before they are published.
"""
