"""What `run create` does with the files a run starts from: its initial weights and its dataset.

- `--init PATH` (the llama task): a transformers checkpoint directory (config.json and
  safetensors) or one .safetensors file. Every tensor's name and shape is checked against the
  model before a byte of it is read (training/llama/hf.py); the weights are stored as an `init`
  checkpoint in the node's store (which shares it with every peer, like a dataset) and the run's
  task config names it by ID. A directory's config.json gives the model's shape: a setting that
  disagrees with it is refused, so the run trains the model the file holds.
- `--set dataset=ID`: held here (it was packed here), the dataset's tokenizer must fit the
  model's vocabulary, checked now rather than by every joiner.

Blocking (files, hashes): the daemon runs these in a worker thread.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from locomesh.node.datasets.store import load_index
from locomesh.node.transfer.store import has_checkpoint, write_checkpoint
from locomesh.training.run_settings import RunSettingsError, check_task

INIT_TASK = "llama"


def store_initial_weights(directory: str | os.PathLike, path: str, task: str, task_config: dict[str, Any]) -> dict[str, Any]:
    """Store the weights at `path` as the `init` checkpoint of a run of `task`; the task config
    naming it (and, from a checkpoint directory, the model's shape). `RunSettingsError` for a file
    the model cannot start from."""
    from locomesh.training.llama.hf import LlamaCheckpointError, read_pretrained  # torch: only here
    from locomesh.training.llama.model import LlamaConfig
    from locomesh.training.participant import INIT_KIND

    if task != INIT_TASK:
        raise RunSettingsError(f"only the {INIT_TASK} task starts from a weights file, not {task!r:.80}")
    if "init" in task_config:
        raise RunSettingsError("give the initial weights either as --init PATH or as init=ID, not both")
    config = dict(task_config)
    try:
        if Path(path).is_dir():
            model_config, tensors = read_pretrained(path)
            config.update(_shape_settings(model_config, task_config, [f.name for f in fields(LlamaConfig)]))
        else:
            model_config, tensors = read_pretrained(path, check_task(task, config).model_config)
    except LlamaCheckpointError as error:
        raise RunSettingsError(f"--init {path}: {error}") from None
    metadata = {"round": 0, "run": b"", "kind": INIT_KIND}
    return {**config, "init": write_checkpoint(directory, tensors, metadata).id.hex()}


def _shape_settings(model_config: Any, task_config: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The task settings of `model_config`'s shape; `RunSettingsError` where `task_config` says otherwise."""
    shape = {name: getattr(model_config, name) for name in names if name != "initializer_range"}
    for name, value in shape.items():
        if name in task_config and task_config[name] != value:
            raise RunSettingsError(f"{name}={task_config[name]!r:.40} disagrees with the checkpoint's {value!r}")
    return {name: value for name, value in shape.items() if value is not None}


def check_local_dataset(directory: str | os.PathLike, task: Any) -> None:
    """If the dataset of `task` (a built task) is held here, check that the model can embed its
    tokenizer's vocabulary; `RunSettingsError` if not. A dataset held elsewhere is checked by each joiner."""
    from locomesh.training.tasks import TaskError  # the task is built: torch is loaded

    dataset = getattr(task, "dataset_id", None)
    if dataset is None or not has_checkpoint(directory, dataset):
        return
    try:
        task.check_vocabulary(load_index(directory, dataset))
    except TaskError as error:
        raise RunSettingsError(str(error)) from None
