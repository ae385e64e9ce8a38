"""The tuner's hardware measurer writes hwcheck's measured-row format (fake device clock:
nothing here runs on hardware)."""

from __future__ import annotations

import pytest

from nki_kernels.autotune.measure import HardwareMeasurer
from nki_kernels.perfmodel.measurements import MeasuredRow, load_rows
from nki_kernels.runtime import lnc as runtime_lnc
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyProblem, make_toy


@pytest.mark.parametrize("lnc", [1, 2])
def test_each_hardware_measurement_is_a_measured_row(tmp_path, lnc):
    durations = iter([4e-6, 2e-6, 3e-6])  # seconds on a fake clock, one per timed run
    now = [0.0]

    def launcher(problem, config, target):
        def run():
            now[0] += next(durations, 0.0)

        return run

    toy = make_toy()
    tunable = type(toy)(**{**toy.__dict__, "device_launcher": launcher})
    out = tmp_path / "rows.jsonl"
    runtime_lnc.set_runtime_lnc(lnc)
    try:
        m = HardwareMeasurer(warmup=0, repeats=3, clock=lambda: now[0], rows=out)
        res = m.measure(tunable, ToyProblem(128, 512), ToyConfig(), TRN2)
    finally:
        runtime_lnc.set_runtime_lnc(None)
    (row,) = load_rows(out)
    assert MeasuredRow.from_dict(res.details["row"]) == row
    assert row.latency_ns["median"] == pytest.approx(res.latency_ns)
    assert (row.latency_ns["min"], row.latency_ns["max"]) == pytest.approx((2e3, 4e3))
    assert row.lnc == lnc and row.target == "trn2" and row.kernel == "toy_kernel"
    assert row.kernel_hash == tunable.source_hash()
    assert row.shape == {"rows": 128, "cols": 512} and row.dtype == tunable.dtype(
        ToyProblem(128, 512)
    )
    assert row.config == ToyConfig().to_dict() and row.modeled_ns is None
