"""A scenario's options: the fields of its ``Config`` dataclass, each with its help text.

One source of truth: a field declared with `option` carries its help in its metadata, and
`describe` turns the fields into the text `locomesh sim --help` shows and an unknown ``-o`` key
lists.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

NOT_OPTIONS = ("nodes",)  # set by a scenario's run keyword (the CLI's --nodes)


def option(default: Any, help: str) -> Any:  # argparse's word for it
    """A ``Config`` field with `default`, explained by `help` (what it sets, its unit)."""
    return dataclasses.field(default=default, metadata={"help": help})


def option_fields(config: type) -> list[dataclasses.Field]:
    """The fields of `config` a user sets with ``-o KEY=VALUE``."""
    return [field for field in dataclasses.fields(config) if field.name not in NOT_OPTIONS]


def describe(config: type, indent: str = "  ", width: int = 100) -> list[str]:
    """The options of `config`, each ``KEY=DEFAULT  help`` with the help aligned and wrapped at `width`."""
    fields = option_fields(config)
    settings = [f"{field.name}={_shown(field.default)}" for field in fields]
    column = max((len(setting) for setting in settings), default=0)
    hanging = " " * (len(indent) + column + 2)
    lines = []
    for setting, field in zip(settings, fields):
        first = f"{indent}{setting.ljust(column)}  "
        lines += textwrap.wrap(field.metadata.get("help", ""), width, initial_indent=first,
                               subsequent_indent=hanging) or [first.rstrip()]
    return lines


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default)) if abs(default) >= 1e6 else f"{default:g}"
    return str(default)
