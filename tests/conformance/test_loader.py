"""The loader imports AWS-style kernel modules unmodified with `nki` mapped to the
interpreter. Uses small kernels of our own laid out like the checkouts; the test on the
real checkout skips when /work/ext is absent (CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from nki_kernels.conformance import loader
from nki_kernels.interp import Kernel, TensorSpec, run

HERE = Path(__file__).parent
FAKE_LIB = HERE / "fake_checkout"
FAKE_SDK = HERE / "fake_sdk"
REAL_LIB = Path("/work/ext/aws-neuron+nki-library")


def test_load_module_maps_nki_and_runs_the_kernel():
    mod = loader.load_module(FAKE_LIB, "nkilib.core.scale.scale")
    x = np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32)
    np.testing.assert_allclose(mod.scale_kernel(x), x * 3.0, rtol=1e-6)
    assert list(loader.kernels(mod)) == ["scale_kernel"]


def test_a_plain_function_wrapped_with_jit_runs_trace_only():
    fn = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "scale")
    params = loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "ScaleParams")
    k = loader.jit(fn)
    assert isinstance(k, Kernel) and loader.jit(k) is k
    res = run(k, TensorSpec((300, 16), "bfloat16"), params(), trace_only=True)
    assert res.outputs == TensorSpec((300, 16), "float32")
    assert res.trace.count(opcode="tensor_scalar") == 3  # 128 + 128 + 44 rows


def test_the_mapping_is_scoped():
    assert "nki" not in sys.modules or not hasattr(sys.modules["nki"], "Kernel")
    with loader.mapped_nki():
        import nki.language  # noqa: F401 - the interpreter's

        assert sys.modules["nki.language"].NKIObject is not None
    assert "nki.language" not in sys.modules or sys.modules["nki.language"].__name__ != (
        "nki_kernels.interp.language"
    )


def test_sdk_examples_load_by_path_and_import_their_siblings():
    mod = loader.load_module(FAKE_SDK, "scaling.scaling_numpy_check")
    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(mod.KERNEL(x), 2 * x)


def test_module_names_skip_references_and_packages():
    assert loader.module_names(FAKE_LIB) == [
        "nkilib.core.scale.scale",
        "nkilib.core.scale.scale_misc",
    ]
    assert loader.checkout_kind(FAKE_SDK) == "sdk"


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkout_root"):
        loader.load_module(tmp_path, "nkilib.x")
    with pytest.raises(ValueError, match="dotted_name"):
        loader.load_module(FAKE_LIB, "other.module")
    with pytest.raises(AttributeError, match="attr"):
        loader.load_kernel(FAKE_LIB, "nkilib.core.scale.scale", "nope")


@pytest.mark.skipif(not REAL_LIB.is_dir(), reason="needs a local nki-library checkout")
def test_aws_attention_cte_imports_unmodified():
    fn = loader.load_kernel(REAL_LIB, "nkilib.core.attention.attention_cte", "attention_cte")
    assert callable(fn)


@pytest.mark.skipif(not REAL_LIB.is_dir(), reason="needs a local nki-library checkout")
def test_aws_attention_cte_matches_its_torch_reference_at_a_small_shape():
    import ml_dtypes
    import torch

    cte = loader.jit(
        loader.load_kernel(REAL_LIB, "nkilib.core.attention.attention_cte", "attention_cte")
    )
    ref = loader.load_kernel(
        REAL_LIB, "nkilib.core.attention.attention_cte_torch", "attention_cte_torch_ref"
    )
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(ml_dtypes.bfloat16)
               for s in ((1, 512, 128), (1, 128, 512), (1, 512, 128)))  # fmt: skip
    out = cte(q, k, v, 0.125, True)  # PSUM tiles placed with address= on shared banks
    want = ref(*(torch.tensor(a.astype(np.float32)) for a in (q, k, v)), 0.125, True)
    np.testing.assert_allclose(out.astype(np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
