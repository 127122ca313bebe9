"""What the round protocol needs from training: the `RoundParticipant` contract.

`locomesh.node.rounds` drives one peer's share of a run through exactly the members listed
here and no others (tests/test_participant_contract.py holds the list to what node/rounds/
uses). Two classes implement it:

- `locomesh.training.participant.Participant`: the real DiLoCo participant (torch);
- `locomesh.netsim.sim_participant.SimParticipant`: training and aggregation as modelled
  virtual time, the state as opaque bytes (the network simulator's).

The round calls one member at a time (through its `compute`: a worker thread in the daemon) and
never reads a participant's state other than through these members. Both protocols are
`runtime_checkable`, so ``isinstance(x, RoundParticipant)`` checks that every member is there
(not their signatures: the test does that).

This module imports neither torch nor the participant module, so the node can import it at
start (the daemon loads torch on its first join only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .checkpoint_manifest import ManifestLimits

if TYPE_CHECKING:
    from .participant import Contribution, StateSnapshot
    from .shards import ShardedPayload, ShardLayout

PAYLOAD_TENSOR = "payload"  # a payload travels as a checkpoint of one uint8 tensor of its bytes, by this name


@dataclass(frozen=True)
class DataNeeds:
    """What a run's task needs from peers before it trains (node/datasets/ gets it): the dataset it
    trains on and the checkpoint of the weights round 0 starts from, by ID, with what that
    checkpoint may be (`init_limits`), and how many tokens a member reads a round (so how many
    of the dataset's shards a round assigns it). None and 0 where the task needs nothing."""

    dataset: bytes | None = None
    init: bytes | None = None
    init_limits: ManifestLimits | None = None
    tokens_per_round: int = 0


@runtime_checkable
class TrainingSettings(Protocol):
    """The run's settings the round reads (`training.run_settings.RoundSettings` has them all)."""

    @property
    def inner_steps(self) -> int: ...

    @property
    def delayed_updates(self) -> bool: ...

    @property
    def scoring(self) -> str:
        """The run's contribution scoring policy: "off" or "report" (`run_settings.SCORING_POLICIES`)."""
        ...

    @property
    def exchange(self) -> str:
        """How the run's payloads are exchanged: "auto", "allgather" or "sharded" (node/exchange/mode.py)."""
        ...

    @property
    def byzantine_fraction(self) -> float:
        """The Byzantine share the run's shard committees are sized for."""
        ...

    @property
    def recover_after(self) -> int:
        """Attempt deadlines a round may go uncertified before a member signs a recover (node/agreement/recovery.py)."""
        ...


@runtime_checkable
class OuterShape(Protocol):
    """What the round reads of the outer state: its size (reported in ``run.status``)."""

    @property
    def numel(self) -> int: ...


@runtime_checkable
class RoundParticipant(Protocol):
    """θ_r of one run and this peer's way of training on it, as the round protocol uses them.

    Errors the round relies on: `train` raises `TrainingDiverged` when there is nothing to send;
    `aggregate` raises a `ValueError` when no payload can be applied; `payload_limits` raises
    `ParticipantError` (a `ValueError`) for a payload size the run cannot have.

    In a sharded round (training/shards.py) `train(sharded=True)` gives a framed payload, one
    codec payload per shard of `shard_layout`; a committee member aggregates a shard
    (`aggregate_shard`), signs its `result_hash` and serves `result_to_bytes`; every peer applies
    the round's results (`apply_shards`), θ_r becoming θ_{r+1} as with `aggregate`. Shard indexes
    out of the layout, frames and results that do not fit raise `ValueError`s."""

    @property
    def settings(self) -> TrainingSettings: ...

    @property
    def outer(self) -> OuterShape: ...

    @property
    def device(self) -> str:
        """Where this peer's inner steps run, as its status shows it: "cpu", "cuda:0", or several
        devices of a data-parallel group."""
        ...

    def train(self, stop: Callable[[], bool] | None = None, start: Any = None, data: Any = None,
              sharded: bool = False) -> Contribution:
        """This round's contribution, from θ_r or from `start` (what `delayed_start` returned);
        `stop()` is asked between steps and may end training early. `data`: the tokens of the
        dataset shards the round assigned this peer, when the run has a dataset (`data_needs`).
        `sharded`: the payload framed one shard at a time (`shard_layout`)."""
        ...

    def data_needs(self) -> DataNeeds:
        """What the run's task needs from peers before it trains."""
        ...

    def attach_data(self, index: Any, held_out: Sequence[Any], init: Mapping[str, Any] | None) -> None:
        """Take what `data_needs` named, verified by the node: the dataset's index and its held-out
        shards' tokens (None and empty without a dataset), the initial weights' tensors (or None).
        Raises `ParticipantError` for what the run's model cannot use (a tokenizer larger than its
        vocabulary); called once, before the first round."""
        ...

    def export_files(self, tokenizer_json: bytes | None = None) -> dict[str, bytes]:
        """The current state's model as the files of a checkpoint directory other tools load (file
        name -> bytes); `ParticipantError` for a task with no such format."""
        ...

    def delayed_start(self, trained: Contribution) -> Any:
        """Where the next round's training starts while `trained`'s round is still exchanged
        (one-round-delayed updates); handed back to `train` as its `start`, opaque to the round."""
        ...

    def aggregate(self, payloads: Mapping[bytes, bytes]) -> object:
        """The outer step over the round's payloads by author key: θ_r becomes θ_{r+1}."""
        ...

    def shard_layout(self) -> ShardLayout:
        """The run's shards: how a payload and the aggregate are cut in a sharded round."""
        ...

    def sharded_payload(self, payload: bytes) -> ShardedPayload:
        """A framed payload's shards and their Merkle root; `CodecError` "bad-frame" if it is none."""
        ...

    def shard_limit(self, index: int) -> int:
        """The most bytes shard `index` of a payload can have."""
        ...

    def max_sharded_payload_size(self) -> int:
        """The most bytes a framed payload can have (a sharded commit's size bound)."""
        ...

    def aggregate_shard(self, index: int, shards: Mapping[bytes, bytes]) -> tuple[Any, list[bytes], dict[bytes, Any]]:
        """Shard `index` of round r + 1's aggregate from each author's shard: (values, accepted, rejected by author)."""
        ...

    def result_hash(self, index: int, values: Any) -> bytes:
        """What a committee member signs for `values` as shard `index` of the round being aggregated (r + 1)."""
        ...

    def result_size(self, index: int) -> int:
        """The exact bytes of shard `index`'s result (`result_to_bytes`)."""
        ...

    def result_from_bytes(self, index: int, data: bytes) -> Any:
        """Shard `index`'s result values from their bytes; `ValueError` for bytes no result has."""
        ...

    def result_to_bytes(self, values: Any) -> bytes:
        """A shard result's values as they travel and are served."""
        ...

    def apply_shards(self, results: Sequence[Any], accepted: Sequence[bytes], rejected: Mapping[bytes, Any]) -> object:
        """The step with every shard's result in layout order: θ_r becomes θ_{r+1}; `ValueError` if none accepted."""
        ...

    def scoring_base(self) -> Any:
        """The state before this round's `aggregate` (θ_r), kept for `score`; opaque to the round."""
        ...

    def score(self, base: Any, payloads: Mapping[bytes, Any], seed: int) -> dict[bytes, float]:
        """author -> the score of its payload applied alone to `base` (`scoring_base`), on batches
        drawn from `seed`: a float, not bit-exact across CPUs; −inf for a payload that does not
        decode. May run while `train` and `evaluate` run (it uses a model of its own)."""
        ...

    def state_hash(self) -> bytes:
        """The hash of the current state's checkpoint (what peers vote on), without writing it."""
        ...

    def snapshot(self) -> StateSnapshot:
        """The current state, to be stored later (it does not change when the next round trains)."""
        ...

    def adopt(self, tensors: Mapping[str, Any], round_number: int) -> None:
        """Take the tensors of a verified stored state (one that kept `state_limits`) as the shared
        state after round `round_number` (`node.transfer.store.load_state` reads them)."""
        ...

    def evaluation_due(self) -> bool:
        """Whether the run evaluates the current state."""
        ...

    def evaluate(self) -> dict[str, float | None]:
        """The current state's eval loss and the task's floor (None where unknown)."""
        ...

    def payload_limits(self, run: bytes, round_number: int, size: int, sharded: bool = False) -> ManifestLimits:
        """What the checkpoint of a payload of `size` bytes (framed if `sharded`) committed for `round_number` may be."""
        ...

    def state_limits(self, run: bytes, round_number: int | None = None) -> ManifestLimits:
        """What the checkpoint of a state of run `run` (of `round_number`, if given) may be."""
        ...

    def close(self) -> None:
        """Release what training holds outside this object (a data-parallel group's processes) once
        the participation is over, for any reason; idempotent. No member is called after it."""
        ...


# How a node makes its participant: (the run's manifest body, our public key) -> participant. The
# daemon's is `Participant.for_run` on the node's devices (its `device` and `local_workers`, bound by
# `node.rounds.service.RoundService`); the simulator's makes a `SimParticipant`. (A test adversary
# wraps what the factory made: `training.adversary`, bound in `node.assembly`.)
ParticipantFactory = Callable[[Mapping[str, Any], bytes], RoundParticipant]
