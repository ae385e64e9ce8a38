"""Suite-wide fixtures: the emulated neuron device.

The device is installed at import time (collection), before any test runs a backward
pass: the autograd engine sizes its per-device queues when it first runs.
"""

from __future__ import annotations

import pytest

from nki_kernels.testing import neuron_device

EMULATED = neuron_device.install()


@pytest.fixture(scope="session")
def neuron() -> str:
    """The device name of the emulated neuron device (skips when a real one is present)."""
    if not EMULATED:
        pytest.skip("a real neuron backend is present; these tests need the emulated one")
    return neuron_device.DEVICE_NAME
