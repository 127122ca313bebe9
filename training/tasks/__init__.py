"""Tasks: model + data + eval behind one interface (`Task`), resolved by name with `get_task`.

Built in: `synthetic-lm` (the default; a Markov source of known entropy), `text-lm` (the user's
own text files, byte by byte) and `llama` (a Llama-family model on a tokenized dataset shared peer
to peer). Any other name of the form `module:function` is a user task: the function is
called with the config and must return a `Task`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .base import Task, TaskError, UnknownConfigKey
from .markov import MarkovSource
from .synthetic import SyntheticLM
from .text import TextLM

DEFAULT_TASK = SyntheticLM.name


def _llama(config: Mapping[str, Any] | None) -> Task:
    from .llama import LlamaTask  # the Llama's modules load with the first run that uses them

    return LlamaTask(config)


BUILTIN_TASKS = {SyntheticLM.name: SyntheticLM, TextLM.name: TextLM, "llama": _llama}

__all__ = ["DEFAULT_TASK", "MarkovSource", "SyntheticLM", "Task", "TaskError", "TextLM", "UnknownConfigKey", "get_task"]


def get_task(name: str = DEFAULT_TASK, config: Mapping[str, Any] | None = None) -> Task:
    """The task called `name` (a built-in, or a `module:function` entry point) with `config`.

    Raises TaskError for an unknown name, an entry point that cannot be loaded or does not return
    a Task, and a config the task rejects.
    """
    if config is not None and not isinstance(config, Mapping):
        raise TaskError(f"task config must be a mapping, got {type(config).__name__}")
    if name in BUILTIN_TASKS:
        return BUILTIN_TASKS[name](config)
    if ":" not in name:
        raise TaskError(f"unknown task {name!r}: not one of {sorted(BUILTIN_TASKS)} nor module:function")
    task = _load_entry_point(name)(dict(config or {}))
    if not isinstance(task, Task):
        raise TaskError(f"entry point {name!r} returned {type(task).__name__}, not a Task")
    return task


def _load_entry_point(name: str):
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TaskError(f"entry point {name!r}: cannot import {module_name!r}: {error}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise TaskError(f"entry point {name!r}: {module_name} has no callable {attribute!r}")
    return function
