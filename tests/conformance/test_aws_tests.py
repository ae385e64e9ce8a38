"""nki-library's own test cases through the interpreter: the `test_manager` stand-in runs
an AWS `KernelArgs` and checks its golden outputs; on a real checkout (skipped without
/work/ext) AWS's cumsum tests are collected by pytest and pass."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nki_kernels.conformance import aws_tests, loader
from nki_kernels.conformance.aws_tests import CaseResult, InterpreterOrchestrator

HERE = Path(__file__).parent
FAKE_LIB = HERE / "fake_checkout"
REAL_LIB = Path("/work/ext/aws-neuron+nki-library")


def _kernel_args(golden, lnc=1, rtol=1e-5, atol=1e-6):
    scale = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "scale")
    params = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "ScaleParams")()
    x = np.arange(130 * 8, dtype=np.float32).reshape(130, 8) / 100
    return SimpleNamespace(
        kernel_func=scale,
        compiler_input=SimpleNamespace(logical_nc_config=lnc, platform_target="trn2"),
        kernel_input={"x": x, "params": params},
        validation_args=SimpleNamespace(
            golden_output=golden(x), relative_accuracy=rtol, absolute_accuracy=atol
        ),
    )


def test_the_orchestrator_runs_the_case_and_accepts_its_golden():
    with loader.checkout_context(FAKE_LIB):
        InterpreterOrchestrator().execute(_kernel_args(lambda x: {"out": x * 2.0}))


def test_a_wrong_golden_fails_with_the_tolerance_and_error():
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(lambda x: {"out": x * 2.0 + 0.5}))
    assert "outside rtol=1e-05 x max|golden| + atol=1e-06" in str(e.value)
    assert "max |err| 0.5, 0 NaN mismatches" in str(e.value)


def test_the_tolerance_is_relative_to_the_largest_golden_value():
    """AWS's criterion: |got - want| <= atol + rtol * max|want| (not per element)."""

    def golden(x):  # off by 1e-4 * max everywhere: fine for rtol 2e-4 of the maximum
        return {"out": x * 2.0 + float(np.abs(x * 2.0).max()) * 1e-4}

    with loader.checkout_context(FAKE_LIB):
        InterpreterOrchestrator().execute(_kernel_args(golden, rtol=2e-4))


def test_a_lazy_golden_is_computed_and_a_count_mismatch_named():
    lazy = lambda x: SimpleNamespace(output_ndarray={"a": x, "b": x}, golden={"a": x, "b": x})  # noqa: E731
    with loader.checkout_context(FAKE_LIB), pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(_kernel_args(lazy))
    assert "kernel returned 1 outputs, golden has 2" in str(e.value)


def test_table_counts_every_status():
    rs = [
        CaseResult("test/integration/a.py::t[1]", "pass"),
        CaseResult("test/integration/a.py::t[2]", "rejected", "rule X | y"),
        CaseResult("test/integration/a.py::t[3]", "skipped", "large shape"),
    ]
    text = aws_tests.table(rs)
    assert "| `a.py::t[2]` | rejected | rule X \\| y |" in text
    assert text.endswith("1 of 2 cases run pass (pass 1, rejected 1, skipped 1).")


@pytest.mark.skipif(not REAL_LIB.exists(), reason="needs the nki-library checkout")
def test_aws_cumsum_fast_cases_pass_against_their_golden():
    mod = REAL_LIB / "test/integration/nkilib/core/cumsum/test_cumsum.py"
    results = aws_tests.run_all(REAL_LIB, [mod], timeout_s=300)
    assert len(results) == 3 and {r.status for r in results} == {"pass"}, results
