"""Suite-wide fixtures: the emulated neuron device.

The device is installed at import time (collection), before any test runs a backward
pass: the autograd engine sizes its per-device queues when it first runs.
"""

from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_limits

from nki_kernels.testing import neuron_device

# The interpreter's matmuls are NumPy/BLAS calls on small tiles: on a 2-core machine a
# multi-threaded BLAS spends more time spinning than computing. One thread each.
threadpool_limits(1)
torch.set_num_threads(1)

EMULATED = neuron_device.install()


@pytest.fixture(scope="session")
def neuron() -> str:
    """The device name of the emulated neuron device (skips when a real one is present)."""
    if not EMULATED:
        pytest.skip("a real neuron backend is present; these tests need the emulated one")
    return neuron_device.DEVICE_NAME
