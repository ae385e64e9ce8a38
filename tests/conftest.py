"""Suite-wide fixtures: the emulated neuron device.

The device is installed at import time (collection), before any test runs a backward
pass: the autograd engine sizes its per-device queues when it first runs.
"""

from __future__ import annotations

import signal

import pytest
import torch
from hypothesis import HealthCheck, settings
from threadpoolctl import threadpool_limits

from nki_kernels.testing import neuron_device

# The interpreter's matmuls are NumPy/BLAS calls on small tiles: on a 2-core machine a
# multi-threaded BLAS spends more time spinning than computing. One thread each.
threadpool_limits(1)
torch.set_num_threads(1)

EMULATED = neuron_device.install()

# A suite started in the background by a non-interactive shell (`cmd &`) inherits SIGINT
# ignored; Python then installs no KeyboardInterrupt handler and every child process
# inherits the ignore, so the autotuner's Ctrl-C tests would see nothing. Restore the
# interpreter's default (children exec with SIGINT at its default action again).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis profiles of the property-based suite (tests/fuzz), registered here so that
# `--hypothesis-profile` (applied when pytest configures) finds them. `ci` (default, part
# of `make test`): few examples per property, derandomized (reproducible CI runs);
# `fuzz` (`make fuzz`): enough for >= 2,000 cases over the 8 properties, random seeds.
_FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "print_blob": True}
settings.register_profile("ci", max_examples=4, derandomize=True, **_FUZZ)
settings.register_profile("fuzz", max_examples=260, **_FUZZ)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def neuron() -> str:
    """The device name of the emulated neuron device (skips when a real one is present)."""
    if not EMULATED:
        pytest.skip("a real neuron backend is present; these tests need the emulated one")
    return neuron_device.DEVICE_NAME
