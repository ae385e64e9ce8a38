"""nl.gather_flattened, nl.load_transpose2d, nl.rms_norm and nl.MemoryRegion: NumPy
references (ragged partitions, bf16 rounding) and the instructions they lower to."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule

from nki_kernels.interp import nl, run

rng = np.random.default_rng(17)


def _run(body, *arrays, **kw):
    def kernel(*hbm):
        got = body(*hbm)
        out = nl.ndarray(got.shape, got.dtype, buffer=nl.shared_hbm)
        nl.store(out, got)
        return out

    return run(kernel, *arrays, **kw)


def test_gather_flattened_is_take_along_the_free_axis():
    data = rng.standard_normal((29, 40)).astype(np.float32)
    idx = rng.integers(0, 40, size=(29, 7)).astype(np.uint32)
    res = _run(lambda d, i: nl.gather_flattened(nl.load(d), nl.load(i)), data, idx)
    np.testing.assert_array_equal(res.outputs, np.take_along_axis(data, idx.astype(np.int64), -1))
    assert [i.opcode for i in res.trace if i.engine == "gpsimd"] == ["nc_n_gather"]


def test_gather_flattened_refuses_other_axes():
    data, idx = np.zeros((2, 4), np.float32), np.zeros((2, 2), np.uint32)
    expect_rule(
        "NL_API", _run, lambda d, i: nl.gather_flattened(nl.load(d), nl.load(i), 1), data, idx
    )


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_load_transpose2d_is_one_transposing_dma(dtype):
    src = rng.standard_normal((37, 90)).astype(dtype)
    res = _run(lambda s: nl.load_transpose2d(s), src)
    np.testing.assert_array_equal(res.outputs, src.T)
    assert res.trace.count(engine="dma") == 2  # the transposing load, then the store


def test_load_transpose2d_needs_a_2d_hbm_tensor():
    expect_rule("NL_API", _run, lambda s: nl.load_transpose2d(s), np.zeros((2, 3, 4), np.float32))


def test_rms_norm_matches_numpy_and_rounds_to_bf16():
    p, f, n = 19, 48, 64  # n: the row's full length (the tile holds 48 of 64 values)
    x = rng.standard_normal((p, f)).astype(np.float32)
    w = rng.standard_normal((p, f)).astype(np.float32)
    res = _run(lambda a, b: nl.rms_norm(nl.load(a), nl.load(b), axis=1, n=n, dtype=BF16), x, w)
    want = x / np.sqrt((x.astype(np.float64) ** 2).sum(1, keepdims=True) / n + 1e-6) * w
    got = res.outputs.astype(np.float32)
    # one bf16 rounding of the result (2^-8 relative) on top of fp32 intermediates
    np.testing.assert_allclose(got, bf16(want).astype(np.float32), rtol=2**-7, atol=1e-6)


def test_rms_norm_rules():
    x = np.ones((4, 8), np.float32)
    expect_rule("NL_SHAPE", _run, lambda a: nl.rms_norm(nl.load(a), nl.load(a)[:, 0:4], 1, 8), x)
    expect_rule("NL_API", _run, lambda a: nl.rms_norm(nl.load(a), nl.load(a), 0, 8), x)


def test_memory_region_holds_the_buffer_tokens():
    assert isinstance(nl.sbuf, nl.MemoryRegion) and isinstance(nl.shared_hbm, nl.MemoryRegion)
    assert nl.MemoryRegion.psum is nl.psum and nl.MemoryRegion.private_hbm is nl.hbm
    assert list(nl.MemoryRegion) == [nl.sbuf, nl.psum, nl.private_hbm, nl.shared_hbm]
    assert not isinstance("sbuf", nl.MemoryRegion)
