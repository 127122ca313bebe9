"""A participant whose training costs modelled time instead of CPU, for the `train` scenario.

`SimParticipant` implements `locomesh.training.contract.RoundParticipant`, what the round protocol
needs from a participant (as `locomesh.training.participant.Participant` does), so the daemon's real
`RoundService` and `RunParticipation` drive it unchanged. What differs:

- `train` does no arithmetic: it returns a payload of `payload_bytes` bytes drawn from a
  generator seeded by (our key, round), so a run is repeatable, and notes that it cost
  inner_steps x step_seconds x speed of compute; `SimCompute` turns that into a virtual sleep;
- `aggregate` folds the SHA-256 of every *valid* payload, in sorted order, into the state: peers
  that aggregate the same set reach the same state byte for byte, and a payload that fails the
  check (the real participant's decoder refusing junk) changes nothing, as robust aggregation
  should ensure for the real model;
- `snapshot`/`adopt` hand out and take in the state bytes as one tensor, which the node's store
  writes and reads as a real checkpoint, so certificates name a real `state_hash` and a peer
  that disagrees syncs over the network.

A payload is valid when it starts with `PAYLOAD_MARK` and is `payload_bytes` long; a Byzantine
participant (`byzantine=True`) sends bytes of the right length that start with anything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from locomesh.training.checkpoint_manifest import ManifestLimits, TensorSpec
from locomesh.training.contract import DataNeeds
from locomesh.training.run_settings import ParticipantError
from locomesh.training.participant import Contribution, StateSnapshot, payload_limits
from locomesh.training.state_chunks import checkpoint_limits, state_digest

PAYLOAD_MARK = 0x4C  # "L": the first byte of an honest payload
JUNK_MARK = 0x00


@dataclass(frozen=True)
class SimCost:
    """What one participant's work costs in (virtual) seconds."""

    step_seconds: float = 0.1  # one inner step on this node
    aggregate_seconds: float = 0.0  # decode, robust aggregation and outer step
    payload_bytes: int = 32 * 1024
    state_bytes: int = 4096


@dataclass(frozen=True)
class _Settings:
    inner_steps: int
    delayed_updates: bool = False
    scoring: str = "off"  # a modelled state has no loss to score contributions by


@dataclass(frozen=True)
class _Outer:
    numel: int  # parameters the payload stands for (one int8 each)


class SimParticipant:
    """θ as opaque state bytes; training and aggregation cost modelled time. Not thread-safe.
    A `RoundParticipant` (`locomesh.training.contract`)."""

    device = "simulated"  # what the node's status shows as where it trains

    def __init__(self, genesis_body: dict[str, Any], key: bytes, cost: SimCost, *, byzantine: bool = False) -> None:
        hparams = genesis_body["hparams"]
        self.key = key
        self.cost = cost
        self.byzantine = byzantine
        self.settings = _Settings(int(hparams["inner_steps"]), bool(hparams.get("delayed_updates", False)))
        self.outer = _Outer(cost.payload_bytes)
        self.round = 0
        self.state = _expand(hashlib.sha256(b"genesis" + genesis_body["seed"].to_bytes(8, "big")).digest(),
                             cost.state_bytes)
        self.pending_seconds = 0.0  # modelled cost of the last call, taken by `SimCompute`
        self.trainings = 0  # with delayed updates two trainings start from one state: each its own payload

    def close(self) -> None:
        """Nothing to release: no processes, no devices."""

    def take_pending_seconds(self) -> float:
        seconds, self.pending_seconds = self.pending_seconds, 0.0
        return seconds

    # --- one round ------------------------------------------------------------------------------

    def train(self, stop: Callable[[], bool] | None = None, start: None = None, data: None = None) -> Contribution:
        """A deterministic payload for (our key, round, trainings so far); costs inner_steps x
        step_seconds (all of it: `stop` is not asked, the modelled steps are taken as one)."""
        seconds = self.settings.inner_steps * self.cost.step_seconds
        self.pending_seconds = seconds
        self.trainings += 1
        seed = hashlib.sha256(b"payload" + self.key + self.round.to_bytes(8, "big")
                              + self.trainings.to_bytes(8, "big")).digest()
        payload = bytearray(_expand(seed, self.cost.payload_bytes))
        payload[0] = JUNK_MARK if self.byzantine else PAYLOAD_MARK
        return Contribution(bytes(payload), self.settings.inner_steps, float("nan"), seconds)

    def data_needs(self) -> DataNeeds:
        """A modelled task reads no dataset and starts from no stored weights."""
        return DataNeeds()

    def attach_data(self, index: None, held_out: Sequence[Any], init: None) -> None:
        """Nothing to attach (`data_needs` names nothing)."""

    def export_files(self, tokenizer_json: bytes | None = None) -> dict[str, bytes]:
        """A modelled state is opaque bytes: there is no model to export."""
        raise ParticipantError("a simulated participant has no model to export")

    def delayed_start(self, trained: Contribution) -> None:
        """There are no parameters to start from: `train` ignores its `start`."""
        return None

    def aggregate(self, payloads: Mapping[bytes, bytes]) -> None:
        """The next state from the hashes of the valid payloads; ValueError if none is valid
        (as the real participant's EmptyRoundError: nothing to apply)."""
        self.pending_seconds = self.cost.aggregate_seconds
        digests = sorted(hashlib.sha256(p).digest() for p in payloads.values() if self.is_valid(p))
        if not digests:
            raise ValueError(f"round {self.round + 1}: none of {len(payloads)} payloads is valid")
        seed = hashlib.sha256(self.state + self.round.to_bytes(8, "big") + b"".join(digests)).digest()
        self.state = _expand(seed, self.cost.state_bytes)
        self.round += 1

    def is_valid(self, payload: bytes) -> bool:
        return len(payload) == self.cost.payload_bytes and payload[:1] == bytes([PAYLOAD_MARK])

    def evaluation_due(self) -> bool:
        """Never: there is no model, so no loss; the simulator measures time, not learning."""
        return False

    def evaluate(self) -> dict[str, float | None]:
        return {"loss": None, "floor": None}

    # --- what a payload and a state of this run can be ---------------------------------------------

    def payload_limits(self, run: bytes, round_number: int, size: int) -> ManifestLimits:
        return payload_limits(run, round_number, size, self.cost.payload_bytes)

    def state_limits(self, run: bytes, round_number: int | None = None) -> ManifestLimits:
        metadata = {"run": run} if round_number is None else {"run": run, "round": round_number}
        return checkpoint_limits({"state": TensorSpec("uint8", (self.cost.state_bytes,))}, metadata)

    # --- the shared state as a checkpoint -------------------------------------------------------

    def _tensors(self) -> dict[str, np.ndarray]:
        return {"state": np.frombuffer(self.state, dtype=np.uint8)}

    def scoring_base(self) -> None:
        """Nothing: the simulated run never scores (its settings say "off")."""
        return None

    def score(self, base: Any, payloads: Mapping[bytes, Any], seed: int) -> dict[bytes, float]:
        """No scores: a modelled state has no loss."""
        return {}

    def state_hash(self) -> bytes:
        return state_digest(self._tensors())

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(self._tensors(), self.round)  # the state is immutable bytes

    def adopt(self, tensors: Mapping[str, Any], round_number: int) -> None:
        """Take a stored state that kept `state_limits` as the state after round `round_number`."""
        self.state = np.asarray(tensors["state"]).tobytes()
        self.round = round_number


class SimCompute:
    """`RoundService(compute=...)`: run a participant method inline, then sleep its modelled
    seconds in virtual time; keeps the virtual intervals spent training (for the compute share)."""

    def __init__(self) -> None:
        self.trainings: list[tuple[float, float]] = []  # (start, end), virtual seconds

    @property
    def first_train_at(self) -> float | None:
        return self.trainings[0][0] if self.trainings else None

    def seconds_between(self, start: float, end: float) -> float:
        """Virtual seconds spent training within [start, end]."""
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.trainings)

    async def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        result = function(*args)
        owner = getattr(function, "__self__", None)
        seconds = owner.take_pending_seconds() if isinstance(owner, SimParticipant) else 0.0
        if isinstance(owner, SimParticipant) and function.__name__ == "train":
            self.trainings.append((trio.current_time(), trio.current_time() + seconds))
        await trio.sleep(seconds)
        return result


def _expand(seed: bytes, size: int) -> bytes:
    return np.random.default_rng(int.from_bytes(seed, "big")).integers(0, 256, size, dtype=np.uint8).tobytes()

