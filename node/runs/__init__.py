"""Runs a node knows: their signed manifests in the data dir, and public runs in the DHT.

Modules, one job each:

* `store`: the runs this node created, joined or saw, in its data dir;
* `registry`: `run create` / `run list` / `run info` / `run browse`, and publishing public runs in the DHT;
* `cards`: the cards of the public runs this node keeps, published in the DHT's directory;
* `directory`: browsing that directory without knowing any run ID.
"""
