"""Adversaries for the `train` scenario: run members (and strangers) that attack the run through
the daemon's own services. Each is the real service with one behaviour turned hostile, so what
the honest nodes face is exactly what a modified daemon could send. The simulator's only; the
daemon never imports this.

- `WithholdingCheckpointService`: commits its payloads like anyone and stays connected, but from
  round WITHHOLD_FROM on never serves a payload (its own or one it fetched); as the round's first
  proposer its set names its own payload, which nobody can fetch (issue #18, findings 1 and 7);
- intruders, keys that join and write hostile ops but take no honest part in the rounds:
  `attest_bogus_checkpoints` (Sybil attesters, finding 3), `commit_bombs` (payload bombs,
  finding 2) and `spam_ops` (ops past every cap, gossiped as fast as GossipSub takes them,
  finding 6).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

import trio

from locomesh.node.transfer import wire as wire
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.transfer.store import install_manifest, store_chunk
from locomesh.crdt import Replica
from locomesh.crdt.ops import content_id, op_content, seal_ops
from locomesh.node.replication.service import CrdtService
from locomesh.protocol import Identity, compress
from locomesh.protocol.kinds import MAX_SEAL_OPS
from locomesh.node.exchange.shard_transfer import INPUT, ShardRequest, ShardService
from locomesh.training.checkpoint_manifest import CheckpointError, ChunkRef, Manifest

from .sim_participant import SimParticipant

WITHHOLD_FROM = 2  # a withholder serves round 1 honestly, so that its key earns a say


class WithholdingCheckpointService(CheckpointService):
    """A checkpoint service that serves round payloads honestly up to round WITHHOLD_FROM - 1 (so
    its key earns a say, and a turn as proposer) and answers not-found for every payload after."""

    def _read(self, request: wire.Request) -> bytes | None:
        try:
            manifest = self._manifest(request.checkpoint_id)
        except (OSError, CheckpointError):
            return None
        if manifest.metadata.get("kind") == "payload" and manifest.round >= WITHHOLD_FROM:
            return None
        return super()._read(request)


class WithholdingShardService(ShardService):
    """The same withholder's shard service (sharded exchange): it answers missing for every shard of
    its own payloads from round WITHHOLD_FROM on; it serves what it fetched of others' as usual."""

    def _lookup(self, request: ShardRequest) -> tuple[bytes | None, list[bytes]]:
        if request.what == INPUT and request.author == self.node.identity.public_key and request.round >= WITHHOLD_FROM:
            return None, []
        return super()._lookup(request)


class LyingSimParticipant(SimParticipant):
    """A member whose every shard aggregate is off by one value (sharded exchange): on a committee
    it signs, and serves, a wrong result. It trains and commits honestly."""

    def aggregate_shard(self, index: int, shards: Mapping[bytes, bytes]) -> tuple[np.ndarray, list[bytes], dict]:
        values, accepted, rejected = super().aggregate_shard(index, shards)
        wrong = values.copy()
        wrong[0] = np.float32(wrong[0]) + np.float32(1.0)
        return wrong, accepted, rejected


# --- intruders: keys that join and write hostile ops, with no honest part in the rounds -----------

WATCH_SECONDS = 0.25  # how often an intruder looks at the run's state


async def attest_bogus_checkpoints(crdt: CrdtService, run_id: bytes, *, until_round: int) -> None:
    """A Sybil attester (issue #18, finding 3): join, then attest a checkpoint nobody stored for
    every round certified, so that a syncing peer would download it if attestations were free."""
    replica = crdt.replicas[run_id]
    crdt.write(run_id, "join", round=replica.state.round + 2)
    attested = replica.state.round
    while attested < until_round:
        await trio.sleep(WATCH_SECONDS)
        for round_number in range(attested + 1, replica.state.round + 1):
            bogus = hashlib.sha256(b"bogus checkpoint" + round_number.to_bytes(8, "big")).digest()
            crdt.write(run_id, "attest", round=round_number, id=bogus, size=1024)
        attested = max(attested, replica.state.round)


async def commit_bombs(crdt: CrdtService, run_id: bytes, me: bytes, directory: Path, *, payload_bytes: int,
                       until_round: int) -> None:
    """A bomber (issue #18, finding 2): join, then in every round commit a payload whose manifest
    (a few kilobytes, served by this node's checkpoint service) names one zero chunk of 64 MiB
    BOMB_COPIES times, so that a node that trusted it would allocate gigabytes."""
    replica = crdt.replicas[run_id]
    crdt.write(run_id, "join", round=replica.state.round + 2)
    committed = replica.state.round + 1
    while committed <= until_round:
        await trio.sleep(WATCH_SECONDS)
        round_number = replica.state.round + 1
        if round_number > committed and replica.commits(round_number) and me in replica.contributors(round_number):
            manifest = install_zero_chunk_bomb(directory, run_id, round_number)
            crdt.write(run_id, "commit", round=round_number, hash=manifest.id, size=payload_bytes)
            committed = round_number


BOMB_CHUNK = 64 * 1024 * 1024
BOMB_COPIES = 24


def install_zero_chunk_bomb(directory: Path, run_id: bytes, round_number: int, *, chunk_size: int = BOMB_CHUNK,
                            copies: int = BOMB_COPIES, metadata: dict | None = None) -> Manifest:
    """Install in the store at `directory` a checkpoint whose manifest names one zero chunk
    `copies` times: a few kilobytes on the wire for `chunk_size x copies` bytes of claimed state."""
    frame = compress(bytes(chunk_size), level=1)
    digest = hashlib.sha256(frame).digest()
    manifest = Manifest.build(
        raw_size=chunk_size * copies, chunk_size=chunk_size, chunks=[ChunkRef(digest, len(frame), chunk_size)] * copies,
        round=round_number, run=run_id, state_hash=bytes(32),
        metadata=metadata if metadata is not None else {"kind": "payload"},
    )
    store_chunk(directory, manifest, 0, frame)
    install_manifest(directory, manifest)
    return manifest


SPAM_OPS = 512  # ops a spammer forges every round
SPAM_BATCH = 128  # ops per gossip message (GossipSub drops messages over 1 MiB)


async def spam_ops(crdt: CrdtService, run_id: bytes, identity: Identity, *, until_round: int) -> None:
    """An op spammer (issue #18, finding 6): join, then every round forge SPAM_OPS ops past the
    run's limits (attestations past the cap, proposals for far rounds) and gossip them, built
    without the replica's own checks (`write` would refuse them)."""
    replica = crdt.replicas[run_id]
    crdt.write(run_id, "join", round=replica.state.round + 2)
    spammed = replica.state.round
    while spammed < until_round:
        await trio.sleep(WATCH_SECONDS)
        round_number = replica.state.round + 1
        if round_number <= spammed:
            continue
        specs = [("attest", {"round": round_number, "id": hashlib.sha256(i.to_bytes(4, "big")).digest(), "size": i})
                 for i in range(SPAM_OPS // 2)]
        specs += [("prevote", {"round": round_number + 100 + i, "epoch": 0, "attempt": 0, "value": b""})
                  for i in range(SPAM_OPS // 2)]
        ops = forged_chain(replica, identity, specs)
        for start in range(0, len(ops), SPAM_BATCH):
            await crdt._publish(run_id, ops[start:start + SPAM_BATCH])
        spammed = round_number


def forged_chain(replica: Replica, author: Identity, specs: list[tuple[str, dict]], *,
                 parents: list[bytes] | None = None) -> list[bytes]:
    """Ops by `author`, each on top of the one before (the first on `parents`, default: the
    replica's heads and the author's newest op), sealed MAX_SEAL_OPS at a time: what a spammer
    sends, built without the replica's own checks."""
    own = [i for i, row in replica.facts.ops.items() if row[0] == author.public_key]
    newest = max(own, key=lambda i: replica.facts.ops[i][1], default=None)
    if parents is None:
        parents = sorted(set(replica.heads + ([newest] if newest is not None else [])))
    seq = 1 + max((replica.facts.ops[p][1] for p in parents if replica.facts.ops[p][0] == author.public_key), default=0)
    contents = []
    for number, (kind, fields) in enumerate(specs, start=seq):
        contents.append(op_content(author.public_key, replica.run_id, f"crdt.{kind}", parents, number, **fields))
        parents = [content_id(contents[-1])]
    return [data for start in range(0, len(contents), MAX_SEAL_OPS)
            for data in seal_ops(author, replica.run_id, contents[start:start + MAX_SEAL_OPS])]
