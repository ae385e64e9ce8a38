"""VectorE instructions against NumPy references: bn_stats / bn_aggr, max8,
nc_find_index8, nc_match_replace8, tensor_tensor_scan, tensor_copy_predicated, and the
accumulator-register instructions range_select, select_reduce, tensor_scalar_reduce."""

from __future__ import annotations

import numpy as np
import pytest
from tile_harness import BF16, bf16, expect_rule, last_instr, outputs, run_tiles

from nki_kernels.interp import nisa, nl

FP32_MIN = np.float32(np.finfo(np.float32).min)
rng = np.random.default_rng(11)


def _raises(rule, body, inputs, outs, target="trn2"):
    return expect_rule(rule, run_tiles, body, inputs, outs, target=target)


# ---- bn_stats / bn_aggr --------------------------------------------------------------
def _stats_ref(x: np.ndarray) -> np.ndarray:
    cols = []
    for part in (x[:, 0::2], x[:, 1::2]):
        part = part.astype(np.float64)
        mean = part.mean(axis=1)
        cols += [np.full(len(x), part.shape[1]), mean, ((part - mean[:, None]) ** 2).sum(axis=1)]
    return np.stack(cols, axis=1)


def test_bn_stats_odd_count_and_ragged_partitions():
    x = rng.standard_normal((128, 37)).astype(np.float32) * 3 + 1

    def body(t, out):
        nisa.bn_stats(out[0:77, :], t[0:77, :])

    res = run_tiles(body, [x], [((128, 6), nl.float32)])
    got = res.outputs[0]
    np.testing.assert_allclose(got[:77], _stats_ref(x[:77]), rtol=2e-6, atol=1e-5)
    assert np.isnan(got[77:]).all()
    rec = last_instr(res, "bn_stats")
    assert (rec.engine, rec.p, rec.n) == ("vector", 77, 37)


def test_bn_stats_then_bn_aggr_is_layernorm_mean_var_over_chunks():
    h = 1200
    x = (rng.standard_normal((64, h)) * 2 + 0.5).astype(np.float32)
    chunks = [(0, 512), (512, 512), (1024, 176)]

    def body(t, out):
        stats = nl.ndarray((64, 6 * len(chunks)), nl.float32)
        for i, (s, n) in enumerate(chunks):
            nisa.bn_stats(stats[:, 6 * i : 6 * i + 6], t[:, s : s + n])
        nisa.bn_aggr(out, stats)

    got = outputs(body, [x], [((64, 2), nl.float32)])
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got[:, 0], x64.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 1], x64.var(axis=1), rtol=1e-5)


def test_bn_aggr_bf16_input_and_output_round():
    x = rng.standard_normal((32, 300)).astype(BF16)

    def body(t, out):
        stats = nl.ndarray((32, 6), nl.float32)
        nisa.bn_stats(stats, t[:, 0:300])
        nisa.bn_aggr(out, stats)

    got = outputs(body, [x], [((32, 2), nl.bfloat16)])
    assert got.dtype == BF16
    x64 = x.astype(np.float64)
    ref = np.stack([x64.mean(axis=1), x64.var(axis=1)], axis=1)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2**-8, atol=2**-12)


@pytest.mark.parametrize("case", ["stats_513", "stats_dst5", "aggr_7", "aggr_dst3"])
def test_bn_rules(case):
    def body(t, out):
        if case == "stats_513":
            nisa.bn_stats(out[:, 0:6], t[:, 0:513])
        elif case == "stats_dst5":
            nisa.bn_stats(out[:, 0:5], t[:, 0:64])
        elif case == "aggr_7":
            nisa.bn_aggr(out[:, 0:2], t[:, 0:7])
        else:
            nisa.bn_aggr(out[:, 0:3], t[:, 0:6])

    _raises("BN_SIZE", body, [np.zeros((8, 600), np.float32)], [((8, 8), nl.float32)])


# ---- top-k family -------------------------------------------------------------------
def test_max8_descending_ragged_3d_and_bf16():
    x = rng.standard_normal((128, 4, 25)).astype(np.float32)

    def body(t, out, out16):
        nisa.max8(out[0:77, :], t[0:77, :, :])
        handle = nisa.max8(out16, t)
        assert handle.opcode == "max8" and handle.depends_on() is handle

    res = run_tiles(body, [x], [((128, 8), nl.float32), ((128, 8), nl.bfloat16)])
    got, got16 = res.outputs
    ref = -np.sort(-x.reshape(128, -1), axis=1)[:, :8]
    np.testing.assert_array_equal(got[:77], ref[:77])
    assert np.isnan(got[77:]).all()
    np.testing.assert_array_equal(got16, bf16(ref))
    rec = last_instr(res, "max8")
    assert (rec.engine, rec.p, rec.n) == ("vector", 128, 100)


def _find_ref(data, vals, order):
    p = data.shape[0]
    idx = np.full((p, 8), -1, dtype=np.int64)
    out = data.copy()
    for r in range(p):
        claimed = set()
        for i in order:
            for j in range(data.shape[1]):
                if j not in claimed and data[r, j] == vals[r, i]:
                    claimed.add(j)
                    idx[r, i] = j
                    break
        out[r, sorted(claimed)] = np.nan
    return idx, out


@pytest.mark.parametrize("idx_dtype", [nl.uint16, nl.uint32])
def test_find_index8_duplicates_ascending_and_missing_sentinel(idx_dtype):
    data = rng.integers(0, 6, (24, 40)).astype(np.float32)
    vals = -np.sort(-data, axis=1)[:, :8]  # many duplicates
    vals[3, 5] = 99.0  # absent

    def body(d, v, out):
        nisa.nc_find_index8(out, d, v)

    got = outputs(body, [data, vals], [((24, 8), idx_dtype)])
    idx, _ = _find_ref(data, vals, range(8))
    sentinel = np.iinfo(np.dtype(idx_dtype)).max
    np.testing.assert_array_equal(got, np.where(idx < 0, sentinel, idx))
    assert got[3, 5] == sentinel


def test_match_replace8_documented_duplicate_example():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def body(d, v, out, idx):
        nisa.nc_match_replace8(out, d, v, imm=-1.0, dst_idx=idx)

    out, idx = outputs(body, [data, vals], [((1, 11), nl.float32), ((1, 8), nl.uint32)])
    np.testing.assert_array_equal(idx[0], [2, 10, 9, 8, 7, 6, 5, 4])
    np.testing.assert_array_equal(out[0], [1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1])


def test_match_replace8_random_reverse_order_ragged():
    data = rng.integers(0, 5, (128, 30)).astype(np.float32)
    vals = rng.integers(0, 7, (128, 8)).astype(np.float32)

    def body(d, v, out, idx):
        nisa.nc_match_replace8(out[0:77, :], d[0:77, :], v[0:77, :], -7.5, dst_idx=idx[0:77, :])

    out, idx = outputs(body, [data, vals], [((128, 30), nl.float32), ((128, 8), nl.uint16)])
    ref_idx, ref_out = _find_ref(data[:77], vals[:77], range(7, -1, -1))
    np.testing.assert_array_equal(idx[:77], np.where(ref_idx < 0, 0xFFFF, ref_idx))
    np.testing.assert_array_equal(out[:77], np.where(np.isnan(ref_out), -7.5, data[:77]))
    assert np.isnan(out[77:]).all()


@pytest.mark.parametrize(
    "case, rule",
    [
        ("max8_src7", "TOPK_SIZE"),
        ("max8_dst9", "TOPK_SIZE"),
        ("max8_4d", "ARG"),
        ("find_float_dst", "DTYPE"),
        ("find_vals7", "TOPK_SIZE"),
        ("replace_idx_float", "DTYPE"),
        ("replace_imm_tile", "ARG"),
        ("replace_free", "FREE"),
    ],
)
def test_topk_rules(case, rule):
    def body(t, out, idx, f):
        if case == "max8_src7":
            nisa.max8(f[:, 0:8], t[:, 0:7])
        elif case == "max8_dst9":
            nisa.max8(f[:, 0:9], t)
        elif case == "max8_4d":
            nisa.max8(f[:, 0:8], t.reshape((8, 2, 2, 8)))
        elif case == "find_float_dst":
            nisa.nc_find_index8(f[:, 0:8], t, t[:, 0:8])
        elif case == "find_vals7":
            nisa.nc_find_index8(idx, t, t[:, 0:7])
        elif case == "replace_idx_float":
            nisa.nc_match_replace8(out, t, t[:, 0:8], 0.0, dst_idx=f[:, 0:8])
        elif case == "replace_imm_tile":
            nisa.nc_match_replace8(out, t, t[:, 0:8], t[:, 0:1])
        else:
            nisa.nc_match_replace8(out[:, 0:16], t, t[:, 0:8], 0.0)

    outs = [((8, 32), nl.float32), ((8, 8), nl.uint32), ((8, 16), nl.float32)]
    _raises(rule, body, [np.zeros((8, 32), np.float32)], outs)


# ---- tensor_tensor_scan ---------------------------------------------------------------
def _scan_ref(a, b, init, f0, f1, rev0=False, rev1=False):
    r = np.broadcast_to(np.asarray(init, np.float32).reshape(-1), (a.shape[0],)).copy()
    out = np.empty_like(a)
    for i in range(a.shape[1]):
        t = f0(r, a[:, i]) if rev0 else f0(a[:, i], r)
        r = (f1(b[:, i], t) if rev1 else f1(t, b[:, i])).astype(np.float32)
        out[:, i] = r
    return out


def test_scan_cumsum_with_tile_initial_ragged():
    data = rng.standard_normal((128, 50)).astype(np.float32)
    init = rng.standard_normal((128, 1)).astype(np.float32)

    def body(d, i0, out):
        ones = nl.ndarray((128, 50), nl.float32)
        nisa.memset(ones, 1.0)
        nisa.tensor_tensor_scan(
            out[0:77, :], ones[0:77, :], d[0:77, :], i0[0:77, :], nl.multiply, nl.add
        )

    res = run_tiles(body, [data, init], [((128, 50), nl.float32)])
    got = res.outputs[0]
    np.testing.assert_allclose(
        got[:77], np.cumsum(data[:77], axis=1) + init[:77], rtol=1e-5, atol=1e-5
    )
    assert np.isnan(got[77:]).all()
    rec = last_instr(res, "tensor_tensor_scan")
    assert (rec.engine, rec.p, rec.n, rec.attrs["op0"]) == ("vector", 77, 50, "multiply")


@pytest.mark.parametrize("rev0, rev1", [(False, False), (True, False), (False, True), (True, True)])
def test_scan_reverse_operands_subtract_bf16(rev0, rev1):
    a = rng.standard_normal((16, 12)).astype(np.float32)
    b = rng.standard_normal((16, 12)).astype(np.float32)

    def body(x, y, out):
        nisa.tensor_tensor_scan(
            out, x, y, 0.5, nl.subtract, nl.maximum, reverse0=rev0, reverse1=rev1
        )

    got = outputs(body, [a, b], [((16, 12), nl.bfloat16)])
    ref = _scan_ref(a, b, 0.5, np.subtract, np.maximum, rev0, rev1)
    np.testing.assert_array_equal(got, bf16(ref))


@pytest.mark.parametrize(
    "case, rule, target",
    [
        ("exp", "OP", "trn2"),
        ("psum", "BUF", "trn2"),
        ("init2", "FREE", "trn2"),
        ("abs_max", "VERSION", "trn2"),
    ],
)
def test_scan_rules(case, rule, target):
    def body(t, out):
        if case == "exp":
            nisa.tensor_tensor_scan(out, t, t, 0.0, nl.exp, nl.add)
        elif case == "psum":
            ps = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
            nisa.tensor_tensor_scan(out, ps, ps, 0.0, nl.multiply, nl.add)
        elif case == "init2":
            nisa.tensor_tensor_scan(out, t, t, t[:, 0:2], nl.multiply, nl.add)
        else:
            nisa.tensor_tensor_scan(out, t, t, 0.0, nl.abs_max, nl.add)

    _raises(rule, body, [np.zeros((8, 16), np.float32)], [((8, 16), nl.float32)], target)


# ---- tensor_copy_predicated -------------------------------------------------------------
def test_copy_predicated_tile_scalar_and_reverse():
    src = rng.standard_normal((128, 20)).astype(BF16)
    pred = rng.integers(0, 3, (128, 20)).astype(np.uint8)

    def body(s, m, out, out2):
        nisa.memset(out, -1.0)
        nisa.memset(out2, 2.0)
        nisa.tensor_copy_predicated(out[0:77, :], s[0:77, :], m[0:77, :])
        nisa.tensor_copy_predicated(out2, 9.25, m, reverse_pred=True)

    out, out2 = outputs(body, [src, pred], [((128, 20), nl.bfloat16), ((128, 20), nl.bfloat16)])
    ref = np.where(pred[:77] != 0, src[:77], BF16.type(-1.0))
    np.testing.assert_array_equal(out[:77].view(np.uint16), ref.view(np.uint16))
    assert (out[77:] == -1.0).all()
    np.testing.assert_array_equal(out2, np.where(pred == 0, 9.25, 2.0).astype(BF16))


@pytest.mark.parametrize(
    "case, rule", [("pred_float", "DTYPE"), ("dtype", "DTYPE"), ("psum", "BUF")]
)
def test_copy_predicated_rules(case, rule):
    def body(t, out, m):
        if case == "pred_float":
            nisa.tensor_copy_predicated(out, t, t)
        elif case == "dtype":
            nisa.tensor_copy_predicated(m, t, m)
        else:
            ps = nl.ndarray((8, 16), nl.float32, buffer=nl.psum)
            pm = nl.ndarray((8, 16), nl.uint8, buffer=nl.psum)
            nisa.tensor_copy_predicated(out, ps, pm)

    outs = [((8, 16), nl.float32), ((8, 16), nl.uint8)]
    _raises(rule, body, [np.zeros((8, 16), np.float32)], outs)
