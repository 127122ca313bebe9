"""Payload and state bombs (issue #18, finding 2): a peer that names more than a run allows.

A manifest is a few kilobytes whatever it claims: one that names one zero chunk many times, or a
state of terabytes, cost a node gigabytes of memory (a `MemoryError` that ended its participation,
or an OOM kill) when it was downloaded and loaded on trust. Now every size is checked against what
the run allows (its model's numel and codec) the moment it arrives: the commit's size before any
request, the manifest before any chunk is fetched (its provider struck), a state's header before
its buffer is allocated. Real libp2p nodes on loopback, a real participant and real files.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import trio
from multiaddr import Multiaddr

from locomesh.netsim.adversaries import install_zero_chunk_bomb
from locomesh.node.rounds import machine as rm
from locomesh.node.transfer.download import CheckpointRefused, DownloadProgress, download_checkpoint
from locomesh.node.transfer.service import CheckpointService
from locomesh.node.peer_scores import PeerScores
from locomesh.node.rounds.work import RoundWork
from locomesh.node.rounds.participation import RunParticipation
from locomesh.node.runtime import Node
from locomesh.node.transfer.store import load_checkpoint, load_state, manifest_path, write_checkpoint
from locomesh.training.checkpoint_manifest import LimitError
from locomesh.training.codec import encode
from locomesh.training.participant import Participant, ParticipantError

from .test_crdt_support import joined_replica, keys

LOOPBACK = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
MiB = 1024 * 1024
MEMBERS = keys(3)  # the run's creator is the victim; the second member is the attacker
ROUND = 1
TINY = {"d_model": 32, "n_layer": 1, "n_head": 2}  # 15,328 parameters: a payload of at most ~15.7 KB


def participant(task_config: dict = TINY) -> Participant:
    body = {"task": "synthetic-lm", "task_config": task_config, "seed": 3, "hparams": {"inner_steps": 2, "batch_size": 4}}
    return Participant.for_run(body, MEMBERS[0].public_key)


class Pair:
    """A victim node and an attacker node serving its store, connected on loopback."""

    def __init__(self, tmp_path: Path) -> None:
        self.victim_dir, self.attacker_dir = tmp_path / "victim", tmp_path / "attacker"
        self.attacker = Node.create(MEMBERS[1], listen_addrs=LOOPBACK, services=[CheckpointService(self.attacker_dir)])
        self.victim = Node.create(MEMBERS[0], listen_addrs=LOOPBACK)
        self.scores = PeerScores()

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.attacker.run)
        await nursery.start(self.victim.run)
        await self.victim.connect(self.attacker_address)

    @property
    def attacker_address(self) -> Multiaddr:
        return Multiaddr(self.attacker.listen_addresses()[0])

    def served(self, answer: str) -> float:
        return self.attacker.metrics["locomesh_checkpoint_served_total"].get(answer=answer)

    def victim_chunks(self) -> list[Path]:
        return sorted((self.victim_dir / "chunks").glob("*"))


async def fetch_through_the_participation(pair: Pair, payload_id: bytes, size: int) -> rm.Fetched:
    """What the victim's participation makes of the attacker's commit (`payload_id`, `size`)."""
    replica = joined_replica(MEMBERS)
    party = RunParticipation(pair.victim, None, replica, participant(), pair.victim_dir, pair.scores, timing=rm.Timing())
    with trio.fail_after(30):
        await party._fetch(RoundWork(ROUND, trio.current_time()), MEMBERS[1].public_key, payload_id, size)
    return party._events.receive_nowait()


async def test_a_payload_manifest_naming_one_zero_chunk_24_times_is_refused_before_any_chunk_is_fetched(tmp_path):
    """The issue's attack: 24 x one 64 MiB zero chunk (1.5 GiB of state for 1.7 KB of manifest),
    committed with a size a payload of the run can have. The participation refuses the manifest,
    fetches no chunk, strikes the attacker once (no retry) and gives the payload up at once."""
    pair = Pair(tmp_path)
    run = joined_replica(MEMBERS).run_id
    bomb = install_zero_chunk_bomb(pair.attacker_dir, run, ROUND, chunk_size=64 * MiB, copies=24)
    assert len(bomb.encode()) < 2048
    async with trio.open_nursery() as nursery:
        await pair.start(nursery)
        fetched = await fetch_through_the_participation(pair, bomb.id, participant().max_payload_size())
        nursery.cancel_scope.cancel()
    assert fetched.author == MEMBERS[1].public_key and not fetched.ok
    strikes = pair.scores.get(pair.attacker.peer_id)
    assert strikes.strikes == 1 and "max_raw_size" in strikes.last_strike
    assert pair.served("ok") == 1 and pair.served("chunk-ok") == 0  # the manifest, once; no chunk
    assert pair.victim_chunks() == [] and not manifest_path(pair.victim_dir, bomb.id).exists()


async def test_a_commit_naming_more_bytes_than_a_payload_of_the_run_can_have_is_not_fetched(tmp_path):
    """A commit's size bounds what its payload may claim: one over the run's bound is a bad commit,
    and nothing of it is asked for (here the payload behind it is even a valid small one)."""
    pair = Pair(tmp_path)
    run = joined_replica(MEMBERS).run_id
    payload = encode(np.ones(participant().outer.numel, dtype=np.float32))
    served = write_checkpoint(pair.attacker_dir, {"payload": np.frombuffer(payload, dtype=np.uint8)},
                              {"round": ROUND, "run": run, "kind": "payload"})
    async with trio.open_nursery() as nursery:
        await pair.start(nursery)
        fetched = await fetch_through_the_participation(pair, served.id, participant().max_payload_size() + 1)
        nursery.cancel_scope.cancel()
    assert not fetched.ok
    assert pair.served("ok") == 0 and pair.served("chunk-ok") == 0  # not even the manifest was asked for
    assert pair.victim_chunks() == []


BYTES_PER_VALUE = {"int8": 1, "int4": 0.5, "fp32": 4}


@pytest.mark.parametrize("codec", sorted(BYTES_PER_VALUE))
def test_what_a_payload_of_the_run_can_be_holds_its_worst_case_and_no_more(tmp_path, codec):
    """The bound is the codec's worst case (bytes zstd cannot shrink), not a guess: the payload of a
    random vector fits it, and it is over the codes' own size by little more than zstd's margin. A
    payload written as the participation writes one passes its limits and loads."""
    config = {"task": "synthetic-lm", "task_config": TINY, "seed": 3,
              "hparams": {"inner_steps": 2, "batch_size": 4, "codec": codec}}
    peer = Participant.for_run(config, MEMBERS[0].public_key)
    noise = np.random.default_rng(5).uniform(-1, 1, peer.outer.numel).astype(np.float32)  # codes zstd cannot shrink
    payload = peer.encoder.encode(noise)
    bound = peer.max_payload_size()
    assert len(payload) <= bound <= BYTES_PER_VALUE[codec] * peer.outer.numel * 1.01 + 512
    limits = peer.payload_limits(b"\x07" * 32, ROUND, len(payload))
    written = write_checkpoint(tmp_path, {"payload": np.frombuffer(payload, dtype=np.uint8)},
                               {"round": ROUND, "run": b"\x07" * 32, "kind": "payload"})
    assert load_checkpoint(tmp_path, written.id, limits)[0]["payload"].numpy().tobytes() == payload
    with pytest.raises(ParticipantError, match="a payload of this run has 1 to"):
        peer.payload_limits(b"\x07" * 32, ROUND, bound + 1)


async def test_a_state_manifest_of_4_tib_is_refused_at_sync_before_any_chunk_is_fetched(tmp_path):
    """A syncing peer downloads a state with the run's state limits (the model's layout gives its
    exact size): a manifest claiming 65,536 x 64 MiB, which raised MemoryError in the loader, is
    refused as it arrives, and its provider struck; loaded from the store, it is refused unallocated."""
    pair = Pair(tmp_path)
    run = joined_replica(MEMBERS).run_id
    bomb = install_zero_chunk_bomb(pair.attacker_dir, run, ROUND, chunk_size=64 * MiB, copies=65536, metadata={})
    limits = participant().state_limits(run, ROUND)
    async with trio.open_nursery() as nursery:
        await pair.start(nursery)
        with trio.fail_after(30), pytest.raises(CheckpointRefused) as refused:
            await download_checkpoint(pair.victim, pair.victim_dir, bomb.id, [str(pair.attacker_address)],
                                      scores=pair.scores, progress=DownloadProgress(bomb.id), limits=limits)
        nursery.cancel_scope.cancel()
    assert refused.value.limit == "max_raw_size"
    assert pair.scores.get(pair.attacker.peer_id).strikes == 1
    assert pair.served("chunk-ok") == 0 and pair.victim_chunks() == []
    with pytest.raises(LimitError) as error:
        load_checkpoint(pair.attacker_dir, bomb.id, limits)
    assert error.value.limit == "max_raw_size"


def test_a_state_whose_tensors_do_not_fit_the_model_is_refused_before_it_is_allocated(tmp_path):
    """A state of the right run and no larger than the model's, whose header names other tensors
    (here `previous` as int32): the participant refuses it from the header, read from the first
    chunk, before the state's buffer exists."""
    peer = participant({"d_model": 192, "n_layer": 4, "n_head": 4})  # 1.8M parameters: a state of 6 chunks
    numel, run = peer.outer.numel, b"\x07" * 32
    tensors = {"theta": np.zeros(numel, np.float32), "momentum": np.zeros(numel, np.float32),
               "previous": np.zeros(numel, np.int32)}
    manifest = write_checkpoint(tmp_path, tensors, {"round": ROUND, "run": run})
    assert manifest.raw_size == peer.state_raw_size() and len(manifest.chunks) == 6
    tracemalloc.start()
    try:
        with pytest.raises(LimitError) as error:
            load_state(tmp_path, manifest.id, peer, run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.value.limit == "tensors" and "previous" in str(error.value)
    assert peak < manifest.raw_size / 2  # a chunk or two were inflated; the state never was
    assert peer.round == 0  # nothing adopted
