"""Runs a node knows: their signed manifests in the data dir, and public runs in the DHT.

Modules, one job each:

* `store`: the runs this node created, joined or saw, in its data dir;
* `registry`: `run create` / `run list` / `run info`, and publishing public runs in the DHT.
"""
