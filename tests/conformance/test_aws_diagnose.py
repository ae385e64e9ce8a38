"""A wrong AWS MX case is re-run under the interpreter's compatibility settings, and the
case names the setting under which it matches (it stays `wrong`)."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.conformance import aws_diagnose, aws_tests
from nki_kernels.conformance.aws_tests import InterpreterOrchestrator
from nki_kernels.interp import nisa, nl, run, settings


def quantize(x):
    src = nl.ndarray((32, 16), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    q = nl.ndarray((32, 4), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    sc = nl.ndarray((32, 4), nl.uint8, buffer=nl.sbuf)  # 28 of its 32 partitions: unwritten
    nisa.quantize_mx(dst=q, src=src, dst_scale=sc)
    qo = nl.ndarray(q.shape, q.dtype, buffer=nl.shared_hbm)
    so = nl.ndarray(sc.shape, sc.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=qo, src=q)
    nisa.dma_copy(dst=so, src=sc)
    return qo, so


X = np.random.default_rng(3).standard_normal((32, 16)).astype(ml_dtypes.bfloat16)


def _golden(**extra):
    with settings(**extra):
        qo, so = run(quantize, X.copy(), target="trn3").outputs
    return {"q": qo, "scale": so}  # packed words compare as their values (host_float32)


def _execute(golden):
    args = SimpleNamespace(
        kernel_func=quantize,
        compiler_input=SimpleNamespace(logical_nc_config=1, platform_target="trn3"),
        kernel_input={"x": X.copy()},
        validation_args=SimpleNamespace(
            golden_output=golden, relative_accuracy=0.0, absolute_accuracy=0.0
        ),
    )
    with pytest.raises(AssertionError) as e:
        InterpreterOrchestrator().execute(args)
    return str(e.value)


def test_a_golden_with_the_ocp_scale_and_zeroed_slots_is_named_pre_05():
    msg = _execute(_golden(mx_scale="pre-0.5", fresh_memory="zero"))
    assert msg.startswith("wrong under NKI 0.6; matches the pre-0.5 scale, with zeros in memory")
    assert "output 'q'" in msg  # the NKI 0.6 mismatch is kept after the reason


def test_a_golden_that_only_reads_zeros_where_nothing_wrote_is_named_so():
    msg = _execute(_golden(fresh_memory="zero"))
    assert msg.startswith("wrong: the golden expects zeros in memory no instruction wrote")
    assert "output 'scale'" in msg


def test_a_golden_no_setting_matches_stays_a_plain_mismatch():
    golden = _golden(fresh_memory="zero")
    golden["scale"] = golden["scale"] + 1
    msg = _execute(golden)
    assert msg.startswith("output 'scale'") and aws_diagnose.PRE_05 not in msg


def test_the_reasons_count_as_wrong_not_error():
    for _, reason in aws_diagnose.ATTEMPTS:
        crash = SimpleNamespace(message=f"AssertionError: {reason} (output 'q': ...)")
        report = SimpleNamespace(
            nodeid="t::c", skipped=False, passed=False, duration=0.1, longrepr=crash
        )
        report.longrepr.reprcrash = crash
        assert aws_tests._classify(report).status == "wrong"
