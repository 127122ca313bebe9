"""A run's settings, checked in one place: the hyperparameters of its genesis manifest and its task.

`RoundSettings.from_hparams` is the one check of a manifest's ``hparams``: every key must be one
this module knows (`RULES`), every value of the right type and in range (numbers finite), the codec
and the aggregator ones a run can use. `check_run_settings` adds the task (its name and config, by
building it). `run create` runs both before it signs anything, a joiner runs them on every manifest
it is handed, and the participant is built from what they return, so a run that one peer accepts is
one every peer can train.

The errors are `ParticipantError`s (a run this peer cannot train) whose message names the setting
and what it allows. `TrainingDiverged` is the one raised while training: a run whose settings are
valid can still diverge (a too large learning rate for its model), and that stops this peer's part
in it with a message instead of a payload nobody could decode.

No torch here (the task check imports it on first use): the daemon checks settings long before it
trains.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Callable

from .aggregators import AGGREGATORS
from .codec import MODES
from .outer import OuterConfig
from .shards import DEFAULT_SHARD_VALUES

# "off" is the default: a committee member runs (set size + 1) x scoring_batches forward passes a
# round (for the default task with 4 batches, ~1.3 inner steps' worth per contribution: a whole
# round's training at ~35 contributors) on CPU it shares with the next round's training, so a
# run opts in. Only "report" so far: weighing the aggregate by scores needs the scores agreed on
# before the outer step, which this does not do yet.
SCORING_POLICIES = ("off", "report")


class ParticipantError(ValueError):
    """A run's settings or a shared state this peer cannot use."""


class RunSettingsError(ParticipantError):
    """A run setting that is unknown, of the wrong type or out of range; the message names it."""


class TrainingDiverged(ParticipantError):
    """The inner steps gave a non-finite loss or pseudo-gradient: nothing to contribute, ever again
    from this state."""


def _no_required_options(function: Callable[..., Any]) -> bool:
    parameters = list(inspect.signature(function).parameters.values())[1:]  # after the rows
    return all(parameter.default is not inspect.Parameter.empty for parameter in parameters)


# A run names its aggregator only, never options: Krum needs `f`, which no setting gives.
RUN_AGGREGATORS = tuple(sorted(name for name, function in AGGREGATORS.items() if _no_required_options(function)))
INNER_OPTIMIZERS = ("adamw",)
EXCHANGES = ("auto", "allgather", "sharded")


@dataclass(frozen=True)
class Rule:
    """What one setting allows: a kind (int, float, bool, or a choice of strings) and, for numbers, a range."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the range excludes `low`
    high_open: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False  # None allowed

    def check(self, key: str, value: Any) -> Any:
        """`value` as the setting's type (an int for a float setting becomes a float), or `RunSettingsError`."""
        if value is None and self.optional:
            return None
        if self.choices:
            if value not in self.choices:
                raise RunSettingsError(f"unknown {key} {_shown(value)}: a run can use {', '.join(self.choices)}")
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise RunSettingsError(f"{key} must be true or false, not {_shown(value)}")
            return value
        return self._number(key, value)

    def _number(self, key: str, value: Any) -> int | float:
        integers_only = self.kind is int
        if isinstance(value, bool) or not isinstance(value, int if integers_only else (int, float)):
            raise RunSettingsError(f"{key} must be {self._describe()}, not {_shown(value)}")
        if not math.isfinite(value) or not self._in_range(value):
            raise RunSettingsError(f"{key} must be {self._describe()}, not {_shown(value)}")
        return value if integers_only else float(value)

    def _in_range(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def _describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        span = f"{what} in {left}{_number(self.low)}, {_number(self.high)}{right}"
        return span + " or null" if self.optional else span


def _number(value: float | None) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # `:g` would round a large integer bound


def _shown(value: Any) -> str:
    return repr(value)[:60]


def _integer(low: int, high: int) -> Rule:
    return Rule(int, low, high)


def _choice(*choices: str) -> Rule:
    return Rule(str, choices=tuple(choices))


RULES: dict[str, Rule] = {
    "inner_steps": _integer(1, 100_000),
    "inner_optimizer": _choice(*INNER_OPTIMIZERS),
    "inner_lr": Rule(float, 0, 1, low_open=True),
    "batch_size": _integer(1, 4096),
    "outer_lr": Rule(float, 0, 4, low_open=True),
    "outer_momentum": Rule(float, 0, 1, high_open=True),
    "nesterov": Rule(bool),
    "codec": _choice(*MODES),
    "aggregator": _choice(*RUN_AGGREGATORS),
    "max_update_norm": Rule(float, 0, 1e9, low_open=True, optional=True),
    "byzantine_fraction": Rule(float, 0, 0.5, high_open=True),
    # How a round's payloads are exchanged (node/exchange/mode.py): "auto" shards once that costs
    # a member fewer bytes than fetching every payload.
    "exchange": _choice(*EXCHANGES),
    # Values a shard of sharded exchange holds (training/shards.py: rounded up to whole codec blocks).
    "shard_values": _integer(1024, 1 << 24),
    "round_deadline_s": Rule(float, 1, 86_400),
    "min_peers": _integer(1, 10_000),
    # Attempt deadlines a round may go uncertified before its members sign a recover (more than a
    # third of the electorate gone at once: node/agreement/recovery.py).
    "recover_after": _integer(1, 100),
    "eval_every": _integer(0, 1_000_000),  # evaluate the shared state every this many rounds (0: never)
    "delayed_updates": Rule(bool),  # train round r+1 while round r is exchanged (see training/participant.py)
    # Contribution scores (training/scoring.py, crdt/scores.py): "report" has a committee of each
    # round measure and sign them, for `run status`; they change no aggregate.
    "scoring": _choice(*SCORING_POLICIES),
    "scoring_batches": _integer(1, 64),
    "scoring_batch_size": _integer(1, 1024),
}


@dataclass(frozen=True)
class RoundSettings:
    """The hyperparameters of a run (its genesis manifest's ``hparams``), checked by `from_hparams`."""

    inner_steps: int = 50
    inner_optimizer: str = "adamw"
    inner_lr: float = 3e-3
    batch_size: int = 16
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    codec: str = "int8"
    aggregator: str = "centered_clip"
    max_update_norm: float | None = None
    byzantine_fraction: float = 0.2
    # "allgather" until a member that crashes after its commit cannot cost a sharded round its
    # deadline (docs/design-notes.md, "Sharded exchange": known limits); "auto" and "sharded" are there to choose.
    exchange: str = "allgather"
    shard_values: int = DEFAULT_SHARD_VALUES
    round_deadline_s: float = 600.0
    min_peers: int = 1  # a round starts once this many peers are eligible for it
    recover_after: int = 3
    eval_every: int = 1
    delayed_updates: bool = False
    scoring: str = "off"
    scoring_batches: int = 4
    scoring_batch_size: int = 16

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> RoundSettings:
        """The settings `hparams` names (defaults for the others); `RunSettingsError` for an unknown
        key or a bad value."""
        if not isinstance(hparams, Mapping):
            raise RunSettingsError("hparams must be a map of setting: value")
        unknown = sorted(str(key) for key in hparams if key not in RULES)
        if unknown:
            raise RunSettingsError(f"unknown run setting {unknown[0][:60]!r} (known: {', '.join(RULES)})")
        return cls(**{key: RULES[key].check(key, value) for key, value in hparams.items()})

    def outer_config(self) -> OuterConfig:
        return OuterConfig(
            lr=self.outer_lr,
            momentum=self.outer_momentum,
            nesterov=self.nesterov,
            aggregator=self.aggregator,
            max_update_norm=self.max_update_norm,
            codec=self.codec,
        )


assert set(RULES) == {field.name for field in fields(RoundSettings)}, "each setting has one rule"


def default_hparams() -> dict[str, Any]:
    """What a new run's manifest holds before `run create --set` changes it: every setting with a default value."""
    defaults = RoundSettings()
    return {key: getattr(defaults, key) for key in RULES if getattr(defaults, key) is not None}


def check_task(name: Any, config: Any) -> Any:
    """The task `name` built with `config` (the check that a peer can train it), or `RunSettingsError`."""
    from .tasks import TaskError, UnknownConfigKey, get_task  # torch: only when a task is checked

    if not isinstance(name, str) or not name:
        raise RunSettingsError("the task must be a name")
    try:
        return get_task(name, config)
    except UnknownConfigKey as error:
        raise RunSettingsError(unknown_setting(error.task, error.key, error.known)) from None
    except TaskError as error:
        raise RunSettingsError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - a user task's entry point is code we do not know
        raise RunSettingsError(f"task {name[:80]!r} could not be built: {type(error).__name__}: {error}") from None


def unknown_setting(task: str, key: str, task_keys: list[str]) -> str:
    """Why `key` is refused, for a person who typed ``--set key=...``: `run create` sends the keys
    it does not know as run settings to the task, so the task's refusal must list the run's
    settings too, the closest first."""
    close = closest_keys(key, [*RULES, *task_keys])
    hint = f"did you mean {' or '.join(repr(name) for name in close)}? " if close else ""
    return (f"unknown setting {key[:60]!r}: {hint}(run settings: {', '.join(RULES)}; "
            f"task {task!r} settings: {', '.join(task_keys)})")


def closest_keys(key: str, known: list[str]) -> list[str]:
    """The known keys `key` was likely meant as: close in spelling (difflib; at 0.7, not its
    default 0.6, which offers inner_lr for inner_step), or having it as a word ("lr" -> inner_lr,
    outer_lr); at most three, closest first."""
    import difflib

    words = [name for name in known if key in name.split("_")]
    return list(dict.fromkeys([*difflib.get_close_matches(key, known, n=3, cutoff=0.7), *words]))[:3]


def check_run_settings(task: Any, task_config: Any, hparams: Mapping[str, Any]) -> tuple[RoundSettings, Any]:
    """Check a run's hyperparameters and task, as `run create` and every joiner do: (the settings,
    the task built), or `RunSettingsError` naming what is wrong."""
    return RoundSettings.from_hparams(hparams), check_task(task, task_config)
