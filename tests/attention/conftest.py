"""Attention tests: config-store fallback warnings are expected (no tuned configs for
every test shape), so they are recorded instead of printed."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_fallback_noise(recwarn: pytest.WarningsRecorder) -> None:
    """Config-store fallback warnings are expected here (no tuned configs shipped)."""
