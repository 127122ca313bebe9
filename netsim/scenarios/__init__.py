"""Scenarios: each is a module with ``run(*, nodes, seed, progress, **options) -> report dict``,
whose options are the fields of its ``Config`` dataclass (declared with `options.option`, which
carries each one's help), and whose docstring's first line says what it shows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from . import checkpoint, connectivity, dht, directory, nat, soak, train
from .options import describe, option_fields

_MODULES = {"connectivity": connectivity, "dht": dht, "directory": directory, "checkpoint": checkpoint, "train": train,
            "nat": nat, "soak": soak}
SCENARIOS: dict[str, Callable[..., dict]] = {name: module.run for name, module in _MODULES.items()}
CONFIGS: dict[str, type] = {name: module.Config for name, module in _MODULES.items()}


class UnknownOption(ValueError):
    """An ``-o`` key the scenario does not have (`key`); its message lists the options and defaults."""

    def __init__(self, scenario: str, key: str, known: str) -> None:
        super().__init__(f"scenario {scenario!r} has no option {key!r}; its options (defaults): {known}")
        self.scenario, self.key = scenario, key


def option_defaults(scenario: str) -> dict[str, object]:
    """The options `scenario` takes, each with its default."""
    return {field.name: field.default for field in option_fields(CONFIGS[scenario])}


def shows(scenario: str) -> str:
    """What `scenario` shows, in a line (its module docstring's first line, less the name)."""
    first = (_MODULES[scenario].__doc__ or "").strip().splitlines()[0]
    return first.partition(": ")[2] or first


def scenario_help(scenario: str) -> list[str]:
    """`scenario`'s name, what it shows, and its options with defaults and help, as lines."""
    return [f"{scenario}: {shows(scenario)}", *describe(CONFIGS[scenario], indent="    -o ")]


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
            raise UnknownOption(scenario, key, known)
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
