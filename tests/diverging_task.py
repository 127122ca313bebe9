"""A user task (``tests.diverging_task:build``) whose model diverges at once: one weight is infinite.

Its settings are all valid, so `run create` and `run join` accept it; its first inner step gives a
non-finite loss. The daemon tests use it to show a run that diverges stopping with a message.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from locomesh.training.tasks import SyntheticLM

ENTRY_POINT = "tests.diverging_task:build"


class DivergingLM(SyntheticLM):
    def build_model(self, seed: int) -> torch.nn.Module:
        model = super().build_model(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.view(-1)[0] = math.inf
        return model


def build(config: dict[str, Any]) -> DivergingLM:
    return DivergingLM(config)
