"""locomesh.training.llama: a Llama-family decoder (`model`) and Hugging Face-compatible
safetensors checkpoints (`hf`): read transformers' Llama checkpoints, export ones it loads."""

from .hf import (
    LlamaCheckpointError,
    config_from_hf,
    config_to_hf,
    expected_layout,
    export_files,
    load_into,
    read_pretrained,
)
from .model import LLAMA_PRESETS, Llama, LlamaConfig

__all__ = [
    "LLAMA_PRESETS",
    "Llama",
    "LlamaCheckpointError",
    "LlamaConfig",
    "config_from_hf",
    "config_to_hf",
    "expected_layout",
    "export_files",
    "load_into",
    "read_pretrained",
]
