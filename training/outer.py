"""The DiLoCo outer step: payloads in, θ_{r+1} out, the same bits on every peer.

One call to `OuterStep.step` does, in this order:

1. decode and validate every payload (`codec.decode_row`: header, sizes, finite
   bounded scales, codes in range); a bad one is set aside with its author and
   its `CodecError`, it never raises out. A quantized payload stays codes and
   scales (`QuantizedRow`), dequantized slab by slab as the aggregator reads it;
2. put the accepted contributions in the order of their authors' keys;
3. aggregate them robustly (`aggregators.aggregate`, CenteredClip by default,
   centred on the previous round's aggregate);
4. cap the aggregate's norm: if ‖g‖ > cap, g ← g · float32(cap / ‖g‖);
5. Nesterov momentum, each line one float32 ufunc:
   m ← μ·m + g;  u ← g + μ·m (plain momentum: u ← m);  θ ← θ − lr·u.

With `peer_momentum` the momentum is itself a robust aggregate (Karimireddy, He & Jaggi 2021,
"Learning from history"): each author a keeps M_a ← μ·M_a + x_a (a newcomer, or an author absent
last round, starts from the run's m), and m ← aggregate({M_a}) centred on μ·m + g, what plain
momentum would have given. The idea: an attacker that stays inside the honest spread of one
round's Δs and pushes along one direction for many rounds adds up through m unclipped, while honest
momenta average independent noise away. Measured (docs/design-notes.md, "Adaptive attackers"): it stops pushes
along a random direction, but honest momenta in DiLoCo are as spread as single Δs relative to
their mean (each worker keeps its own inner optimizer state), and an attacker aimed against the
honest mean does more harm than without it; so it is off by default. It costs one vector per
author of the last round. With the plain mean it is the same as step 5.

Pseudo-gradients are Δ = θ_r − θ_i, so subtracting lr·Δ moves θ towards the
workers' models. Every operation follows `exact`'s rules, so the result (and its
SHA-256, `params_hash`) is the same on every CPU given the same payloads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import aggregators, exact
from .codec import DEFAULT_BLOCK, FP16_MAX, CodecError, QuantizedRow, decode_row
from .exact import F32, params_hash

__all__ = ["EmptyRoundError", "OuterConfig", "OuterResult", "OuterStep", "params_hash"]

Author = bytes | str
Row = np.ndarray | QuantizedRow


@dataclass(frozen=True)
class OuterConfig:
    """The run's outer-step hyperparameters (from its genesis manifest)."""

    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    aggregator: str = "centered_clip"
    aggregator_options: Mapping[str, Any] = field(default_factory=dict)
    max_update_norm: float | None = None  # cap on ‖aggregate‖; None: no cap
    codec: str = "int8"
    block_size: int = DEFAULT_BLOCK
    max_scale: float = FP16_MAX
    peer_momentum: bool = False  # aggregate each author's momentum, not only this round's Δs (module docstring)

    def __post_init__(self) -> None:
        if self.aggregator not in aggregators.AGGREGATORS:
            raise ValueError(f"unknown aggregator {self.aggregator!r}")
        if not (math.isfinite(self.lr) and math.isfinite(self.momentum) and 0 <= self.momentum < 1):
            raise ValueError("lr must be finite and momentum in [0, 1)")
        if self.max_update_norm is not None and not self.max_update_norm > 0:
            raise ValueError("max_update_norm must be positive")


@dataclass
class OuterResult:
    """What one outer step did."""

    theta: np.ndarray  # θ_{r+1} (the step's own array; the next step replaces it, never mutates it)
    accepted: list[Author]  # in canonical (key) order
    rejected: dict[Author, CodecError]  # author -> why their payload was refused
    aggregate_norm: float  # ‖g‖ before the cap
    capped: bool  # whether the cap scaled g down

    @functools.cached_property
    def params_hash(self) -> str:
        """Hex SHA-256 of θ_{r+1}'s little-endian float32 bytes, hashed on first use: the round
        protocol votes on the whole state's hash instead, and 100 MB of SHA-256 was a fifth of
        a 25M-parameter step."""
        return params_hash(self.theta)


class EmptyRoundError(ValueError):
    """No payload of the round decoded; θ and momentum are left as they were."""

    def __init__(self, rejected: dict[Author, CodecError]) -> None:
        super().__init__(f"no valid contribution this round ({len(rejected)} rejected)")
        self.rejected = rejected


class OuterStep:
    """Holds θ, the momentum buffer and the previous aggregate; `step` advances them one round.

    `step` never writes into an array anyone else still holds, so references taken between
    steps (a checkpoint being written) stay valid: it updates θ and the momentum in place when
    nobody else holds them, and otherwise replaces them; arrays it has replaced and nobody holds
    any more are written again (`SpareVectors`).
    """

    def __init__(
        self,
        theta: np.ndarray,
        config: OuterConfig | None = None,
        *,
        momentum_buffer: np.ndarray | None = None,
        previous_aggregate: np.ndarray | None = None,
        **overrides: Any,
    ) -> None:
        """Start from θ (copied). Keyword `overrides` set `OuterConfig` fields; other keywords are aggregator options.

        `OuterStep(theta, lr=0.7, aggregator="trimmed_mean", beta=0.2)` is
        `OuterStep(theta, OuterConfig(lr=0.7, aggregator="trimmed_mean", aggregator_options={"beta": 0.2}))`.
        """
        config = config or OuterConfig()
        names = {f.name for f in dataclasses.fields(OuterConfig)}
        settings = {key: value for key, value in overrides.items() if key in names}
        options = {key: value for key, value in overrides.items() if key not in names}
        if settings or options:
            merged = {**settings.pop("aggregator_options", config.aggregator_options), **options}
            config = dataclasses.replace(config, **settings, aggregator_options=merged)
        self.config = config
        self.theta = np.array(exact.as_flat_f32(theta, what="theta"), copy=True)
        self.momentum = self._state_vector(momentum_buffer, "momentum buffer")
        self.previous = None if previous_aggregate is None else self._state_vector(previous_aggregate, "previous aggregate")
        self._spares = SpareVectors()  # state arrays this step has replaced, for reuse
        self.peer_momenta: dict[bytes, np.ndarray] = {}  # author key -> M_a, authors of the last round only

    @property
    def numel(self) -> int:
        return self.theta.size

    def step(self, payloads: Mapping[Author, bytes], *, bucket_seed: bytes = b"") -> OuterResult:
        """Decode, validate, aggregate, cap and apply one round's payloads (keyed by author).

        Raises `EmptyRoundError` (state unchanged) if no payload decodes, and
        `AggregatorError` (state unchanged) if the aggregator cannot work with
        what is left (e.g. Krum with too few contributions).
        """
        g = self._spares.take(self.numel)  # kept as the previous aggregate: none of the decode rows
        contributions, rejected = self._decode_all(payloads, self.numel)
        authors = self._aggregate_rows(contributions, rejected, self.previous, out=g, bucket_seed=bucket_seed)
        return self.apply_aggregate(g, authors, rejected, rows=contributions if self.config.peer_momentum else None)

    def aggregate_range(self, payloads: Mapping[Author, bytes], start: int, stop: int, *, out: np.ndarray,
                        bucket_seed: bytes = b"") -> tuple[list[Author], dict[Author, CodecError]]:
        """Aggregate the payloads of the values [start, stop) of θ (the whole vector, or one shard of
        sharded exchange, centred on that range of the previous aggregate) into `out`; the
        accepted authors in canonical order, and the rejected with their errors. Raises as `step`."""
        if self.config.peer_momentum:
            raise ValueError("peer_momentum needs every author's whole Δ: it runs with allgather exchange only")
        contributions, rejected = self._decode_all(payloads, stop - start)
        previous = None if self.previous is None else self.previous[start:stop]
        return self._aggregate_rows(contributions, rejected, previous, out=out, bucket_seed=bucket_seed), rejected

    def _aggregate_rows(self, contributions: Mapping[Author, Row], rejected: Mapping[Author, CodecError],
                        center: np.ndarray | None, *, out: np.ndarray, bucket_seed: bytes = b"") -> list[Author]:
        """Aggregate decoded rows around `center` into `out`; the authors in canonical order."""
        if not contributions:
            raise EmptyRoundError(dict(rejected))
        authors = sorted(contributions, key=author_key)
        aggregators.aggregate(
            self.config.aggregator,
            [contributions[author] for author in authors],
            keys=[author_key(author) for author in authors],
            previous=center,
            bucket_seed=bucket_seed,
            out=out,
            **self._options_after_rejections(len(rejected)),
        )
        if not np.isfinite(out).all():  # cannot happen with decoded inputs; never apply it if it did
            raise aggregators.AggregatorError("the aggregate is not finite")
        return authors

    def trial_aggregate(self, rows: Sequence[np.ndarray], center: np.ndarray | None = None) -> np.ndarray:
        """What this step's aggregator (its options; its centre, or `center`) makes of float32
        `rows`, keyed by content; the state is not touched. An omniscient attacker's view of it."""
        center = self.previous if center is None else center
        return aggregators.aggregate(self.config.aggregator, rows, previous=center, **self.config.aggregator_options)

    def apply_aggregate(self, g: np.ndarray, accepted: list[Author], rejected: dict[Author, CodecError],
                        *, rows: Mapping[Author, Row] | None = None) -> OuterResult:
        """Cap aggregate `g` (an array this step may keep: it becomes the previous aggregate) and
        take the momentum step with it: the end of `step`, and of a sharded round whose shard
        aggregates were assembled into `g`. With `peer_momentum`, `rows` are the accepted Δs."""
        if g.dtype != F32 or g.shape != (self.numel,):
            raise ValueError(f"the aggregate must be a float32 vector of {self.numel} values")
        g, g_norm, capped = self._cap(g)
        momentum = None
        if self.config.peer_momentum:
            if rows is None:
                raise ValueError("peer_momentum needs the round's accepted rows")
            momentum = self._robust_momentum(rows, accepted, g, len(rejected))
        replaced = self._apply(g, momentum)
        self._spares.retire(*replaced, self.previous)
        self.previous = g
        return OuterResult(self.theta, accepted, rejected, g_norm, capped)

    def _robust_momentum(self, rows: Mapping[Author, Row], authors: list[Author], g: np.ndarray,
                         rejected: int) -> np.ndarray:
        """m for this step with `peer_momentum`: every author's M_a ← μ·M_a + x_a (from the run's m
        for an author not in the last round), aggregated around μ·m + g. Keeps this round's M_a."""
        mu = F32(self.config.momentum)
        center = np.add(np.multiply(self.momentum, mu, dtype=F32), g, dtype=F32)
        scratch = np.empty(min(exact.SLAB, self.numel), dtype=F32)
        momenta: dict[bytes, np.ndarray] = {}
        for author in authors:
            key = author_key(author)
            new = self.peer_momenta.get(key)  # updated in place: nothing else holds it
            old = self.momentum if new is None else new
            new = np.empty(self.numel, dtype=F32) if new is None else new
            for start, stop in exact.slabs(self.numel):
                np.multiply(old[start:stop], mu, out=new[start:stop])
                np.add(new[start:stop], exact.read_slab(rows[author], start, stop, scratch[: stop - start]), out=new[start:stop])
            momenta[key] = new
        self.peer_momenta = momenta  # authors absent this round start again from m when they return
        keys = sorted(momenta)
        return aggregators.aggregate(self.config.aggregator, [momenta[k] for k in keys], keys=keys,
                                     previous=center, **self._options_after_rejections(rejected))

    def _options_after_rejections(self, rejected: int) -> dict:
        """The aggregator's options, with Krum's `f` lowered by the payloads already rejected.

        An author whose payload failed validation is provably faulty and already
        out, so at most f − rejected faulty contributions remain; without this a
        NaN payload would leave Krum "too few contributions" and stall the round.
        """
        options = dict(self.config.aggregator_options)
        if "f" in options and self.config.aggregator in ("krum", "multi_krum"):
            options["f"] = max(0, options["f"] - rejected)
        return options

    def _decode_all(self, payloads: Mapping[Author, bytes], numel: int) -> tuple[dict[Author, Row], dict[Author, CodecError]]:
        """Every payload checked and decoded into the row the aggregator reads (`codec.decode_row`:
        a quantized payload stays one byte a value), or set aside with its `CodecError`."""
        decoded, rejected = {}, {}
        for author, payload in payloads.items():
            try:
                decoded[author] = decode_row(
                    payload,
                    numel,
                    modes=(self.config.codec,),
                    block_size=None if self.config.codec == "fp32" else self.config.block_size,
                    max_scale=self.config.max_scale,
                )
            except CodecError as error:
                rejected[author] = error
        return decoded, rejected

    def _cap(self, g: np.ndarray) -> tuple[np.ndarray, float, bool]:
        g_norm = exact.norm(g)
        cap = self.config.max_update_norm
        if cap is None or g_norm <= cap:
            return g, g_norm, False
        return exact.scale(g, cap / g_norm, out=g), g_norm, True  # g is this step's own array

    def _apply(self, g: np.ndarray, momentum: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Nesterov (or plain) momentum and the parameter update (`_momentum_step`). A state, once
        made, is never written again while it is held, so it can be stored (or hashed) while the
        next step runs: θ and the momentum are updated in place only when nobody else holds them
        (no snapshot, view or tensor of them), and otherwise go to arrays nobody holds (new, or
        `SpareVectors`). In place, the outer state costs θ, momentum, previous aggregate and one
        spare for the next aggregate: four vectors of the model's size, not six. Returns the
        arrays it replaced. `momentum`, if given, is the new m (`peer_momentum`)."""
        in_place = self._unheld("theta") and self._unheld("momentum")
        replaced = () if in_place else (self.theta, self.momentum)
        self.theta, self.momentum = self._momentum_step(g, in_place=in_place, momentum=momentum)
        return replaced

    def _unheld(self, name: str) -> bool:
        """Whether this step's array `name` is referenced by nothing but this step: two references
        while `getrefcount` looks (the attribute and the argument), as in `SpareVectors`."""
        return sys.getrefcount(getattr(self, name)) == 2

    def preview(self, g: np.ndarray) -> np.ndarray:
        """θ after a step whose aggregate were `g`, the state left as it is. A peer training ahead
        with delayed updates starts from `preview(its own Δ)`: its guess at the next θ."""
        g = exact.as_flat_f32(g, what="aggregate")
        if g.size != self.numel:
            raise ValueError(f"the aggregate has {g.size} values, θ has {self.numel}")
        theta, momentum = self._momentum_step(g, in_place=False)
        self._spares.retire(momentum)
        return theta

    def _momentum_step(self, g: np.ndarray, *, in_place: bool,
                       momentum: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(θ, momentum) after the update with aggregate `g`, one float32 ufunc per operation; the
        new momentum is μ·m + g, or `momentum` where given.

        Slab by slab: the same operations in the same order as whole-vector ufuncs (so the same
        bits), but each slab of m, g and θ is read once while it is in cache."""
        mu, lr = F32(self.config.momentum), F32(self.config.lr)
        update = np.empty(min(exact.SLAB, self.numel), dtype=F32)
        if in_place:  # every line below reads a slab before it writes the same slab
            new_theta, new_momentum = self.theta, self.momentum
        else:
            new_theta, new_momentum = self._spares.take(self.numel), self._spares.take(self.numel)
        for start, stop in exact.slabs(self.numel):
            m, grad, u = new_momentum[start:stop], g[start:stop], update[: stop - start]
            if momentum is None:
                np.multiply(self.momentum[start:stop], mu, out=m)
                np.add(m, grad, out=m)
            else:
                np.copyto(m, momentum[start:stop])
            if self.config.nesterov:
                np.multiply(m, mu, out=u)
                np.add(u, grad, out=u)
            else:
                np.copyto(u, m)
            np.multiply(u, lr, out=u)
            np.subtract(self.theta[start:stop], u, out=new_theta[start:stop])
        return new_theta, new_momentum

    def _state_vector(self, given: np.ndarray | None, what: str) -> np.ndarray:
        if given is None:
            return np.zeros(self.numel, dtype=F32)
        given = exact.as_flat_f32(given, what=what)
        if given.size != self.numel:
            raise ValueError(f"{what} has {given.size} values, θ has {self.numel}")
        return np.array(given, copy=True)


class SpareVectors:
    """Float32 vectors a step has replaced, written again once nothing else holds them.

    Why: a step never writes into an array it has handed out (a state may be being stored
    while the next round trains), so each round needs a new θ and momentum. Made afresh, a
    vector of 25M values costs page faults on every touch: on a VM that hands freed memory
    back to its host, an outer step a round after the last one took about twice as long as one
    right after it, most of it faulting in new pages (docs/measurements.md).

    "Nothing else holds it" is read from the reference count: an array held only by this list
    has two references while `sys.getrefcount` looks at it (the list's and the argument's).
    Every holder of its memory (a view, a memoryview, a torch tensor from `from_numpy`) keeps a
    reference, so an array in use is never handed out again; at worst one is not reused.
    """

    # One state's vectors (θ, momentum, aggregate). A step holds the old state and the new one
    # together anyway, so keeping that many between steps adds nothing to the peak memory.
    KEEP = 3

    def __init__(self) -> None:
        self._vectors: list[np.ndarray] = []

    def retire(self, *vectors: np.ndarray | None) -> None:
        """Keep `vectors` (whole arrays that own their memory; None is skipped) for a later `take`;
        drop the oldest beyond KEEP."""
        self._vectors.extend(v for v in vectors if v is not None and v.base is None and v.flags.owndata)
        del self._vectors[: max(0, len(self._vectors) - self.KEEP)]

    def take(self, numel: int) -> np.ndarray:
        """An uninitialised float32 vector of `numel` values: a retired one nobody holds, else a new one."""
        for i in range(len(self._vectors)):
            if self._vectors[i].size == numel and sys.getrefcount(self._vectors[i]) == 2:
                return self._vectors.pop(i)
        return np.empty(numel, dtype=F32)


def author_key(author: Author) -> bytes:
    """The bytes authors are ordered by: a public key as is, a name by its UTF-8 encoding."""
    return author if isinstance(author, bytes) else author.encode("utf-8")
