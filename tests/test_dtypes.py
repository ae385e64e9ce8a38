"""`nki_kernels.dtypes.dtype_bytes`: the one by-value dtype size, for kernels and hosts."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.dtypes import dtype_bytes
from nki_kernels.interp import dtypes as interp_dtypes
from nki_kernels.interp import nisa, nki, nl

NAMES = [
    "float32", "tfloat32", "int32", "uint32", "bfloat16", "float16", "int16", "uint16",
    "float8_e4m3", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu", "int8", "uint8", "bool_",
]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_each_nki_dtype_has_its_element_size(name):
    # the interpreter's dtypes are strings holding the NumPy dtype they are stored in
    assert dtype_bytes(getattr(nl, name)) == interp_dtypes.itemsize(getattr(nl, name))


@pytest.mark.parametrize("name", NAMES)
def test_a_dtype_name_as_on_the_compiler_has_the_same_size(name):
    # on the compiler an NKI dtype is a string: the name alone must be enough
    assert dtype_bytes(name) == interp_dtypes.itemsize(getattr(nl, name))


def test_an_unknown_dtype_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"dtype: expected one of float32.*got 'int4'"):
        dtype_bytes("int4")


def test_a_kernel_may_call_it_inside_the_language_subset():
    def kernel(x):
        width = 64 // dtype_bytes(x.dtype)
        out = nl.ndarray((x.shape[0], width), x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((x.shape[0], width), x.dtype)
        nisa.dma_copy(dst=t, src=x[:, 0:width])
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(2 * 32, dtype=np.float32).reshape(2, 32)
    np.testing.assert_array_equal(nki.jit(kernel)(x), x[:, :16])
