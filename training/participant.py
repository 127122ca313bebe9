"""One peer's share of a DiLoCo run: its inner worker, its codec, and the shared outer state.

The round protocol (`locomesh.node.rounds.machine`) decides *when*; this module does the work, with
no I/O:

- `train()`: H inner AdamW steps from θ_r on this peer's shard, the pseudo-gradient encoded
  (int8/4-bit, error feedback, zstd) into the payload it commits to;
- with one-round-delayed outer updates (`delayed_updates`), the inner steps of round r+1 start
  as soon as round r's payload is out, while round r is still exchanged and aggregated, from
  `delayed_start()`: the outer step taken on θ_{r-1} with this peer's own Δ_r standing in for the
  aggregate it has not seen yet (an "eager" update: this peer's guess at θ_r). The shared outer
  step is unchanged: round r+1's Δ lands on the real θ_r, one round late. This cost little
  eval loss against no delay, and less than starting from θ_{r-1} − Δ_r, which lagged far
  more in the early rounds (docs/measurements.md);
- `aggregate(payloads)`: decode, validate, robust-aggregate and take the outer Nesterov step
  (`OuterStep`, bit-exact on every CPU), giving θ_{r+1};
- in a sharded round (training/shards.py), `train(sharded=True)` frames one payload per shard,
  a committee member aggregates a shard (`aggregate_shard`) and signs its `result_hash`, and every
  peer applies the round's shard results (`apply_shards`): the same θ_{r+1} as if it had computed
  every shard itself. `self.round` is the state's round r; the round being aggregated is r + 1;
- `payload_limits(...)` / `state_limits(...)`: what a payload or a state of this run can be at
  most (from the model's size and the codec), so a peer refuses a commit, a manifest or a
  state's header that claims more before it fetches or allocates anything for it;
- `snapshot()` / `adopt(tensors, round)`: the shared state handed out and taken in, as tensors
  (the node's store writes and reads them as checkpoints: `StateSnapshot.chunks`). The shared
  state is θ, the outer momentum buffer and the previous aggregate (CenteredClip centres on it):
  everything the next outer step reads, so two peers with the same checkpoint compute the same
  next round. Its `state_hash` (SHA-256 of the raw tensors, independent of the zstd build) is
  what peers vote on and a round certificate names.

The inner AdamW state and the codec's error-feedback residual stay private to the peer; they
change what it contributes, never what the outer step computes from the contributions.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import participant_shards as sharding
from .checkpoint_manifest import Manifest, ManifestLimits, TensorSpec
from .contract import PAYLOAD_TENSOR, DataNeeds
from .codec import CodecError, Encoder, decode, max_payload_size
from .flat import flatten, unflatten_into
from .devices import describe
from .distributed import inner_worker
from .inner import InnerConfig
from .memory import release_free_memory
from .outer import OuterResult, OuterStep
from .shards import ShardedPayload, ShardLayout, aggregate_shard, max_framed_size, shard_limits, shard_result_hash, unframe
from .run_settings import ParticipantError, RoundSettings, TrainingDiverged, check_run_settings
from .state_chunks import FAST_LEVEL, StateChunks, checkpoint_limits, checkpoint_manifest, chunk_state, state_digest
from .state_format import layout_raw_size
from .tasks import Task

STATE_TENSORS = ("theta", "momentum", "previous")
INIT_KIND = "init"  # the metadata `kind` of the checkpoint of a run's initial weights


@dataclass(frozen=True)
class Contribution:
    """What `train` produced: the payload to commit to, and how the inner steps went."""

    payload: bytes
    steps: int
    train_loss: float
    seconds: float
    delta: np.ndarray | None = None  # the pseudo-gradient before encoding (what `delayed_start` needs)


@dataclass(frozen=True)
class StateSnapshot:
    """A run state as of one round, to be stored (by the node) or attested."""

    tensors: Mapping[str, np.ndarray]
    round: int

    def chunks(self, run: bytes) -> StateChunks:
        """The chunks of its checkpoint as the state of round `round` of run `run` (uncompressed:
        see FAST_LEVEL), for a store to write."""
        return chunk_state(self.tensors, self._metadata(run), level=FAST_LEVEL)

    def manifest(self, run: bytes) -> Manifest:
        """The manifest of those chunks, without storing anything (to attest a state others store)."""
        return checkpoint_manifest(self.tensors, self._metadata(run), level=FAST_LEVEL)

    def _metadata(self, run: bytes) -> dict[str, Any]:
        return {"round": self.round, "run": run}


def payload_limits(run: bytes, round_number: int, size: int, max_size: int) -> ManifestLimits:
    """The limits of the checkpoint that carries a payload of `size` bytes committed for round
    `round_number` of run `run` (one uint8 tensor, metadata ``kind: payload``, as the participation
    stores one). `ParticipantError` if `size` is not one a payload of the run can have (1 to
    `max_size` bytes): the commit is bad, there is nothing to fetch."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= max_size:
        raise ParticipantError(f"a commit names a payload of {size!r:.40} bytes; a payload of this run has 1 to {max_size}")
    return checkpoint_limits(
        {PAYLOAD_TENSOR: TensorSpec("uint8", (size,))}, {"run": run, "round": round_number, "kind": "payload"},
    )


def peer_index(key: bytes) -> int:
    """The data shard of the peer with public key `key`: stable, and spread over 2**31 shards."""
    return int.from_bytes(hashlib.sha256(b"locomesh shard" + key).digest()[:4], "big") >> 1


class Participant:
    """θ_r and the outer optimizer of one run, plus this peer's inner worker. Not thread-safe:
    the round protocol calls one method at a time."""

    def __init__(
        self,
        task: Task,
        settings: RoundSettings,
        *,
        model_seed: int,
        run_seed: int,
        key: bytes,
        device: str = "cpu",
        local_workers: int = 1,
        train_threads: int = 0,
    ) -> None:
        """`device`, `local_workers`: where the inner steps run (`devices.local_devices`: one device,
        or a data-parallel group of several); `DeviceError` if this machine lacks them.
        `train_threads`: torch's CPU threads for the inner steps (0: torch's default; the ranks of a
        data-parallel group on the CPU share the cores out themselves)."""
        self.task = task
        self.train_threads = train_threads
        self.settings = settings
        self.worker = inner_worker(
            task, model_seed, run_seed, peer_index(key),
            InnerConfig(lr=settings.inner_lr, batch_size=settings.batch_size),
            device=device, local_workers=local_workers,
        )
        self.device = describe(self.worker.devices)  # for the node's status
        self._eval_model: Any = None  # made on the first evaluation (`evaluate`)
        self._score_model: Any = None  # made on the first `score`: it runs beside `train` and `evaluate`
        self.key = key
        self.encoder = Encoder(settings.codec, error_feedback=settings.codec != "fp32")
        self.outer = OuterStep(flatten(self.worker.model), settings.outer_config())
        self.round = 0  # θ is the state after this many certified rounds
        self._shard_layout: ShardLayout | None = None  # made on first use: θ's size never changes in a run
        self._limits: list[int] | None = None  # each shard's most bytes, with the layout

    @classmethod
    def for_run(
        cls, genesis_body: Mapping[str, Any], key: bytes, *,
        device: str = "cpu", local_workers: int = 1, train_threads: int = 0,
    ) -> Participant:
        """A participant for the run whose manifest body is `genesis_body`, at round 0, training on
        `device` with `local_workers` (see `__init__`); `RunSettingsError` (a `ParticipantError`) if
        its settings or task do not pass `check_run_settings`, `DeviceError` if this machine lacks
        the devices, `DataParallelError` if a data-parallel group does not start."""
        settings, task = check_run_settings(genesis_body["task"], genesis_body["task_config"], genesis_body["hparams"])
        seed = genesis_body["seed"]
        return cls(task, settings, model_seed=seed, run_seed=seed, key=key,
                   device=device, local_workers=local_workers, train_threads=train_threads)

    def close(self) -> None:
        """Stop the processes of a data-parallel worker (nothing to do for one on a single device);
        idempotent. The participant trains no more after it."""
        self.worker.close()

    # --- one round ------------------------------------------------------------------------------

    def train(
        self, stop: Callable[[], bool] | None = None, start: np.ndarray | None = None,
        data: Sequence[np.ndarray] | None = None, sharded: bool = False,
    ) -> Contribution:
        """H inner steps from `start` (default θ_r); the encoded pseudo-gradient. `stop` is asked
        after each step: once it says yes, training ends early (the result is then one the caller
        discards). `data`: the tokens of the dataset
        shards the round assigned this peer (a run with a dataset trains on nothing else).
        `sharded`: the payload is one per shard of `shard_layout`, framed (`frame_shards`).

        Reads θ only when no `start` is given, so with a `start` it may run while `aggregate`
        computes the next θ. Raises `TrainingDiverged` if the loss or Δ is not finite (nothing
        to send: a non-finite payload is refused by every peer)."""
        if getattr(self.task, "dataset_id", None) is not None and data is None:
            raise ParticipantError("this run trains on a dataset: a round needs the shards it assigned this peer")
        batches = None if data is None else self.task.round_batches(data, self.settings.batch_size)
        self._limit_threads()
        result = self.worker.run_round(self.outer.theta if start is None else start,
                                       self.settings.inner_steps, stop=stop, batches=batches)
        self._check_finite(result.mean_loss, result.steps, result.delta)
        if sharded:
            payload = sharding.encode_framed(self.encoder, result.delta, self.shard_layout())
        else:
            payload = self.encoder.encode(result.delta)
        return Contribution(payload, result.steps, result.mean_loss, result.seconds, result.delta)

    def _limit_threads(self) -> None:
        """Hold torch to `train_threads` in the thread that trains: with OpenMP the setting is the
        calling thread's, and the node trains in whichever worker thread it is given."""
        if self.train_threads:
            import torch

            torch.set_num_threads(self.train_threads)

    def _check_finite(self, loss: float, steps: int, delta: np.ndarray) -> None:
        finite_delta = bool(np.isfinite(delta).all())
        if math.isfinite(loss) and finite_delta:
            return
        what = f"the inner loss is {loss:g} after {steps} steps"
        if not finite_delta:
            what += ", the pseudo-gradient not finite"
        raise TrainingDiverged(f"training diverged: {what} "
                               f"(outer_lr {self.settings.outer_lr:g}, inner_lr {self.settings.inner_lr:g})")

    def data_needs(self) -> DataNeeds:
        """The task's dataset and initial weights by ID (None for a task that names neither), and
        the tokens this peer reads a round."""
        dataset, init = getattr(self.task, "dataset_id", None), getattr(self.task, "init_id", None)
        if dataset is None and init is None:
            return DataNeeds()
        settings = self.settings
        return DataNeeds(dataset=dataset, init=init, init_limits=None if init is None else self.init_limits(),
                         tokens_per_round=self.task.tokens_per_round(settings.inner_steps, settings.batch_size))

    def init_limits(self) -> ManifestLimits:
        """What the checkpoint of this run's initial weights may be: the model's parameters by name
        and shape (`task.weight_layout`), float32, exactly (the `init` checkpoint `run create --init` writes)."""
        layout = {name: TensorSpec("float32", shape) for name, shape in self.task.weight_layout().items()}
        return checkpoint_limits(layout, {"run": b"", "round": 0, "kind": INIT_KIND})

    def attach_data(self, index: Any, held_out: Sequence[np.ndarray], init: Mapping[str, Any] | None) -> None:
        """Attach the dataset (its index, its held-out shards' tokens) to the task and, at round 0,
        start from the initial weights `init` (a verified `init` checkpoint's tensors); a
        `ParticipantError` for what the model cannot use."""
        from .tasks import TaskError  # torch: the task is built already

        try:
            if index is not None:
                self.task.attach_dataset(index, held_out)
        except TaskError as error:
            raise ParticipantError(str(error)) from None
        if init is not None and self.round == 0:
            model = self.task.build_model(0)
            try:
                result = model.load_state_dict(dict(init), strict=False)  # not strict: a tied head is not stored
            except RuntimeError as error:
                raise ParticipantError(f"the initial weights do not fit the model: {error}") from None
            unfilled = set(result.missing_keys) & set(self.task.weight_layout())
            if unfilled or result.unexpected_keys:
                raise ParticipantError(f"the initial weights do not fit the model: missing {sorted(unfilled)[:3]}, "
                                       f"unknown {sorted(result.unexpected_keys)[:3]}")
            self.outer = OuterStep(flatten(model), self.settings.outer_config())

    def export_files(self, tokenizer_json: bytes | None = None) -> dict[str, bytes]:
        """The current state's model as the files of a checkpoint directory other tools load (the
        llama task's: transformers' Llama), with the dataset's tokenizer when given. `ParticipantError`
        for a task with no such format."""
        export = getattr(self.task, "export_files", None)
        if export is None:
            raise ParticipantError(f"the {self.task.name} task has no checkpoint format to export to")
        model = self.task.build_model(0)
        unflatten_into(model, self.outer.theta)
        return export(model, tokenizer_json)

    def delayed_start(self, trained: Contribution) -> np.ndarray:
        """Where the next round's inner steps start while `trained`'s round is still exchanged: the
        outer step on θ now (the state that round's aggregate will land on) with `trained`'s Δ in
        place of the aggregate. Call it before that round's `aggregate`."""
        assert trained.delta is not None, "a contribution made by `train`"
        return self.outer.preview(trained.delta)

    def aggregate(self, payloads: Mapping[bytes, bytes]) -> OuterResult:
        """The outer step over this round's payloads by author key: θ_{r+1}. Raises like `OuterStep.step`.
        The round's temporaries are freed by then, and their memory goes back to the system
        (`release_free_memory`)."""
        try:
            result = self.outer.step(payloads, bucket_seed=self.round.to_bytes(8, "big"))
        finally:
            release_free_memory()
        self.round += 1
        return result

    # --- sharded exchange (training/shards.py, training/participant_shards.py) ---------------------

    def shard_layout(self) -> ShardLayout:
        """θ cut into the run's shards (`shard_values` values, rounded up to the codec's blocks)."""
        if self._shard_layout is None:
            self._shard_layout = sharding.layout_of(self.outer, self.settings.shard_values)
        return self._shard_layout

    def sharded_payload(self, payload: bytes) -> ShardedPayload:
        """The shards of a framed payload and their Merkle root; `CodecError` "bad-frame" for a
        frame that is not one of `shard_layout`'s shards within their limits."""
        return ShardedPayload(unframe(payload, self._shard_limits()))

    def shard_limit(self, index: int) -> int:
        """The most bytes shard `index`'s payload can have (`ValueError` for no such shard)."""
        return self._shard_limits()[sharding.checked_index(self.shard_layout(), index)]

    def max_sharded_payload_size(self) -> int:
        """The most bytes a framed payload of this run can have (every shard at its limit)."""
        return max_framed_size(self._shard_limits())

    def _shard_limits(self) -> list[int]:
        if self._limits is None:
            self._limits = shard_limits(self.shard_layout(), self.settings.codec)
        return self._limits

    def aggregate_shard(self, index: int,
                        shards: Mapping[bytes, bytes]) -> tuple[np.ndarray, list[bytes], dict[bytes, CodecError]]:
        """Shard `index` of round r + 1's aggregate from every author's payload of it (by author
        key), as `aggregate` would compute that range: (values, accepted, rejected). The state is
        not touched; raises like `OuterStep.step` (`EmptyRoundError` with no valid payload)."""
        layout = self.shard_layout()
        return aggregate_shard(self.outer, layout, sharding.checked_index(layout, index), shards,
                               bucket_seed=self.round.to_bytes(8, "big"))

    def result_hash(self, index: int, values: np.ndarray) -> bytes:
        """What a member signs for `values` as shard `index` of round r + 1 (the round being aggregated)."""
        return shard_result_hash(self.round + 1, index, values)

    def result_size(self, index: int) -> int:
        """The bytes of shard `index`'s result: four a value."""
        return 4 * self.shard_layout().size(sharding.checked_index(self.shard_layout(), index))

    def result_from_bytes(self, index: int, data: bytes) -> np.ndarray:
        """Shard `index`'s values from `result_to_bytes`'s bytes; `ValueError` unless exactly its size and finite."""
        return sharding.result_from_bytes(self.shard_layout(), index, data)

    def result_to_bytes(self, values: np.ndarray) -> bytes:
        """A shard result's values as they travel: little-endian float32."""
        return sharding.result_to_bytes(values)

    def apply_shards(self, results: Sequence[np.ndarray], accepted: Sequence[bytes],
                     rejected: Mapping[bytes, CodecError]) -> OuterResult:
        """The outer step with every shard's result (in layout order) as the aggregate: θ_{r+1}.
        `EmptyRoundError` if nobody was accepted, `ValueError` for results that do not fit; the
        state is unchanged when it raises. Frees memory as `aggregate` does."""
        try:
            result = sharding.apply_results(self.outer, self.shard_layout(), results, accepted, rejected)
        finally:
            release_free_memory()
        self.round += 1
        return result

    def evaluation_due(self) -> bool:
        """Is the state of this round one the run evaluates (`eval_every`)?"""
        every = self.settings.eval_every
        return every > 0 and self.round % every == 0

    def evaluate(self) -> dict[str, float | None]:
        """Eval loss of θ_r on the task's held-out data, with the task's floor (None if unknown).
        Uses a model of its own, so it may run while `train` runs."""
        if self._eval_model is None:  # its own copy of the model: with delayed updates, θ_r is evaluated while round r+2 trains
            self._eval_model = copy.deepcopy(self.worker.model)
        unflatten_into(self._eval_model, self.outer.theta)
        return self.task.evaluate(self._eval_model)

    # --- contribution scores (training/scoring.py; the daemon's side: node/rounds/scoring.py) -------------

    def scoring_base(self) -> np.ndarray:
        """θ now, before this round's `aggregate`, for `score` once the round is certified (the
        outer step replaces θ and never writes into it, so this array stays θ_r)."""
        return self.outer.theta

    def score(self, base: np.ndarray, payloads: Mapping[bytes, Any], seed: int) -> dict[bytes, float]:
        """author -> the score of its payload applied alone to `base` (`scoring_base`), on the
        run's `scoring_batches` batches drawn from `seed`: L(base) − L(base − Δ). A payload that
        does not decode scores −inf. Decodes one payload at a time, in a model of its own, so it
        may run while `train` or `evaluate` run."""
        if self._score_model is None:
            self._score_model = copy.deepcopy(self.worker.model)
        from .scoring import scored  # torch: only where scores are measured

        config, numel = self.outer.config, self.outer.numel
        block = None if config.codec == "fp32" else config.block_size
        results: dict[bytes, float] = {}

        def deltas():  # one decoded Δ at a time: n of them at once would cost n models' memory
            for author in sorted(payloads):
                try:
                    delta = decode(bytes(payloads[author]), numel, modes=(config.codec,), block_size=block)
                except ValueError:
                    delta = None
                if delta is None or not np.isfinite(delta).all():
                    results[author] = -math.inf
                else:
                    yield author, delta

        results.update(scored(self.task, self._score_model, base, deltas(), seed=seed,
                              batches=self.settings.scoring_batches, batch_size=self.settings.scoring_batch_size))
        return results

    # --- what a payload and a state of this run can be ---------------------------------------------

    def max_payload_size(self) -> int:
        """The most bytes a payload of this run can have: its codec's worst case for the model's size."""
        return max_payload_size(self.settings.codec, self.outer.numel, self.outer.config.block_size)

    def payload_limits(self, run: bytes, round_number: int, size: int, sharded: bool = False) -> ManifestLimits:
        """What the checkpoint of a payload of `size` bytes committed for round `round_number` may be
        (`payload_limits`; `sharded`: a framed one); `ParticipantError` for a size no such payload has."""
        return payload_limits(run, round_number, size,
                              self.max_sharded_payload_size() if sharded else self.max_payload_size())

    def state_layout(self) -> dict[str, TensorSpec]:
        """The tensors of a state of this run: θ and momentum, and (after a round) the previous aggregate."""
        numel = self.outer.numel
        return {name: TensorSpec("float32", (numel,), required=name != "previous") for name in STATE_TENSORS}

    def state_raw_size(self) -> int:
        """The raw size of a state of this run with all its tensors: no state of it is larger."""
        return layout_raw_size(self.state_layout())

    def state_limits(self, run: bytes, round_number: int | None = None) -> ManifestLimits:
        """What a checkpoint of a state of run `run` (of round `round_number`, if given) may be."""
        metadata = {"run": run} if round_number is None else {"run": run, "round": round_number}
        return checkpoint_limits(self.state_layout(), metadata)

    # --- the shared state as a checkpoint -------------------------------------------------------

    def state_tensors(self) -> dict[str, np.ndarray]:
        tensors = {"theta": self.outer.theta, "momentum": self.outer.momentum}
        if self.outer.previous is not None:
            tensors["previous"] = self.outer.previous
        return tensors

    def state_hash(self) -> bytes:
        """The `state_hash` the checkpoint of this state will have (what peers vote on), without writing it."""
        return state_digest(self.state_tensors())

    def snapshot(self) -> StateSnapshot:
        """The current state, to be written later (while the next round trains): the outer step
        replaces its arrays and never writes into them, so the snapshot cannot change."""
        return StateSnapshot(self.state_tensors(), self.round)

    def adopt(self, tensors: Mapping[str, Any], round_number: int) -> None:
        """Take `tensors` (θ, momentum and, after a round, the previous aggregate: a stored state
        that kept `state_limits`) as the shared state after round `round_number`."""
        arrays = {name: np.asarray(tensor) for name, tensor in tensors.items()}
        self.outer = OuterStep(
            arrays["theta"], self.settings.outer_config(),
            momentum_buffer=arrays["momentum"], previous_aggregate=arrays.get("previous"),
        )
        self.round = round_number
