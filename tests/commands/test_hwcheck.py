"""`nki-kernels hwcheck`: what it says without a device, and -- as a SIMULATION -- its
measure -> rows -> calibrate loop.

The simulated device below runs the kernels in the interpreter (CPU tensors) and uses the
cost model, times a hidden factor, as its clock. It exists only in this test: nothing
here runs on hardware, and no figure it produces is shown to a user.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels import cli
from nki_kernels.commands import hwcheck
from nki_kernels.commands.hwcheck_cases import all_cases, cases_for
from nki_kernels.perfmodel import estimate, registry
from nki_kernels.perfmodel.measurements import load_rows
from nki_kernels.runtime import lnc as runtime_lnc

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

SIMULATED = hwcheck.DeviceInfo(
    device="simulated (interpreter + cost-model clock, test only)",
    torch_device="cpu",
    sdk_version="simulation",
    torch_neuronx_version=None,
)
CLOCK_FACTOR = 1.25  # the simulated device is this much slower than the model says
CALIBRATION = {"matmul_tiled": {"M": 128, "K": 256, "N": 512}}


def simulated_timer(launch: Any, warmup: int, repeats: int) -> list[float]:
    """Samples from the cost model (x CLOCK_FACTOR, +-1 % spread), not from a clock."""
    base = hwcheck.modeled_ns(launch)
    assert base is not None
    return [base * CLOCK_FACTOR * (1 + 0.01 * (i % 3 - 1)) for i in range(repeats)]


def test_without_a_device_it_names_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hwcheck", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "nothing was measured" in err
    for need in hwcheck.NEEDS:
        assert f"  {need}: " in err


def test_unknown_ops_and_bad_counts_are_named() -> None:
    with pytest.raises(ValueError, match=r"--ops: expected some of .*got \['nope'\]"):
        cases_for(["nope"], quick=True)
    assert {c.op for c in all_cases()} == {c.op for c in all_cases(quick=True)}


def test_a_wrong_result_is_reported() -> None:
    case = next(c for c in all_cases(quick=True) if c.op == "rms_norm")
    bad = hwcheck.Case(case.op, case.shape, case.make, lambda i: case.call(i) * 1.05,
                       case.reference, case.reduction)  # fmt: skip
    failures = hwcheck.check_case(bad, "cpu")
    assert failures and failures[0].startswith("rms_norm small [300, 256] bf16: output max")


@pytest.mark.parametrize("lnc", [1, 2])
def test_simulated_measure_rows_calibrate_loop(tmp_path: Any, lnc: int) -> None:
    """SIMULATION: rows of every kernel the ops launched, at the runtime's LNC, with the
    modeled figure beside the 'measured' one; the calibration rows re-price through the
    registry (what `calibrate` fits) and show the simulated clock's factor."""
    runtime_lnc.set_runtime_lnc(lnc)
    try:
        out = tmp_path / "rows.jsonl"
        lines: list[str] = []
        cases = cases_for(["rms_norm", "add_rms_norm"], quick=True)
        code = hwcheck.run_all(cases, SIMULATED, simulated_timer, out, warmup=0, repeats=3,
                               calibration=CALIBRATION, emit=lines.append)  # fmt: skip
    finally:
        runtime_lnc.set_runtime_lnc(None)
    assert code == 0, lines
    rows = load_rows(out)
    kernels = {r.kernel for r in rows}
    # forward and backward kernels of both ops, and the calibration matmul
    assert {"rms_norm_fwd", "add_rms_norm_fwd", "rms_norm_bwd", "matmul_tiled"} <= kernels
    assert {r.lnc for r in rows} == {lnc} and {r.device for r in rows} == {SIMULATED.device}
    for r in rows:
        assert r.modeled_ns is not None
        assert r.latency_ns["median"] == pytest.approx(CLOCK_FACTOR * r.modeled_ns, rel=1e-9)
        assert r.latency_ns["min"] < r.latency_ns["median"] < r.latency_ns["max"]
    (cal,) = [r for r in rows if r.estimable is not None]
    entry = registry.get(cal.estimable)
    args, kwargs = entry.args(cal.shape, cal.dtype)
    repriced = estimate(entry.kernel, *args, target=cal.target, lnc=cal.lnc, **kwargs)
    assert repriced.latency_ns == pytest.approx(cal.modeled_ns, rel=1e-9)
    assert cal.median_ns / repriced.latency_ns == pytest.approx(CLOCK_FACTOR, rel=1e-9)
    assert any("measured (hardware, simulated" in line and "| modeled (cost model" in line
               for line in lines)  # fmt: skip
    # calibrate fits the rows it can re-price (the calibration kernel's) and skips the
    # op kernels, which no registry entry re-builds
    from nki_kernels.perfmodel.calibrate import calibrate

    fit = calibrate(rows, "trn2", source=out.name, with_loo=False)
    (used,) = fit.rows
    assert used.measured_ns == cal.median_ns
    assert used.before_ns == pytest.approx(cal.modeled_ns, rel=1e-6)
    assert len(fit.skipped) == len(rows) - 1


def test_forward_and_backward_of_every_quick_case_pass_on_cpu() -> None:
    """The references and tolerances hwcheck uses accept the kernels (interpreter)."""
    torch.manual_seed(0)
    for case in all_cases(quick=True):
        if case.op in ("flash_attention", "moe_mlp"):
            continue  # slow in the interpreter; their op tests cover them
        assert hwcheck.check_case(case, "cpu") == [], case.op


def test_decode_is_checked_forward_only() -> None:
    """decode_attention (inference-only) is one of hwcheck's ops: forward vs reference."""
    (case,) = cases_for(["decode_attention"], quick=True)
    assert not case.backward
    assert hwcheck.check_case(case, "cpu") == []
    bad = hwcheck.Case(case.op, case.shape, case.make, lambda i: case.call(i) * 1.05,
                       case.reference, case.reduction, backward=False)  # fmt: skip
    assert hwcheck.check_case(bad, "cpu")[0].startswith("decode_attention small")
