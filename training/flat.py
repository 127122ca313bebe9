"""Model parameters as one flat float32 vector: the unit that DiLoCo encodes, aggregates and hashes.

The order is `model.parameters()` order (tied weights appear once), so two models built from the
same task and config agree on what each coordinate means.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def param_count(model: nn.Module) -> int:
    """Number of scalars in the flat vector of `model`."""
    return sum(parameter.numel() for parameter in model.parameters())


def flatten(model: nn.Module) -> np.ndarray:
    """A new float32 1-D copy of every parameter of `model`, in `model.parameters()` order. Each
    parameter is copied straight into its place (a `torch.cat` and a copy of it held the model
    three times over for a moment)."""
    flat = np.empty(param_count(model), dtype=np.float32)
    target = torch.from_numpy(flat)
    offset = 0
    with torch.no_grad():
        for parameter in model.parameters():
            size = parameter.numel()
            target[offset : offset + size].copy_(parameter.detach().reshape(-1))
            offset += size
    return flat


def unflatten_into(model: nn.Module, vector: np.ndarray) -> None:
    """Copy `vector` back into the parameters of `model`, bit for bit.

    Raises ValueError if `vector` is not a float32 1-D array of exactly `param_count(model)` values.
    """
    expected = param_count(model)
    if vector.dtype != np.float32 or vector.ndim != 1 or vector.size != expected:
        raise ValueError(
            f"expected a float32 vector of {expected} values, got {vector.dtype} {vector.shape}"
        )
    source = torch.from_numpy(np.ascontiguousarray(vector))
    offset = 0
    with torch.no_grad():
        for parameter in model.parameters():
            size = parameter.numel()
            parameter.copy_(source[offset : offset + size].view_as(parameter))
            offset += size
