"""Scenarios: each is a module with ``run(*, nodes, seed, progress, **options) -> report dict``,
whose options are the fields of its ``Config`` dataclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from . import checkpoint, connectivity, dht, nat, train

_MODULES = {"connectivity": connectivity, "dht": dht, "checkpoint": checkpoint, "train": train, "nat": nat}
SCENARIOS: dict[str, Callable[..., dict]] = {name: module.run for name, module in _MODULES.items()}
CONFIGS: dict[str, type] = {name: module.Config for name, module in _MODULES.items()}
NOT_OPTIONS = ("nodes",)  # set by run's own keyword (the CLI's --nodes)


def option_defaults(scenario: str) -> dict[str, object]:
    """The options `scenario` takes, each with its default."""
    fields = dataclasses.fields(CONFIGS[scenario])
    return {f.name: f.default for f in fields if f.name not in NOT_OPTIONS}


def parse_options(scenario: str, settings: Iterable[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings -> keyword options for `scenario`'s run, each typed like its default.

    Raises ValueError naming the setting when a key is unknown, a value does not parse as its
    option's type (bool: true/false/yes/no/1/0), or a number is negative or not finite (every
    numeric option is a count, a duration, a size or a rate). A text option takes the text as it
    is; its scenario checks it.
    """
    defaults = option_defaults(scenario)
    options: dict[str, object] = {}
    for setting in settings:
        key, equals, text = setting.partition("=")
        key = key.strip().replace("-", "_")
        if not equals:
            raise ValueError(f"option {setting!r} is not KEY=VALUE")
        if key not in defaults:
            known = ", ".join(f"{name}={value}" for name, value in defaults.items())
            raise ValueError(f"scenario {scenario!r} has no option {key!r}; its options (defaults): {known}")
        options[key] = _parse_value(key, text.strip(), defaults[key])
    return options


def _parse_value(key: str, text: str, default: object) -> object:
    if isinstance(default, bool):
        words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if text.lower() not in words:
            raise ValueError(f"option {key} takes true or false, not {text!r}")
        return words[text.lower()]
    if isinstance(default, str):
        return text
    kind = type(default)
    if kind not in (int, float):
        raise ValueError(f"option {key} cannot be set from the command line")
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"option {key} takes {'an integer' if kind is int else 'a number'}, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"option {key} must be a finite number ≥ 0, not {text!r}")
    return value
