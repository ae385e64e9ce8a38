"""Measurers (hardware timing logic with a fake device; selection) and output comparison."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.autotune.gate import compare
from nki_kernels.autotune.measure import (
    CostModelMeasurer,
    HardwareMeasurer,
    hardware_available,
    select_measurer,
)
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyProblem, make_toy


def test_hardware_measurer_reports_the_median_after_warmup():
    runs = []
    # each timed run takes (1, 5, 2, 9, 3) seconds of a fake clock
    durations = iter([1, 5, 2, 9, 3])
    now = [0.0]

    def clock() -> float:
        return now[0]

    def launcher(problem, config, target):
        def run():
            runs.append(config)
            if len(runs) > 2:  # after the 2 warm-up runs, advance the clock
                now[0] += next(durations)

        return run

    toy = make_toy()
    tunable = type(toy)(**{**toy.__dict__, "device_launcher": launcher})
    m = HardwareMeasurer(warmup=2, repeats=5, clock=clock)
    res = m.measure(tunable, ToyProblem(128, 512), ToyConfig(), TRN2)
    assert len(runs) == 7
    assert res.latency_ns == pytest.approx(3e9)  # median of 1, 5, 2, 9, 3 seconds
    assert res.label == "measured (hardware)"
    assert res.details["spread_ns"] == pytest.approx(8e9)


def test_hardware_measurer_needs_a_launcher_and_sane_counts():
    with pytest.raises(RuntimeError, match="no device launcher"):
        HardwareMeasurer().measure(make_toy(), ToyProblem(128, 512), ToyConfig(), TRN2)
    with pytest.raises(ValueError, match="repeats"):
        HardwareMeasurer(repeats=0)


def test_measurer_selection_without_a_device():
    assert not hardware_available()  # no Neuron toolchain or device here
    assert isinstance(select_measurer("auto"), CostModelMeasurer)
    with pytest.raises(RuntimeError, match="'hardware' needs the Neuron nki package"):
        select_measurer("hardware")
    with pytest.raises(ValueError, match="measurer: expected"):
        select_measurer("stopwatch")


def test_compare_checks_shape_nonfinite_and_per_output_tolerance():
    ref = np.array([1.0, 2.0, 3.0])
    ok, reason, worst = compare([ref + 1e-4], [ref], (1e-3, 0.0))
    assert ok and reason == "" and worst == pytest.approx(1e-4)
    ok, reason, _ = compare([ref + 1e-2], [ref], (1e-3, 0.0))
    assert not ok and "3 of 3 elements outside atol=0.001" in reason
    ok, reason, _ = compare([np.array([1.0, np.nan, 3.0])], [ref], (1.0, 1.0))
    assert not ok and "non-finite value nan at (1,)" in reason
    ok, reason, _ = compare([ref[:2]], [ref], (1.0, 1.0))
    assert not ok and "shape (2,) differs" in reason
    # one pair per output: the second output gets the looser tolerance
    ok, _, _ = compare([ref, ref + 0.5], [ref, ref], [(1e-6, 0.0), (1.0, 0.0)])
    assert ok
    # -inf in both (empty attention rows) is not an error
    ok, _, _ = compare([np.array([-np.inf, 1.0])], [np.array([-np.inf, 1.0])], (0.0, 0.0))
    assert ok
