"""Checkpoints on disk and between peers: the store, serving, multi-source downloads, the sealed data plane.

Modules, one job each:

* `wire`: the request/answer protocol of `/locomesh/ckpt/1` (manifest and chunk requests);
* `store`: the local checkpoint store, content-addressed chunks and manifests in files (what
  a checkpoint is, and its bytes, is training's: `state_format`, `state_chunks`, `checkpoint_manifest`);
* `held`: checkpoints kept in memory instead of the store (a round's fetched payloads);
* `service`: `CheckpointService`, which serves what is held and the local store, and runs downloads for RPC;
* `download`: one multi-source download, every chunk verified, size limits checked first;
* `sinks`: where a download puts what it fetched: the store, or memory (`held`);
* `schedule`: which chunk to ask which provider for (sans-IO);
* `dataplane`: a plain TCP listener beside libp2p whose every byte is sealed;
* `dataplane_crypto`: its key agreement and frame sealing (AES-GCM);
* `dataplane_sessions`: its caps on what any peer or stranger can make it hold (sans-IO).
"""
