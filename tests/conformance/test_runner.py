"""The conformance runner sorts each case into pass / wrong / rejected / missing-API /
error, and prints the table. Uses small kernels of our own laid out like the checkouts;
the runs on real checkouts skip when /work/ext is absent (CI)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from nki_kernels.cli import main
from nki_kernels.conformance.runner import Case, compare, import_table, run_case, table

HERE = Path(__file__).parent
FAKE_LIB = HERE / "fake_checkout"
MOD = "nkilib.core.scale.scale"
MISC = "nkilib.core.scale.scale_misc"
REAL_SDK = Path("/work/ext/aws-neuron+aws-neuron-sdk")
REAL_LIB = Path("/work/ext/aws-neuron+nki-library")


def _x(rng):
    return (rng.standard_normal((130, 8)).astype(np.float32),), {}


def _ref(factor):
    def reference(ctx, args, kwargs):
        return ctx.load("nkilib.core.scale.scale_torch", "scale_ref")(args[0], factor)

    return reference


def test_a_matching_kernel_passes_against_the_checkouts_reference():
    out = run_case(FAKE_LIB, Case("scale", "130x8", MOD, "scale_kernel", _x, _ref(3.0)))
    assert out.status == "pass" and out.instructions > 0, out


def test_a_mismatch_is_wrong_with_the_error():
    out = run_case(FAKE_LIB, Case("scale", "130x8", MOD, "scale_kernel", _x, _ref(2.0)))
    assert out.status == "wrong" and "max |err|" in out.detail


@pytest.mark.parametrize(
    "attr, status, words",
    [
        ("too_many_partitions", "rejected", "rule TC1"),
        ("uses_rand", "missing-API", "nki.language.rand"),
        ("python_error", "error", "AttributeError at scale_misc.py"),
    ],
)
def test_failures_are_sorted_and_named(attr, status, words):
    out = run_case(FAKE_LIB, Case("misc", attr, MISC, attr, _x, _ref(1.0)))
    assert out.status == status and words in out.detail, out


def test_an_expected_rejection_passes_and_an_unexpected_run_does_not():
    ok = run_case(FAKE_LIB, Case("m", "c", MISC, "too_many_partitions", _x, expect_rule="TC1"))
    assert ok.status == "pass"
    ran = run_case(FAKE_LIB, Case("s", "c", MOD, "scale_kernel", _x, expect_rule="TC1"))
    assert ran.status == "wrong" and "expected" in ran.detail


def test_import_failures_name_the_cause(tmp_path):
    root = tmp_path / "lib"
    shutil.copytree(FAKE_LIB, root)
    pkg = root / "src" / "nkilib_src" / "nkilib" / "core" / "scale"
    (pkg / "broken.py").write_text("def f(:\n    pass\n")
    (pkg / "needs_pkg.py").write_text("import package_that_is_not_installed\n")
    text = import_table(root)
    assert "syntax error in the checkout: scale/broken.py:1" in text
    assert "no module named 'package_that_is_not_installed'" in text
    assert "2 of 4 kernel modules import." in text
    # each failure kind says what to do next
    assert "What to do:\n- error: an import or Python error in the checkout" in text


def test_compare_and_table():
    ok, detail = compare((np.ones(3),), (np.ones(3) + 1e-3,), 1e-2, 1e-2)
    assert ok and detail.startswith("max |err|")
    ok, detail = compare(np.full(2, np.nan), np.zeros(2), 1e-2, 1e-2)
    assert not ok and "NaN" in detail
    out = run_case(FAKE_LIB, Case("scale", "130x8", MOD, "scale_kernel", _x, _ref(3.0)))
    text = table([out])
    assert "| `scale` | 130x8 | pass |" in text and "1 of 1 cases pass (pass 1)." in text
    assert "What to do" not in text


def test_the_cli_refuses_a_path_that_is_no_checkout(tmp_path, capsys):
    assert main(["conformance", str(tmp_path)]) == 2
    assert "checkout_root" in capsys.readouterr().err


@pytest.mark.skipif(not REAL_SDK.is_dir(), reason="needs a local aws-neuron-sdk checkout")
def test_the_cli_runs_sdk_examples(capsys):
    assert main(["conformance", str(REAL_SDK), "--kernel", "nki_matmul_basic_"]) == 0
    assert "| `nki_matmul_basic_` | 64x128 @ 128x512 bf16 | pass |" in capsys.readouterr().out


@pytest.mark.skipif(not REAL_LIB.is_dir(), reason="needs a local nki-library checkout")
def test_the_cli_runs_nki_library_kernels(capsys):
    assert main(["conformance", str(REAL_LIB), "--kernel", "cumsum"]) == 0
    assert "| `cumsum` | (4, 300) fp32 axis -1 | pass |" in capsys.readouterr().out


def test_a_subkernel_runs_inside_a_wrapper_kernel():
    from nki_kernels.nki import nisa, nl

    def wrap(fn):
        def kernel(x):
            t = nl.ndarray(x.shape, x.dtype)
            nisa.dma_copy(dst=t, src=x)
            o = nl.ndarray(x.shape, x.dtype)
            fn(t, o)
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=o)
            return out

        return kernel

    def build(rng):
        return (rng.standard_normal((64, 8)).astype(np.float32),), {}

    out = run_case(FAKE_LIB, Case("d", "c", MISC, "double_into", build,
                                  lambda ctx, a, k: 2 * a[0], wrap=wrap))  # fmt: skip
    assert out.status == "pass", out
