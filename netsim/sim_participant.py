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

In a sharded round the payload is cut into `SimCost.shards` pieces (`shard_layout`), each marked
the same way, and framed as the real participant frames its shards (`frame_shards`). A shard's
result is 8 float32 values made of the hash of its valid pieces (`aggregate_shard`, costing
its share of `aggregate_seconds`); `apply_shards` folds every result into the state, so peers that
apply the same results reach the same state byte for byte.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from locomesh.training.checkpoint_manifest import ManifestLimits, TensorSpec
from locomesh.training.codec import CodecError
from locomesh.training.contract import DataNeeds
from locomesh.training.run_settings import ParticipantError, RoundSettings
from locomesh.training.participant import Contribution, StateSnapshot, payload_limits
from locomesh.training.shards import ShardedPayload, ShardLayout, frame_shards, max_framed_size, shard_result_hash, unframe
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
    shards: int = 4  # pieces of a payload in a sharded round (fewer if the payload is too small)


@dataclass(frozen=True)
class _Settings:
    inner_steps: int
    delayed_updates: bool = False
    scoring: str = "off"  # a modelled state has no loss to score contributions by
    exchange: str = RoundSettings.exchange  # allgather, sharded or auto (node/exchange/mode.py), as a real run's
    byzantine_fraction: float = RoundSettings.byzantine_fraction
    recover_after: int = RoundSettings.recover_after

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> _Settings:
        """What the round reads of a genesis' `hparams` (defaults as a real run's)."""
        return cls(int(hparams["inner_steps"]), bool(hparams.get("delayed_updates", False)),
                   exchange=str(hparams.get("exchange", cls.exchange)),
                   byzantine_fraction=float(hparams.get("byzantine_fraction", cls.byzantine_fraction)),
                   recover_after=int(hparams.get("recover_after", cls.recover_after)))


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
        self.settings = _Settings.from_hparams(hparams)
        self.outer = _Outer(cost.payload_bytes)
        self.round = 0
        self.state = _expand(hashlib.sha256(b"genesis" + genesis_body["seed"].to_bytes(8, "big")).digest(),
                             cost.state_bytes)
        self.pending_seconds = 0.0  # modelled cost of the last call, taken by `SimCompute`
        self.trainings = 0  # with delayed updates two trainings start from one state: each its own payload
        self._layout = ShardLayout(cost.payload_bytes, math.ceil(cost.payload_bytes / max(1, cost.shards)), block=1)

    def close(self) -> None:
        """Nothing to release: no processes, no devices."""

    def take_pending_seconds(self) -> float:
        seconds, self.pending_seconds = self.pending_seconds, 0.0
        return seconds

    # --- one round ------------------------------------------------------------------------------

    def train(self, stop: Callable[[], bool] | None = None, start: None = None, data: None = None,
              sharded: bool = False) -> Contribution:
        """A deterministic payload for (our key, round, trainings so far); costs inner_steps x
        step_seconds (all of it: `stop` is not asked, the modelled steps are taken as one).
        `sharded`: the same bytes cut at `shard_layout`'s bounds, each piece marked, framed."""
        seconds = self.settings.inner_steps * self.cost.step_seconds
        self.pending_seconds = seconds
        self.trainings += 1
        seed = hashlib.sha256(b"payload" + self.key + self.round.to_bytes(8, "big")
                              + self.trainings.to_bytes(8, "big")).digest()
        payload = bytearray(_expand(seed, self.cost.payload_bytes))
        mark = JUNK_MARK if self.byzantine else PAYLOAD_MARK
        for position in [first for first, _ in self._layout.bounds] if sharded else [0]:
            payload[position] = mark
        if sharded:
            payload = frame_shards([bytes(payload[a:b]) for a, b in self._layout.bounds])
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

    # --- sharded exchange (the real participant's: training/participant.py) ----------------------

    def shard_layout(self) -> ShardLayout:
        """The payload's bytes cut into `SimCost.shards` ranges."""
        return self._layout

    def sharded_payload(self, payload: bytes) -> ShardedPayload:
        """The pieces of a framed payload; `CodecError` "bad-frame" if it is not one of this run's."""
        return ShardedPayload(unframe(payload, self._limits()))

    def shard_limit(self, index: int) -> int:
        return self._limits()[self._index(index)]

    def max_sharded_payload_size(self) -> int:
        return max_framed_size(self._limits())

    def _limits(self) -> list[int]:
        return [self._layout.size(index) for index in range(self._layout.count)]

    def _index(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self._layout.count:
            raise ValueError(f"shard {index!r:.20} of a layout with {self._layout.count}")
        return index

    def aggregate_shard(self, index: int,
                        shards: Mapping[bytes, bytes]) -> tuple[np.ndarray, list[bytes], dict[bytes, CodecError]]:
        """Shard `index`'s result from the hashes of its valid pieces (marked, of the shard's size);
        costs the shard's share of `aggregate_seconds`. ValueError if no piece is valid."""
        self.pending_seconds = self.cost.aggregate_seconds / self._layout.count
        size = self._layout.size(self._index(index))
        valid = {author: piece for author, piece in shards.items()
                 if isinstance(piece, bytes) and len(piece) == size and piece[:1] == bytes([PAYLOAD_MARK])}
        rejected = {author: CodecError("bad-shard", f"not a valid piece of shard {index}")
                    for author in shards if author not in valid}
        if not valid:
            raise ValueError(f"round {self.round + 1}, shard {index}: none of {len(shards)} pieces is valid")
        digests = sorted(hashlib.sha256(piece).digest() for piece in valid.values())
        digest = hashlib.sha256(b"".join(digests) + index.to_bytes(4, "big")).digest()
        # As many float32 values as the piece has int8 ones, as a real aggregate has: the traffic of
        # fetching results is what decides between the exchanges (node/exchange/mode.py).
        return np.frombuffer(_expand(digest, self.result_size(index)), dtype="<f4"), sorted(valid), rejected

    def result_hash(self, index: int, values: np.ndarray) -> bytes:
        """What a member signs for `values` as shard `index` of the round being aggregated (r + 1)."""
        return shard_result_hash(self.round + 1, index, values)

    def result_size(self, index: int) -> int:
        return 4 * self._layout.size(self._index(index))

    def result_from_bytes(self, index: int, data: bytes) -> np.ndarray:
        size = self.result_size(index)
        if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != size:
            raise ValueError(f"a result of shard {index} is {size} bytes")
        return np.frombuffer(bytes(data), dtype="<f4")

    def result_to_bytes(self, values: np.ndarray) -> bytes:
        return np.ascontiguousarray(values, dtype="<f4").tobytes()

    def apply_shards(self, results: Sequence[np.ndarray], accepted: Sequence[bytes], rejected: Mapping[bytes, Any]) -> None:
        """The next state from every shard's result (in layout order); ValueError if nobody was
        accepted or the results do not fit the layout (the state is then unchanged)."""
        if not accepted:
            raise ValueError(f"round {self.round + 1}: no contribution accepted ({len(rejected)} rejected)")
        if len(results) != self._layout.count:
            raise ValueError(f"{len(results)} shard results, the layout has {self._layout.count} shards")
        parts = [self.result_to_bytes(values) for values in results]
        if any(len(part) != self.result_size(index) for index, part in enumerate(parts)):
            raise ValueError("a shard result is 4 bytes per value of its shard")
        seed = hashlib.sha256(self.state + self.round.to_bytes(8, "big") + b"".join(parts)).digest()
        self.state = _expand(seed, self.cost.state_bytes)
        self.round += 1

    def evaluation_due(self) -> bool:
        """Never: there is no model, so no loss; the simulator measures time, not learning."""
        return False

    def evaluate(self) -> dict[str, float | None]:
        return {"loss": None, "floor": None}

    # --- what a payload and a state of this run can be ---------------------------------------------

    def payload_limits(self, run: bytes, round_number: int, size: int, sharded: bool = False) -> ManifestLimits:
        """`sharded`: a framed payload's (`max_sharded_payload_size`)."""
        return payload_limits(run, round_number, size, self.max_sharded_payload_size() if sharded else self.cost.payload_bytes)

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

