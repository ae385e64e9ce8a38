"""The golden-batch parity harness (`nki-kernels parity`): the same seed and data order
on the reference path and on the NKI path, a tolerance fixed from the noise floor before
the run, the first divergent step, non-finite gradients and a save / reload / continue
check; a JSON report and a plot. See `harness.py`."""

from __future__ import annotations

from .harness import Report, Run, run_parity, tolerance_for

__all__ = ["Report", "Run", "run_parity", "tolerance_for"]
