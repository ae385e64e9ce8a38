"""TensorE: nc_matmul (accumulate modes, dtypes, is_transpose, fp8 double_row, tiling) and
nc_transpose on both engines, against NumPy, plus their rules."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from tile_harness import expect_rule

from nki_kernels.interp import InterpreterWarning, nisa, nl, run

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3)
FP8_E5 = np.dtype(ml_dtypes.float8_e5m2)
rng = np.random.default_rng(5)


def _sb(h, dtype=None):
    t = nl.ndarray(h.shape, dtype or h.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=h)
    return t


def _out(t, dtype=None):
    """PSUM/SBUF tile -> shared HBM (PSUM is evacuated through SBUF first)."""
    if t.buffer is nl.psum:
        sb = nl.ndarray(t.shape, dtype or t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=t)
        t = sb
    o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def _raises(rule, kernel, *args, target="trn2"):
    return expect_rule(rule, run, kernel, *args, target=target)


def _ref(a, b):
    return a.astype(np.float64).T @ b.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, FP8, FP8_E5])
def test_full_tile_matmul_is_stationary_transposed_times_moving(dtype):
    a = rng.standard_normal((128, 128)).astype(dtype)
    b = rng.standard_normal((128, 512)).astype(dtype)

    def kernel(ah, bh):
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=_sb(ah), moving=_sb(bh))
        return _out(acc)

    res = run(kernel, a, b)
    # inputs are exact in fp32; only the fp32 accumulation order differs from float64
    np.testing.assert_allclose(res.outputs, _ref(a, b), rtol=1e-5, atol=1e-4)
    rec = next(i for i in res.trace if i.opcode == "nc_matmul")
    assert (rec.engine, rec.p, rec.n) == ("tensor", 128, 512)
    assert (rec.attrs["K"], rec.attrs["M"], rec.attrs["N"]) == (128, 128, 512)
    assert rec.flops == 2 * 128 * 128 * 512


def test_ragged_partial_partitions_and_3d_operands():
    a = rng.standard_normal((77, 50)).astype(np.float32)
    b = rng.standard_normal((77, 3, 100)).astype(np.float32)

    def kernel(ah, bh):
        a_sb = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        b_sb = nl.ndarray((128, 3, 100), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_sb[0:77, 0:50], src=ah)
        nisa.dma_copy(dst=b_sb[0:77], src=bh)
        acc = nl.ndarray((128, 3, 100), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[0:50], stationary=a_sb[0:77, 0:50], moving=b_sb[0:77])
        return _out(acc)

    got = run(kernel, a, b).outputs
    ref = _ref(a, b.reshape(77, 300)).reshape(50, 3, 100)
    np.testing.assert_allclose(got[:50], ref, rtol=1e-5, atol=1e-4)
    assert np.isnan(got[50:]).all()


def _acc_kernel(modes, ranges):
    """Matmuls of ones into slices of one PSUM tile: k-th writes 2**k into `ranges[k]`."""

    def kernel(ones_h):
        ones = _sb(ones_h)
        acc = nl.ndarray((8, 512), nl.float32, buffer=nl.psum)
        for k, (mode, (c0, c1)) in enumerate(zip(modes, ranges)):
            mv = nl.ndarray((4, c1 - c0), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=mv, value=float(2**k) / 4)
            nisa.nc_matmul(dst=acc[:, c0:c1], stationary=ones, moving=mv, accumulate=mode)
        return _out(acc)

    return kernel


def test_accumulate_none_detects_first_write_per_element():
    # overlapping windows (the conv pattern): each element overwrites on its first write
    got = run(
        _acc_kernel([None, None, None], [(0, 256), (128, 384), (0, 64)]),
        np.ones((4, 8), np.float32),
    ).outputs[0]
    ref = np.full(512, np.nan, np.float32)
    ref[0:256] = 1
    ref[128:384] += np.where(np.arange(128, 384) < 256, 2, 0)
    ref[256:384] = 2
    ref[0:64] += 4
    np.testing.assert_array_equal(got, ref)


def test_accumulate_false_overwrites_and_true_adds():
    got = run(
        _acc_kernel([False, True, False, True], [(0, 100)] * 4), np.ones((4, 8), np.float32)
    ).outputs[0]
    assert (got[:100] == 4 + 8).all() and np.isnan(got[100:]).all()


def test_accumulate_true_on_unwritten_psum_warns_and_shows_nan():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(_acc_kernel([True], [(0, 10)]), np.ones((4, 8), np.float32)).outputs
    assert np.isnan(got[:, :10]).all()
    assert any(
        issubclass(w.category, InterpreterWarning) and "undefined" in str(w.message) for w in caught
    )


def test_accumulate_true_onto_memset_psum_warns_before_nc_v4_only():
    def kernel(ones_h):
        ones = _sb(ones_h)
        acc = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
        nisa.memset(dst=acc, value=1.0)
        mv = nl.ndarray((4, 16), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=mv, value=0.25)
        nisa.nc_matmul(dst=acc, stationary=ones, moving=mv, accumulate=True)
        return _out(acc)

    for target, warns in (("trn2", True), ("trn3", False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = run(kernel, np.ones((4, 8), np.float32), target=target).outputs
        assert (got == 2).all()
        assert any(issubclass(w.category, InterpreterWarning) for w in caught) == warns


def test_operands_rewritten_before_psum_is_read_do_not_leak_into_the_result():
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)

    def kernel(ah, bh):
        s, mv = _sb(ah), _sb(bh)
        acc = nl.ndarray((32, 48), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=s, moving=mv, accumulate=False)
        nisa.nc_matmul(dst=acc, stationary=s, moving=mv, accumulate=True)
        nisa.memset(dst=s, value=0.0)  # SBUF reused before the PSUM is evacuated
        nisa.memset(dst=mv, value=7.0)
        return _out(acc)

    np.testing.assert_allclose(run(kernel, a, b).outputs, 2 * _ref(a, b), rtol=1e-5, atol=1e-4)


def test_non_matmul_write_resets_auto_detect():
    def kernel(ones_h):
        ones = _sb(ones_h)
        acc = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
        mv = nl.ndarray((4, 16), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=mv, value=0.25)
        nisa.nc_matmul(dst=acc, stationary=ones, moving=mv)
        nisa.memset(dst=acc, value=100.0)
        nisa.nc_matmul(dst=acc, stationary=ones, moving=mv)  # first matmul write again
        return _out(acc)

    assert (run(kernel, np.ones((4, 8), np.float32)).outputs == 1).all()


def test_bf16_psum_destination_on_trn3_rounds_and_n_up_to_8192():
    a = rng.standard_normal((64, 16)).astype(BF16)
    b = rng.standard_normal((64, 8192)).astype(BF16)

    def kernel(ah, bh):
        acc = nl.ndarray((16, 8192), nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=_sb(ah), moving=_sb(bh))
        return _out(acc)

    got = run(kernel, a, b, target="trn3").outputs
    assert got.dtype == BF16
    ref = (a.astype(np.float32).T @ b.astype(np.float32)).astype(BF16)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2**-7)
    _raises("DTYPE", kernel, a, b[:, :512], target="trn2")


def test_fp8_double_row_contracts_over_2k():
    a = (rng.standard_normal((128, 2, 32)) * 2).astype(FP8)
    b = (rng.standard_normal((128, 2, 64)) * 2).astype(FP8_E5)

    def kernel(ah, bh):
        acc = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(
            dst=acc, stationary=_sb(ah), moving=_sb(bh), perf_mode=nisa.matmul_perf_mode.double_row
        )
        return _out(acc)

    res = run(kernel, a, b)
    ref = _ref(a.reshape(256, 32), b.reshape(256, 64))
    np.testing.assert_allclose(res.outputs, ref, rtol=1e-5, atol=1e-3)
    rec = next(i for i in res.trace if i.opcode == "nc_matmul")
    assert rec.attrs["K"] == 256 and rec.attrs["double_row"] and rec.flops == 2 * 256 * 32 * 64
    _raises("VERSION", kernel, a, b, target="trn1")


def test_is_transpose_is_bit_exact_with_nan_on_trn2_and_a_matmul_on_trn1():
    x = rng.standard_normal((64, 100)).astype(BF16)
    x[3, 7] = np.nan
    x[10, 0] = np.inf

    def kernel(xh, eye_dtype, dst_dtype):
        ident = nl.shared_identity_matrix(64, dtype=eye_dtype)
        ps = nl.ndarray((100, 64), dst_dtype, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=_sb(xh), moving=ident, is_transpose=True)
        return _out(ps)

    got = run(kernel, x, nl.bfloat16, nl.bfloat16).outputs
    np.testing.assert_array_equal(got.view(np.uint16), x.T.view(np.uint16))
    # NC-v2 has no transpose mode: an fp32 matmul against the identity (NaN spreads)
    got1 = run(kernel, x, nl.bfloat16, nl.float32, target="trn1").outputs
    assert np.isnan(got1[7, :]).all()  # NaN * 0 spreads over the row
    assert np.isnan(np.delete(got1[0], 10)).all() and got1[0, 10] == np.inf  # inf * 0
    assert got1[1, 5] == np.float32(x[5, 1])
    _raises("DTYPE", kernel, x, nl.bfloat16, nl.float32)


def test_tiling_mode_limits_k_and_m():
    a = rng.standard_normal((32, 32)).astype(np.float32)
    b = rng.standard_normal((32, 40)).astype(np.float32)

    def kernel(ah, bh, size, pos):
        acc = nl.ndarray((32, 40), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(
            dst=acc, stationary=_sb(ah), moving=_sb(bh), tile_size=size, tile_position=pos
        )
        return _out(acc)

    np.testing.assert_allclose(
        run(kernel, a, b, (32, 32), (96, 32)).outputs, _ref(a, b), rtol=1e-5, atol=1e-4
    )
    _raises("ARG", kernel, a, b, (32, 32), (96, 32), target="trn1")  # 32-row tiles: v3+
    _raises("ARG", kernel, a, b, (64, 64), (32, 0))  # position not a multiple
    _raises("ARG", kernel, a, b, (64, 64), (96, 0))  # past the array

    def small_tile(ah, bh):
        acc = nl.ndarray((32, 40), nl.float32, buffer=nl.psum)
        a_sb = nl.ndarray((64, 32), nl.float32, buffer=nl.sbuf)
        b_sb = nl.ndarray((64, 40), nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(
            dst=acc, stationary=a_sb, moving=b_sb, tile_size=(32, 128), tile_position=(0, 0)
        )

    _raises("MM_K", small_tile, a, b)


# ---- nc_transpose -------------------------------------------------------------------------
def test_nc_transpose_tensor_engine_sbuf_to_psum():
    x = rng.standard_normal((128, 2, 40)).astype(np.float32)

    def kernel(xh):
        ps = nl.ndarray((80, 128), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=ps, data=_sb(xh))
        return _out(ps)

    res = run(kernel, x)
    np.testing.assert_array_equal(res.outputs, x.reshape(128, 80).T)
    assert next(i for i in res.trace if i.opcode == "nc_transpose").engine == "tensor"


def test_nc_transpose_vector_engine_sbuf_and_psum():
    x = rng.standard_normal((32, 20)).astype(BF16)

    def kernel(xh):
        sb = nl.ndarray((20, 32), nl.bfloat16, buffer=nl.sbuf)
        nisa.nc_transpose(dst=sb, data=_sb(xh), engine=nisa.engine.vector)
        ps = nl.ndarray((32, 20), nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=ps, data=sb)  # SBUF -> PSUM that is not [.., 128]: either
        back = nl.ndarray((20, 32), nl.bfloat16, buffer=nl.sbuf)
        nisa.nc_transpose(dst=back, data=ps, engine=nisa.engine.vector)  # PSUM -> SBUF
        return _out(sb), _out(back)

    res = run(kernel, x)
    sb, back = res.outputs
    np.testing.assert_array_equal(sb.view(np.uint16), x.T.view(np.uint16))
    np.testing.assert_array_equal(back.view(np.uint16), x.T.view(np.uint16))
    engines = [i.engine for i in res.trace if i.opcode == "nc_transpose"]
    assert engines == ["vector", "tensor", "vector"]


def test_nc_transpose_of_a_ragged_window_fills_only_its_destination_window():
    x = rng.standard_normal((128, 64)).astype(np.float32)

    def kernel(xh):
        ps = nl.ndarray((64, 128), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=ps[3:43, 0:77], data=_sb(xh)[13:90, 10:50])
        return _out(ps)

    got = run(kernel, x).outputs
    np.testing.assert_array_equal(got[3:43, 0:77], x[13:90, 10:50].T)
    untouched = np.ones_like(got, dtype=bool)
    untouched[3:43, 0:77] = False
    assert np.isnan(got[untouched]).all()


def _k_transpose(p, f, engine, src_buf=nl.sbuf, dst_buf=nl.psum, dst_dtype=nl.float32):
    def kernel():
        data = nl.ndarray((p, f), nl.float32, buffer=src_buf)
        dst = nl.ndarray((f, p), dst_dtype, buffer=dst_buf)
        nisa.nc_transpose(dst=dst, data=data, engine=engine)

    return kernel


@pytest.mark.parametrize(
    ("kernel", "rule"),
    [
        (_k_transpose(32, 33, nisa.engine.vector, dst_buf=nl.sbuf), "TRANSPOSE"),
        (_k_transpose(33, 32, nisa.engine.vector, dst_buf=nl.sbuf), "TRANSPOSE"),
        (_k_transpose(32, 32, nisa.engine.tensor, dst_buf=nl.sbuf), "BUF"),
        (_k_transpose(32, 32, nisa.engine.tensor, src_buf=nl.psum), "BUF"),
        (_k_transpose(32, 32, nisa.engine.scalar), "ENGINE"),
        (_k_transpose(32, 32, nisa.engine.tensor, dst_dtype=nl.bfloat16), "DTYPE"),
    ],
)
def test_nc_transpose_rules(kernel, rule):
    _raises(rule, kernel)


# ---- nc_matmul rules ---------------------------------------------------------------------
def _mm(
    k=128,
    m=128,
    n=512,
    *,
    s_dtype=nl.bfloat16,
    m_dtype=nl.bfloat16,
    dst_dtype=nl.float32,
    s_buf=nl.sbuf,
    m_buf=nl.sbuf,
    dst_buf=nl.psum,
    dst_shape=None,
    mk=None,
    **kw,
):
    def kernel():
        s = nl.ndarray((k, m), s_dtype, buffer=s_buf)
        mv = nl.ndarray((mk or k, n), m_dtype, buffer=m_buf)
        dst = nl.ndarray(dst_shape or (m, n), dst_dtype, buffer=dst_buf)
        nisa.nc_matmul(dst, s, mv, **kw)

    return kernel


def _bank_crossing():
    acc = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum)
    s = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
    mv = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
    nisa.nc_matmul(acc[:, 256:768], s, mv)


@pytest.mark.parametrize(
    ("kernel", "rule", "target"),
    [
        (_mm(m=129, dst_shape=(128, 512)), "MM_M", "trn2"),
        (_mm(n=513), "MM_N", "trn2"),
        (_mm(s_buf=nl.psum), "BUF", "trn2"),
        (_mm(m_buf=nl.hbm), "BUF", "trn2"),
        (_mm(dst_buf=nl.sbuf), "BUF", "trn2"),
        (_mm(s_dtype=nl.float32), "DTYPE", "trn2"),
        (_mm(s_dtype=nl.int8, m_dtype=nl.int8), "DTYPE", "trn2"),
        (_mm(s_dtype=nl.float8_e4m3fn), "DTYPE", "trn2"),
        (_mm(s_dtype=nl.float8_e4m3fn, m_dtype=nl.float8_e4m3), "DTYPE", "trn3"),
        (_mm(dst_dtype=nl.bfloat16), "DTYPE", "trn2"),
        (_mm(dst_shape=(128, 256)), "MM_SHAPE", "trn2"),
        (_mm(mk=64), "PART", "trn2"),
        (_mm(accumulate=1), "ARG", "trn2"),
        (_mm(perf_mode="double_row"), "ARG", "trn2"),
        (_mm(tile_size=(64, 64)), "ARG", "trn2"),
        (_mm(perf_mode=nisa.matmul_perf_mode.double_row), "DTYPE", "trn2"),
        (
            _mm(
                s_dtype=nl.float8_e4m3,
                m_dtype=nl.float8_e4m3,
                is_transpose=True,
                perf_mode=nisa.matmul_perf_mode.double_row,
            ),
            "ARG",
            "trn2",
        ),
        (_mm(stationary_is_onezero=True), "KWARG", "trn2"),
        (_bank_crossing, "MM_BANK", "trn2"),
    ],
)
def test_matmul_rules(kernel, rule, target):
    _raises(rule, kernel, target=target)


def test_bank_rule_lifts_on_trn3_where_n_spans_banks():
    run(_bank_crossing, target="trn3")
    run(_mm(n=4096), target="trn3")


def test_matmul_error_names_the_numbers():
    err = _raises("MM_N", _mm(n=513))
    assert "N=513 exceeds 512" in str(err)


# ---- tiling mode (nc_matmul ISA page, "Tiling mode") --------------------------------------
def test_column_tiles_give_the_untiled_result_and_record_their_tile():
    # "Column tiling mode slices the 128 PE columns in the same fashion": four [128, 32]
    # stationaries on the four 32-column tiles, each into its own 32 PSUM partitions (as
    # nki-library's mlp_tkg places them); the values are stationary.T @ moving
    a = rng.standard_normal((128, 4, 32)).astype(np.float32)
    b = rng.standard_normal((128, 96)).astype(np.float32)

    def kernel(ah, bh):
        a_sb, b_sb = _sb(ah), _sb(bh)
        acc = nl.ndarray((128, 96), nl.float32, buffer=nl.psum)
        for j in range(4):
            nisa.nc_matmul(
                dst=acc[32 * j : 32 * (j + 1), :],
                stationary=a_sb[:, j, :],
                moving=b_sb,
                tile_position=(0, 32 * j),
                tile_size=(128, 32),
            )
        return _out(acc)

    res = run(kernel, a, b)
    want = np.concatenate([_ref(a[:, j, :], b) for j in range(4)])
    np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-4)
    tiles = [i.attrs.get("pe_tile") for i in res.trace if i.opcode == "nc_matmul"]
    assert tiles == [(0, 32 * j, 128, 32) for j in range(4)]


def test_full_array_tiling_is_untiled():
    # "If they are not set, the default is to use the full systolic array, which is
    # equivalent to tile_position=(0, 0) and tile_size=(128, 128)"
    res = run(_mm(tile_position=(0, 0), tile_size=(128, 128)))
    (rec,) = [i for i in res.trace if i.opcode == "nc_matmul"]
    assert "pe_tile" not in rec.attrs


def test_double_row_allows_row_tiling_only():
    # "double_row performance mode cannot be combined with Tensor Engine column tiling
    # mode" (ISA page; trainium2_arch: "Column tiling mode"): row tiles are allowed
    fp8 = {"s_dtype": nl.float8_e4m3, "m_dtype": nl.float8_e4m3}
    dr = nisa.matmul_perf_mode.double_row

    def kernel(size, pos):
        s = nl.ndarray((64, 2, 32), nl.float8_e4m3, buffer=nl.sbuf)
        mv = nl.ndarray((64, 2, 64), nl.float8_e4m3, buffer=nl.sbuf)
        nisa.memset(dst=s, value=1.0)
        nisa.memset(dst=mv, value=1.0)
        dst = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst, s, mv, perf_mode=dr, tile_size=size, tile_position=pos)
        return _out(dst)

    out = run(kernel, (64, 128), (64, 0)).outputs
    np.testing.assert_array_equal(out, np.full((32, 64), 128.0, np.float32))  # K = 2 x 64
    err = _raises("ARG", kernel, (64, 64), (64, 64))
    assert "column tiling" in str(err) and "(64, 64)" in str(err)
    _raises("ARG", _mm(perf_mode=dr, tile_size=(64, 32), tile_position=(0, 0), **fp8))


def test_bad_tiling_errors_name_the_argument_and_value():
    err = _raises("ARG", _mm(64, 64, tile_size=(64, 64), tile_position=(32, 0)))
    assert "tile_position" in str(err) and "(32, 0)" in str(err)
    err = _raises("ARG", _mm(64, 64, tile_size=(48, 64), tile_position=(0, 0)))
    assert "tile_size" in str(err) and "(48, 64)" in str(err)
    err = _raises("ARG", _mm(64, 64, tile_size=(32, 32), tile_position=(0, 0)), target="trn1")
    assert "NC-v2" in str(err)  # 4 x 32 tiles are NC-v3 or newer
    err = _raises("MM_M", _mm(64, 64, tile_size=(64, 32), tile_position=(0, 32)))
    assert "column_size 32" in str(err)
    _raises("ARG", _mm(64, 64, tile_size=(64, 64)))  # both or neither
