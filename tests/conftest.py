"""Shared fixtures. Tests are seeded and deterministic; slow ones carry `@pytest.mark.slow`."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("default", deadline=None, derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def identity_factory():
    """Deterministic identities: identity_factory(n) is the same key in every run."""
    from locomesh.protocol import Identity

    def make(index: int) -> Identity:
        return Identity.from_seed(index.to_bytes(4, "big") * 8)

    return make
