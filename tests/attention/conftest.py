"""Attention tests: shared tolerance table and single-threaded host math.

The interpreter does each matmul with NumPy/BLAS; on a small shared machine a
multi-threaded BLAS spends far more time spinning than computing on the tiny tiles
these tests use, so its thread pool is pinned to one thread for this directory.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np
import pytest
import torch


def _single_thread_blas() -> None:
    libs = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")
    for path in glob.glob(libs):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                break


_single_thread_blas()
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_fallback_noise(recwarn: pytest.WarningsRecorder) -> None:
    """Config-store fallback warnings are expected here (no tuned configs shipped)."""
