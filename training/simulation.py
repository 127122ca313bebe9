"""DiLoCo simulated in one process (not the node's code path: `participant.py` is): N workers, R
rounds, and the data-parallel baseline beside it.

`simulate_diloco` runs the real pieces of a round in order, with the network taken out:

1. every honest worker trains H inner AdamW steps from θ_r on its own shard → Δ_i (`inner.py`);
2. each encodes Δ_i with its own codec encoder (which keeps its error-feedback residual);
3. Byzantine workers, if any, replace their payload with an attack's (`attacks.py`), having seen
   every honest Δ of the round;
4. the outer step decodes and validates every payload, aggregates robustly and takes the Nesterov
   step (`outer.py`): θ_{r+1}, the same bits on every peer. With `exchange="sharded"` every payload
   is cut into shards first and each shard is aggregated on its own (`shards.py`: what the
   committees compute between them).

`simulate_ddp` is the synchronous data-parallel baseline at equal samples: at every step each of
the N workers computes the gradient of its own batch, the gradients are averaged (what an exact
all-reduce delivers) and one AdamW step is taken on the shared model.

Bytes counted per worker: DiLoCo, the payloads it sent (one per round); DDP, 4 bytes × params per
step, the fp32 gradient it contributes. A ring all-reduce actually sends 2(N−1)/N of that, nearly
twice as much, so the count favours DDP.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .attacks import Attack, AttackView
from .codec import CodecError, Encoder, decode, non_finite_payload, split_payload
from .flat import flatten, param_count, unflatten_into
from .inner import InnerConfig, Worker, make_optimizer, optimizer_step
from .outer import OuterConfig, OuterStep
from .scoring import Reputation, ScoringConfig, excluded, score_contributions, shrunk, weights
from .shards import DEFAULT_SHARD_VALUES, ShardLayout, sharded_step
from .tasks import Task

FP32_BYTES = 4


@dataclass(frozen=True)
class DiLoCoConfig:
    workers: int = 4
    rounds: int = 10
    inner_steps: int = 50
    inner_seconds: float | None = None  # optional time budget per round, on top of inner_steps
    inner: InnerConfig = InnerConfig()
    codec: str = "int8"
    error_feedback: bool = True
    aggregator: str = "centered_clip"
    aggregator_options: Mapping[str, Any] = field(default_factory=dict)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    model_seed: int = 0
    run_seed: int = 0
    exchange: str = "allgather"  # or "sharded": each shard aggregated on its own (`shards.py`)
    shard_values: int = DEFAULT_SHARD_VALUES
    peer_momentum: bool = False  # the momentum as a robust aggregate of every author's (`outer.py`)
    scoring: ScoringConfig | None = None  # contribution scores each round, and what they weigh (`scoring.py`)

    def __post_init__(self) -> None:
        if self.exchange not in ("allgather", "sharded"):
            raise ValueError(f"exchange is 'allgather' or 'sharded', got {self.exchange!r}")
        if self.peer_momentum and self.exchange != "allgather":
            raise ValueError("peer_momentum runs with allgather exchange only")


@dataclass(frozen=True)
class DDPConfig:
    workers: int = 4
    steps: int = 500
    inner: InnerConfig = InnerConfig()  # batch_size is per worker, as for DiLoCo
    model_seed: int = 0
    run_seed: int = 0
    eval_every: int = 0  # steps between evaluations; 0: only at the end


@dataclass
class RoundRecord:
    round_index: int  # for DDP: the step count at this evaluation
    eval_loss: float
    train_loss: float
    bytes_per_worker: int  # sent by one honest worker so far
    rejected: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)  # with scoring: every decodable contribution's
    excluded: list[str] = field(default_factory=list)  # left out of the aggregate by the scoring policy


@dataclass
class RunResult:
    theta: np.ndarray
    loss: float
    floor: float | None
    bytes_per_worker: int
    samples: int  # training sequences consumed by all workers together
    history: list[RoundRecord]


RoundCallback = Callable[[RoundRecord], None]


def _author(index: int) -> str:
    return f"worker-{index}"


def simulate_diloco(
    task: Task,
    config: DiLoCoConfig,
    byzantine: Mapping[int, Attack] | None = None,
    on_round: RoundCallback | None = None,
    initial_theta: np.ndarray | None = None,
) -> RunResult:
    """Train `task` with DiLoCo; workers whose index is a key of `byzantine` run that attack
    instead of training. Starts from `initial_theta` (a warm start) if given, else from the
    model seed's initialisation. Deterministic for a given config."""
    byzantine = dict(byzantine or {})
    if any(not 0 <= index < config.workers for index in byzantine) or len(byzantine) >= config.workers:
        raise ValueError("Byzantine workers must be a strict subset of worker indices")
    honest = [index for index in range(config.workers) if index not in byzantine]
    workers = {
        index: Worker(task, config.model_seed, config.run_seed, index, config.inner) for index in honest
    }
    encoders = {index: Encoder(config.codec, error_feedback=config.error_feedback) for index in honest}
    theta = flatten(workers[honest[0]].model)
    if initial_theta is not None:
        theta = _checked_theta(initial_theta, theta_size=theta.size)
    outer = OuterStep(
        theta,
        OuterConfig(
            lr=config.outer_lr,
            momentum=config.outer_momentum,
            aggregator=config.aggregator,
            aggregator_options=dict(config.aggregator_options),
            codec=config.codec,
            peer_momentum=config.peer_momentum,
        ),
    )
    reputation = Reputation(config.scoring) if config.scoring is not None else None
    adversary = _Adversary(byzantine, config, reputation)
    layout = ShardLayout(theta.size, config.shard_values) if config.exchange == "sharded" else None
    history: list[RoundRecord] = []
    bytes_sent = 0
    evaluation = _evaluate(task, workers[honest[0]].model, theta)
    for round_index in range(config.rounds):
        results = {
            index: workers[index].run_round(theta, config.inner_steps, config.inner_seconds)
            for index in honest
        }
        payloads = {_author(index): encoders[index].encode(results[index].delta) for index in honest}
        honest_deltas = [results[index].delta for index in honest]
        scratch = workers[honest[0]].model  # any model to score or evaluate in: every round reloads θ
        estimate = _score_estimator(task, scratch, theta, config, round_index)
        payloads.update(adversary.payloads(round_index, honest_deltas, list(payloads.values()), outer, estimate))
        scores, left_out, aggregated = _scored(task, scratch, theta, payloads, outer.previous, config, round_index,
                                               reputation)
        if layout is None:
            bytes_sent += len(payloads[_author(honest[0])])
            outcome = outer.step(aggregated)
        else:  # the attackers cut their payloads like everyone's
            bytes_sent += sum(map(len, _split_all({"sent": payloads[_author(honest[0])]}, layout, config.codec)["sent"]))
            outcome = sharded_step(outer, layout, _split_all(aggregated, layout, config.codec))
        theta = outcome.theta
        evaluation = _evaluate(task, workers[honest[0]].model, theta)
        record = RoundRecord(
            round_index=round_index + 1,
            eval_loss=evaluation["loss"],
            train_loss=float(np.mean([result.mean_loss for result in results.values()])),
            bytes_per_worker=bytes_sent,
            rejected=sorted(outcome.rejected),
            scores=scores,
            excluded=sorted(left_out),
        )
        history.append(record)
        if on_round is not None:
            on_round(record)
    samples = sum(worker.steps_done for worker in workers.values()) * config.inner.batch_size
    return RunResult(theta, evaluation["loss"], evaluation["floor"], bytes_sent, samples, history)


class _Adversary:
    """The colluding Byzantine workers: they see the honest Δs and past payloads of every round."""

    def __init__(self, attacks: Mapping[int, Attack], config: DiLoCoConfig, reputation: Reputation | None = None):
        self.attacks = attacks
        self.reputation = reputation
        self.config = config
        self.encoder = Encoder(config.codec, error_feedback=False)
        self.past_payloads: list[list[bytes]] = []
        self.rng = np.random.default_rng([config.run_seed, 0xBAD])

    def payloads(
        self, round_index: int, honest_deltas: list[np.ndarray], honest_payloads: list[bytes],
        outer: OuterStep,
        estimate_scores: Callable[[list[np.ndarray]], list[float]] | None = None,
    ) -> dict[str, bytes]:
        view = AttackView(
            round_index=round_index,
            honest_deltas=honest_deltas,
            past_honest_payloads=self.past_payloads,
            workers=self.config.workers,
            byzantine=len(self.attacks),
            rng=self.rng,
            encode_non_finite=lambda value, numel: non_finite_payload(self.config.codec, value, numel),
            previous=outer.previous,
            aggregate=outer.trial_aggregate,
            peer_momentum=outer.config.momentum if outer.config.peer_momentum else None,
            momentum=outer.momentum,
            scoring=self.config.scoring,
            estimate_scores=estimate_scores,
            reputation=self._reputation(),
        )
        sent = {}
        for index, attack in sorted(self.attacks.items()):
            made = attack(view)
            sent[_author(index)] = made if isinstance(made, bytes) else self.encoder.encode(made)
        self.past_payloads.append(honest_payloads)
        return sent

    def _reputation(self) -> list[float] | None:
        """The colluders' relative scores of their last rounds (they send the same: any one's)."""
        if self.reputation is None or not self.attacks:
            return None
        return self.reputation.relative.get(_author(max(self.attacks)), [])


def _scored(task: Task, scratch: torch.nn.Module, theta: np.ndarray, payloads: Mapping[str, bytes],
            center: np.ndarray | None, config: DiLoCoConfig,
            round_index: int, reputation: Reputation | None = None) -> tuple[dict[str, float], set[str], Mapping[str, bytes]]:
    """With scoring: the round's scores (`scoring.py`, on batches from the round's seed; a payload
    that does not decode is not scored: the outer step rejects it), who the policy leaves out, and
    the payloads to aggregate (the others, shrunk by their weights under "weight"); without:
    nothing scored, all payloads."""
    if config.scoring is None:
        return {}, set(), payloads
    deltas = {}
    for author, payload in payloads.items():
        try:
            deltas[author] = decode(payload, theta.size, modes=(config.codec,))
        except CodecError:
            continue
    seed = _round_seed("scoring", config.run_seed, round_index)
    scores = score_contributions(task, scratch, theta, deltas, seed=seed, config=config.scoring)
    if config.scoring.policy == "reputation":
        assert reputation is not None
        left_out = reputation.excluded(payloads)
        reputation.record(scores)
    else:
        left_out = excluded(scores, config.scoring)
    if config.scoring.policy == "weight":
        payloads = _weighed(payloads, deltas, scores, center, config)
    return scores, left_out, {author: payload for author, payload in payloads.items() if author not in left_out}


def _weighed(payloads: Mapping[str, bytes], deltas: Mapping[str, np.ndarray], scores: Mapping[str, float],
             center: np.ndarray | None, config: DiLoCoConfig) -> dict[str, bytes]:
    """The "weight" policy as the simulator applies it: every scored Δ whose weight is below 1
    shrunk towards the centre (`scoring.shrunk`) and encoded again with the run's codec. (A daemon
    would weigh inside its bit-exact outer step; this is for measuring the lever.)"""
    encoder = Encoder(config.codec, error_feedback=False)
    weighed = dict(payloads)
    for author, weight in weights(scores).items():
        if weight < 1.0:
            weighed[author] = encoder.encode(shrunk(deltas[author], center, weight))
    return weighed


def _score_estimator(task: Task, scratch: torch.nn.Module, theta: np.ndarray, config: DiLoCoConfig,
                     round_index: int) -> Callable[[list[np.ndarray]], list[float]] | None:
    """With scoring, the attackers' estimate of any Δs' scores, on batches of their own."""
    if config.scoring is None:
        return None
    seed = _round_seed("attacker", config.run_seed, round_index)

    def estimate(deltas: list[np.ndarray]) -> list[float]:
        scores = score_contributions(task, scratch, theta, dict(enumerate(deltas)), seed=seed, config=config.scoring)
        return [scores[i] for i in range(len(deltas))]

    return estimate


def _round_seed(purpose: str, run_seed: int, round_index: int) -> int:
    """A seed for `purpose` in this round, unknown before it (here: derived; a live run draws it)."""
    return int.from_bytes(hashlib.sha256(f"{purpose} {run_seed} {round_index}".encode()).digest()[:8], "big")


def _split_all(payloads: Mapping[str, bytes], layout: ShardLayout, codec: str) -> dict[str, list[bytes]]:
    """Every payload cut into its shards' payloads; one that does not split (a malformed attack
    payload) goes whole to every shard, where it is rejected like any malformed shard."""
    split = {}
    for author, payload in payloads.items():
        try:
            split[author] = split_payload(payload, layout.numel, layout.bounds, modes=(codec,))
        except CodecError:
            split[author] = [payload] * layout.count
    return split


def _checked_theta(theta: np.ndarray, theta_size: int) -> np.ndarray:
    """A float32 copy of a warm-start θ, refused if it does not fit the model."""
    theta = np.asarray(theta)
    if theta.shape != (theta_size,):
        raise ValueError(
            f"initial theta has shape {theta.shape}, the model has {theta_size} parameters"
        )
    return np.array(theta, dtype=np.float32, copy=True)


def _evaluate(task: Task, scratch: torch.nn.Module, theta: np.ndarray) -> dict:
    """Evaluate θ in `scratch` (a worker's model; its next round reloads θ anyway)."""
    unflatten_into(scratch, theta)
    return task.evaluate(scratch)


def simulate_ddp(
    task: Task,
    config: DDPConfig,
    on_eval: RoundCallback | None = None,
    initial_theta: np.ndarray | None = None,
) -> RunResult:
    """The synchronous data-parallel baseline: averaged gradients of N shards, one AdamW step each,
    from `initial_theta` (a warm start) if given, else from the model seed's initialisation.

    Worker i's batch at step t is the same shard (`task.batch(run_seed, i, t, ...)`) that DiLoCo's
    worker i trains on at its inner step t, so both see the same samples.
    """
    model = task.build_model(config.model_seed)
    if initial_theta is not None:
        unflatten_into(model, _checked_theta(initial_theta, theta_size=param_count(model)))
    optimizer = make_optimizer(model, config.inner)
    model.train()
    bytes_per_step = FP32_BYTES * param_count(model)
    history: list[RoundRecord] = []
    recent_losses: list[float] = []
    evaluation = task.evaluate(model)
    for step in range(config.steps):
        step_loss = 0.0
        for index in range(config.workers):
            inputs, targets = task.batch(config.run_seed, index, step, config.inner.batch_size)
            _, loss = model(inputs, targets)
            # Dividing each shard's loss by N makes the accumulated gradient the mean of the N
            # workers' gradients, added in worker order: the all-reduce's result.
            (loss / config.workers).backward()
            step_loss += loss.item() / config.workers
        optimizer_step(model, optimizer, config.inner, step)
        recent_losses.append(step_loss)
        done = step + 1
        if (config.eval_every and done % config.eval_every == 0) or done == config.steps:
            evaluation = task.evaluate(model)
            record = RoundRecord(
                round_index=done,
                eval_loss=evaluation["loss"],
                train_loss=float(np.mean(recent_losses)),
                bytes_per_worker=bytes_per_step * done,
            )
            recent_losses.clear()
            history.append(record)
            if on_eval is not None:
                on_eval(record)
    samples = config.workers * config.steps * config.inner.batch_size
    total_bytes = bytes_per_step * config.steps
    return RunResult(flatten(model), evaluation["loss"], evaluation["floor"], total_bytes, samples, history)
