"""locomesh.node: the daemon, on three floors; a floor imports only the floors below it
(`tests/test_import_floors.py` holds this).

- The core (modules at this level, and `rpc/`): the libp2p host and its TCP transport
  (`runtime`, `host`, `listen_port`, `addresses`, `connections`), what every service builds on
  (`service`, `streams`, `stream_pool`, `whole_writes`, `peers`, `peer_scores`, `bootstrap`,
  `ping`), what it counts and caps (`meter`, `bandwidth`, `rate_limit`, `metrics`), and the
  local RPC (`rpc/`). It imports no feature.
- The features, a room each: `rounds/` (the round protocol), `exchange/` (how a round's
  payloads travel: allgather or sharded), `transfer/` (checkpoints and the data plane),
  `replication/` (the run's CRDT), `runs/` (manifests, discovery, the directory of public runs),
  `datasets/`, `nat/` (reachability, relays, hole punching, port mapping), `dashboard/`,
  `doctor/`, `schedule`.
- The process: `daemon` (start and stop), `assembly` (which services, wired how), `config`,
  `datadir`, `files`, `logs`.

This package's `__init__` stays light (no libp2p import), so the CLI client can use `version()`
without paying for the network stack.
"""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed locomesh version ("0+unknown" when running from an uninstalled tree)."""
    try:
        return metadata.version("locomesh")
    except metadata.PackageNotFoundError:
        return "0+unknown"
