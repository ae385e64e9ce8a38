"""NKI dtypes are strings compared by value (NKI 0.6 `DType = str`): `nl.float32` and a
tensor's `.dtype` equal their names, and code that needs NumPy dtype attributes fails as
it would on the compiler, with rule DTYPE_STR (or LANGUAGE for a literal `.itemsize`)."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest
import torch

from nki_kernels.interp import NkiValidationError, nisa, nki, nl, run
from nki_kernels.interp import dtypes as dt
from nki_kernels.interp.dtypes import DtypeAttributeError

ALL_NAMES = [
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "bfloat16",
    "float32", "float8_e4m3", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu",
]  # fmt: skip


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_nl_dtype_is_its_name(name):
    d = getattr(nl, name)
    assert isinstance(d, str) and d == name and str(d) == name and hash(d) == hash(name)
    assert {name: 1}[d] == 1 and {d: 1}[name] == 1  # string-keyed tables work both ways
    assert pickle.loads(pickle.dumps(d)) is d


def test_tensor_dtype_is_the_string_and_compares_by_value():
    seen = {}

    def kernel(x):
        seen["x"] = x.dtype
        t = nl.ndarray((4, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        seen["t"] = t.dtype
        seen["view"] = t.view(nl.int16).dtype
        seen["is_bf16"] = t.dtype == nl.bfloat16 and t.dtype == "bfloat16"
        seen["numpy_type"] = x.dtype == np.float32  # a NumPy scalar type is not a dtype string

    run(kernel, np.zeros((4, 8), np.float32))
    assert seen["x"] == "float32" and seen["t"] == "bfloat16" and seen["view"] == "int16"
    assert seen["is_bf16"] is True and seen["numpy_type"] is False


def test_nkilib_style_size_by_string_comparison():
    """nki-library's allocator sizes dtypes with str(dtype) == str(nl.X)."""
    sizes = {}

    def kernel(x):
        for d in (x.dtype, nl.bfloat16, nl.float8_e4m3):
            sizes[str(d)] = 4 if str(d) == str(nl.float32) else 2 if str(d) == "bfloat16" else 1

    run(kernel, np.zeros((2, 2), np.float32))
    assert sizes == {"float32": 4, "bfloat16": 2, "float8_e4m3": 1}


@pytest.mark.parametrize("attr", ["kind", "name", "type", "char", "str"])
def test_numpy_dtype_attributes_fail_with_a_named_rule(attr):
    def kernel(x):
        getattr(x.dtype, attr)

    with pytest.raises(DtypeAttributeError) as e:
        run(kernel, np.zeros((2, 2), np.float32))
    assert e.value.rule == "DTYPE_STR"
    assert f"no attribute {attr!r}" in str(e.value) and "'float32'" in str(e.value)
    assert isinstance(e.value, AttributeError)  # hasattr() is False, as on a plain str


def test_itemsize_in_a_jit_kernel_is_rejected_at_launch_with_its_line():
    def kernel(x):
        return x.dtype.itemsize

    with pytest.raises(NkiValidationError) as e:
        nki.jit(kernel)(np.zeros((2, 2), np.float32))
    assert e.value.rule == "LANGUAGE" and ".itemsize" in str(e.value)


def test_itemsize_in_a_plain_run_fails_with_dtype_str():
    def kernel(x):
        return x.dtype.itemsize

    with pytest.raises(NkiValidationError) as e:
        run(kernel, np.zeros((2, 2), np.float32))
    assert e.value.rule == "DTYPE_STR" and "'itemsize'" in str(e.value)


def test_itemsize_reached_at_run_time_fails_with_dtype_str():
    """A dynamic lookup the static check cannot see still fails at run time."""
    attr = "item" + "size"

    def kernel(x):
        getattr(x.dtype, attr)

    with pytest.raises(NkiValidationError) as e:
        run(kernel, np.zeros((2, 2), np.float32))
    assert e.value.rule == "DTYPE_STR" and "'itemsize'" in str(e.value)


def test_dtype_inputs_accept_names_numpy_and_torch_dtypes():
    for given in (nl.bfloat16, "bfloat16", np.dtype(ml_dtypes.bfloat16), torch.bfloat16):
        assert dt.as_dtype(given) is nl.bfloat16
    assert dt.as_dtype(np.float32) is nl.float32 and dt.as_dtype("tfloat32") is nl.float32
    assert dt.itemsize(nl.bfloat16) == 2 and dt.np_dtype("float8_e5m2") == ml_dtypes.float8_e5m2
    with pytest.raises(NkiValidationError) as e:
        dt.as_dtype("float64")
    assert e.value.rule == "DTYPE" and "'float64'" in str(e.value)


def test_values_still_round_to_the_stored_dtype():
    """Storage stays NumPy underneath: a bf16 store rounds to nearest-even."""
    x = np.array([[1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]], np.float32)  # ties: to even

    def kernel(a):
        t = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    got = run(kernel, x).outputs
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert got[0, 0] == 1.0 and got[0, 1] == 1.0 + 2.0**-6


def test_bf16_to_fp32_is_bit_exact_for_every_bit_pattern_and_any_strides():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    b = bits.view(ml_dtypes.bfloat16)
    want = b.astype(np.float32).view(np.uint32)  # ml_dtypes' conversion
    got = dt.to_f32(b)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want)
    grid = b.reshape(256, 256)[::3, 1::2]  # a strided view converts the same
    assert np.array_equal(dt.to_f32(grid), grid.astype(np.float32), equal_nan=True)
