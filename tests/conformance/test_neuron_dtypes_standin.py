"""The `neuron_dtypes` stand-in's packed MX dtypes, used the way nki-library's test helpers
and torch references use AWS's package."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.conformance import loader
from nki_kernels.conformance import neuron_dtypes_standin as ndt
from nki_kernels.interp import nl

FAKE_LIB = Path(__file__).parent / "fake_checkout"


@pytest.fixture
def x4_names() -> Iterator[None]:
    with ndt.installed():
        yield


@pytest.mark.usefixtures("x4_names")
def test_x4_dtypes_are_numpy_dtypes_known_by_name():
    a = np.zeros((4, 2), dtype=nl.float8_e4m3fn_x4)  # an NKI dtype string, as AWS's tests pass
    assert str(a.dtype) == "float8_e4m3fn_x4" and "x4" in str(a.dtype)
    assert a.dtype.name == "float8_e4m3fn_x4" and repr(a.dtype) == "dtype('float8_e4m3fn_x4')"
    assert np.dtype("float4_e2m1fn_x4") == ndt.float4_e2m1fn_x4
    assert ndt.float8_e4m3fn_x4 != ndt.float8_e5m2_x4
    assert a.view(np.uint32).shape == (4, 2)
    assert np.zeros(3, ndt.float4_e2m1fn_x4).view(np.uint16).shape == (3,)
    assert str(np.dtype(np.uint32)) == "uint32"  # untagged dtypes keep their names
    assert [ndt.sizeinbytes(d) for d in ("float8_e5m2_x4", ndt.float4_e2m1fn_x4)] == [4, 2]
    assert ndt.finfo(nl.float8_e4m3fn_x4).max == 448
    assert not ndt.is_float_type(ndt.float8_e5m2_x4) and ndt.is_float_type(ml_dtypes.bfloat16)


@pytest.mark.usefixtures("x4_names")
def test_static_cast_packs_and_unpacks_the_last_dim_by_four():
    vals = np.array([[1.0, -2.0, 0.5, 3.0, 4.0, -1.5, -0.0, 6.0]], np.float32)
    for name in ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4"):
        packed = ndt.static_cast(vals, getattr(ndt, name))
        assert packed.shape == (1, 2) and str(packed.dtype) == name
        np.testing.assert_array_equal(ndt.static_cast(packed, np.float32), vals)
        same = ndt.static_cast(packed, getattr(nl, name))
        np.testing.assert_array_equal(same.view(np.uint8), packed.view(np.uint8))
    # lane j of a word sits in bits [8j, 8j + 8): 1.0 in e4m3fn is 0x38
    word = ndt.static_cast(np.array([1.0, 0, 0, 0], np.float32), ndt.float8_e4m3fn_x4)
    assert int(word.view(np.uint32)[0]) == 0x38
    # nearest-even and saturating: 5 -> 4 (tie) and 100 -> 6 in fp4
    fp4 = ndt.static_cast(np.array([5.0, 100.0, 0.25, 0.75], np.float32), "float4_e2m1fn_x4")
    np.testing.assert_array_equal(ndt.static_cast(fp4, np.float32), [4.0, 6.0, 0.0, 1.0])


@pytest.mark.usefixtures("x4_names")
def test_packed_dtypes_survive_concatenate_and_stack():
    a = ndt.static_cast(np.ones((2, 8), np.float32), ndt.float8_e5m2_x4)
    assert str(np.concatenate([a, a]).dtype) == "float8_e5m2_x4"
    assert str(np.stack([a, a], axis=1).dtype) == "float8_e5m2_x4"
    np.testing.assert_array_equal(ndt.static_cast(np.concatenate([a, a]), np.float32), 1.0)
    for mixed in ([a.view(np.int32), a], [a, a.view(np.int32)]):  # an untagged input
        assert str(np.concatenate(mixed).dtype) == "int32"  # NumPy's own result


@pytest.mark.usefixtures("x4_names")
def test_a_golden_given_as_a_raw_view_is_read_as_the_outputs_words():
    from nki_kernels.interp.dtypes import host_float32

    words = ndt.static_cast(np.arange(8, dtype=np.float32).reshape(1, 8), ndt.float8_e4m3fn_x4)
    raw = words.view(np.float32)  # nki-library's mxfp_load golden: `.view(np.float32)`
    np.testing.assert_array_equal(host_float32(raw, like=words), host_float32(words))
    assert host_float32(raw).shape == (1, 2)  # alone, a float32 array is its own values


def _numpy_state() -> tuple[dict, dict, tuple]:
    text = ndt._np_dtype_text
    return (
        dict(vars(np)),
        dict(np.sctypeDict),
        (text.__str__, text.__repr__, text._name_get),
    )


@pytest.mark.skipif(
    importlib.util.find_spec("neuron_dtypes") is not None, reason="AWS's neuron_dtypes is installed"
)
def test_a_conformance_load_leaves_numpy_as_it_was():
    before = _numpy_state()
    tagged = ndt.float8_e4m3fn_x4
    assert "neuron_dtypes" not in sys.modules and str(tagged) == "uint32"
    with loader.checkout_context(FAKE_LIB):
        import neuron_dtypes

        assert neuron_dtypes is ndt and np.dtype("float8_e4m3fn_x4") == tagged
        with loader.mapped_nki():  # a nested scope leaves the outer one installed
            pass
        assert str(tagged) == "float8_e4m3fn_x4" and np.concatenate is not before[0]["concatenate"]
        loader.load_module(FAKE_LIB, "nkilib.core.scale.scale")
    after = _numpy_state()
    assert after[0].keys() == before[0].keys()
    assert all(after[0][k] is v for k, v in before[0].items())
    assert after[1].keys() == before[1].keys()
    assert all(after[1][k] is v for k, v in before[1].items())
    assert all(a is b for a, b in zip(after[2], before[2]))
    assert "neuron_dtypes" not in sys.modules
    assert str(tagged) == "uint32" and tagged.name == "uint32"
    with pytest.raises(TypeError):
        np.dtype("float8_e4m3fn_x4")
