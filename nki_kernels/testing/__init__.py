"""Test support: the emulated `neuron` device, tolerance tables and reference helpers.

`neuron_device.install()` is explicit (it renames PrivateUse1 for the whole process); the
other modules have no side effects.
"""

from __future__ import annotations
