"""MX (microscaling) on NC-v4: the packed x4 dtypes, nisa.quantize_mx and nisa.nc_matmul_mx
against NumPy references written here from the NKI 0.6 docs, and their rules."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from tile_harness import expect_rule

from nki_kernels.interp import TensorSpec, nisa, nl, run, settings
from nki_kernels.interp import dtypes as dt
from nki_kernels.perfmodel import costs
from nki_kernels.perfmodel.api import estimate_trace
from nki_kernels.targets import get_target

BF16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(11)
ELEM = {
    "float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8, 8),  # element type, bits, E_max
    "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 8, 15),
    "float4_e2m1fn_x4": (ml_dtypes.float4_e2m1fn, 4, 2),
}


def lanes(words: np.ndarray, name: str) -> np.ndarray:
    """Reference unpacking: value j of a word is bits [j*b, (j+1)*b), lane 0 lowest."""
    elem, bits, _ = ELEM[name]
    w = words.view(np.uint16 if bits == 4 else np.uint32).astype(np.int64)
    codes = np.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(4)], -1)
    out = codes.astype(np.uint8).view(elem).astype(np.float64)
    return out.reshape(*w.shape[:-1], -1)


def pack(values: np.ndarray, name: str) -> np.ndarray:
    """Reference packing of values exactly representable in the element type."""
    elem, bits, _ = ELEM[name]
    codes = values.astype(elem).view(np.uint8).astype(np.int64) & ((1 << bits) - 1)
    codes = codes.reshape(*values.shape[:-1], -1, 4)
    word = sum(codes[..., j] << (bits * j) for j in range(4))
    return word.astype(dt.np_dtype(name))


def ref_quantize(x: np.ndarray, name: str, ocp: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Block scale X = 2^(floor(log2 amax) - (E_max - 1)) per 8 x 4 group (nisa.quantize_mx,
    NKI 0.5+; `ocp`: 2^(floor(log2 amax) - E_max), the OCP sample algorithm's, pre-0.5);
    returns (values / X rounded to the element type, E8M0 codes [P // 8, F // 4])."""
    elem, _, e_max = ELEM[name]
    e_max += int(ocp)
    p, f = x.shape
    amax = np.abs(x.astype(np.float64)).reshape(p // 8, 8, f // 4, 4).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(amax))
    code = np.where(amax == 0, 0, e - (e_max - 1) + 127).astype(np.int64)
    scale = np.repeat(np.repeat(2.0 ** (code - 127), 8, 0), 4, 1)
    q = (x.astype(np.float64) / scale).astype(np.float32)
    if ocp:  # amax / X reaches 2^(E_max + 1), past the largest finite value: saturates
        big = float(ml_dtypes.finfo(elem).max)
        q = np.clip(q, -big, big)
    return q.astype(elem).astype(np.float64), code


def scale_slots(p: int) -> np.ndarray:
    g = np.arange(p // 8)
    return (g // 4) * 32 + g % 4


def test_x4_dtypes_are_packed_words_of_their_documented_width():
    assert nl.float8_e4m3fn_x4 == "float8_e4m3fn_x4" and isinstance(nl.float4_e2m1fn_x4, str)
    assert [dt.itemsize(d) for d in ("float8_e4m3fn_x4", "float8_e5m2_x4")] == [4, 4]
    assert dt.itemsize(nl.float4_e2m1fn_x4) == 2
    host = np.zeros((2, 3), dt.np_dtype(nl.float8_e5m2_x4))
    assert dt.as_dtype(host.dtype) == nl.float8_e5m2_x4 and dt.as_dtype(np.uint32) == nl.uint32


@pytest.mark.parametrize("name", sorted(ELEM))
def test_x4_tiles_load_store_and_view_bit_exactly(name):
    bits = ELEM[name][1]
    words = rng.integers(0, 2 ** (4 * bits), (64, 6)).astype(dt.np_dtype(name))
    raw = words.view(np.uint8)

    def kernel(w, r):
        t = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w)
        c = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=t)  # equal dtypes: a bit copy
        o = nl.ndarray(w.shape, w.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=c)
        viewed = nl.ndarray(w.shape, w.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=viewed, src=r.view(w.dtype))  # uint8 bytes seen as x4
        return o, viewed

    out, viewed = run(kernel, words, raw, target="trn3").outputs
    assert out.dtype == words.dtype and dt.as_dtype(out.dtype) == name
    np.testing.assert_array_equal(out.view(np.uint8), raw)
    np.testing.assert_array_equal(viewed.view(np.uint8), raw)


@pytest.mark.parametrize("name", sorted(ELEM))
def test_packing_rounds_to_nearest_even_and_saturates(name):
    elem, _, _ = ELEM[name]
    vmax = float(ml_dtypes.finfo(elem).max)
    tiny = float(ml_dtypes.finfo(elem).smallest_subnormal)
    # ties between neighbours go to the even code; beyond the range saturates
    values = np.array([[0.0, -0.0, tiny / 2, 1.5 * tiny, vmax, 2 * vmax, -3 * vmax, 1.0]])
    got = lanes(dt.pack_x4(values.astype(np.float32), dt.as_dtype(name)), name)
    want = np.array([[0.0, 0.0, 0.0, 2 * tiny, vmax, vmax, -vmax, 1.0]])
    np.testing.assert_array_equal(got, want)
    back = dt.unpack_x4(pack(want, name), dt.as_dtype(name))
    np.testing.assert_array_equal(back, want)


def _quantize_kernel(name, p, f, scale_offset=0, scale_fill=7):
    def kernel(x):
        src = nl.ndarray((p, f), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        q = nl.ndarray((p, f // 4), name, buffer=nl.sbuf)
        sc = nl.ndarray((p, f // 4), nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=sc, value=scale_fill)
        nisa.quantize_mx(dst=q, src=src, dst_scale=sc[scale_offset:p])
        qo = nl.ndarray(q.shape, q.dtype, buffer=nl.shared_hbm)
        so = nl.ndarray(sc.shape, sc.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=qo, src=q)
        nisa.dma_copy(dst=so, src=sc)
        return qo, so

    return kernel


@pytest.mark.parametrize(
    ("name", "p", "f", "src_dtype"),
    [
        ("float8_e4m3fn_x4", 128, 64, BF16),
        ("float8_e5m2_x4", 32, 8, np.float16),
        ("float8_e4m3fn_x4", 96, 16, np.float16),  # three quadrants (a ragged tile)
        ("float8_e5m2_x4", 64, 4, BF16),
    ],
)
def test_quantize_mx_matches_the_documented_block_scale(name, p, f, src_dtype):
    x = (rng.standard_normal((p, f)) * np.exp2(rng.integers(-6, 6, (p, f)))).astype(src_dtype)
    x[8:16, 0:4] = 0  # an all-zero group: scale 2^-127
    qo, so = run(_quantize_kernel(name, p, f), x, target="trn3").outputs
    q, code = ref_quantize(x, name)
    np.testing.assert_array_equal(lanes(qo, name), q)
    slots = scale_slots(p)
    np.testing.assert_array_equal(so[slots], code)
    assert code[1, 0] == 0
    untouched = np.setdiff1d(np.arange(p), slots)
    assert (so[untouched] == 7).all()  # only the groups' slots are written


@pytest.mark.parametrize("name", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
def test_pre_05_mx_scale_is_the_ocp_sample_algorithms(name):
    x = (rng.standard_normal((32, 16)) * np.exp2(rng.integers(-6, 6, (32, 16)))).astype(BF16)
    with settings(mx_scale="pre-0.5"):
        qo, so = run(_quantize_kernel(name, 32, 16), x, target="trn3").outputs
    q, code = ref_quantize(x, name, ocp=True)
    np.testing.assert_array_equal(lanes(qo, name), q)
    np.testing.assert_array_equal(so[scale_slots(32)], code)
    # the default (NKI 0.6) scale is one exponent code larger in every non-zero group
    _, so6 = run(_quantize_kernel(name, 32, 16), x, target="trn3").outputs
    np.testing.assert_array_equal(so6[scale_slots(32)].astype(int), code + 1)


def test_mx_scale_and_fresh_memory_settings_name_bad_values():
    with pytest.raises(
        ValueError, match=re.escape("mx_scale: expected one of nki-0.6, pre-0.5; got '0.4'")
    ):
        with settings(mx_scale="0.4"):
            pass
    with pytest.raises(
        ValueError, match=re.escape("fresh_memory: expected 'poison' or 'zero'; got 'x'")
    ):
        with settings(fresh_memory="x"):
            pass


def test_fresh_memory_zero_fills_unwritten_bytes_and_is_restored():
    def kernel(x):
        t = nl.ndarray((4, 4), nl.uint8, buffer=nl.sbuf)
        f = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t[0:2, :], value=9)
        out = nl.ndarray((4, 4), nl.uint8, buffer=nl.shared_hbm)
        outf = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        nisa.dma_copy(dst=outf, src=f)
        return out, outf

    x = np.zeros((4, 4), np.float32)
    with settings(fresh_memory="zero"):
        t, f = run(kernel, x).outputs
    assert (t[:2] == 9).all() and (t[2:] == 0).all() and (f == 0).all()
    t, f = run(kernel, x).outputs  # the default again: poison
    assert (t[2:] != 0).all() and np.isnan(f).all()


def test_quantize_mx_packs_scales_at_a_quadrant_offset():
    x = rng.standard_normal((64, 8)).astype(BF16)
    qo, so = run(
        _quantize_kernel("float8_e4m3fn_x4", 64, 8, scale_offset=4), x, target="trn3"
    ).outputs
    q, code = ref_quantize(x, "float8_e4m3fn_x4")
    np.testing.assert_array_equal(lanes(qo, "float8_e4m3fn_x4"), q)
    np.testing.assert_array_equal(so[4 + scale_slots(64)], code)
    assert (so[:4] == 7).all()


def _dequant(words, codes, name):
    v = lanes(words, name)  # [K, 4F]
    return v * np.repeat(np.repeat(2.0 ** (codes.astype(np.float64) - 127), 8, 0), 4, 1)


def _matmul_kernel(k, m, n, sname, mname, dst_dtype=nl.float32, chain=1, tiling=None):
    def kernel(s, ss, mv, ms):
        acc = nl.ndarray((m, n), dst_dtype, buffer=nl.psum)
        tiles = []
        for h, d in ((s, sname), (ss, nl.uint8), (mv, mname), (ms, nl.uint8)):
            t = nl.ndarray(h.shape[1:], d, buffer=nl.sbuf)
            tiles.append(t)
        for i in range(chain):
            for t, h in zip(tiles, (s, ss, mv, ms)):
                nisa.dma_copy(dst=t, src=h[i])
            kw = {} if tiling is None else {"tile_position": tiling[0], "tile_size": tiling[1]}
            nisa.nc_matmul_mx(
                dst=acc, stationary=tiles[0], moving=tiles[2], stationary_scale=tiles[1],
                moving_scale=tiles[3], accumulate=i > 0, **kw,
            )  # fmt: skip
        sb = nl.ndarray((m, n), dst_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=acc)
        o = nl.ndarray((m, n), dst_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=sb)
        return o

    return kernel


def _mx_operand(chain, k, f, name):
    elem, _, _ = ELEM[name]
    vals = rng.standard_normal((chain, k, 4 * f)).astype(np.float32).astype(elem)
    words = pack(vals.astype(np.float64), name)
    codes = np.zeros((chain, k, f), np.uint8)  # hardware layout: 4 slots per quadrant
    dense = rng.integers(120, 134, (chain, k // 8, f)).astype(np.uint8)
    codes[:, scale_slots(k)] = dense
    return words, codes, dense


@pytest.mark.parametrize(
    ("k", "m", "n", "sname", "mname", "chain"),
    [
        (128, 128, 512, "float8_e4m3fn_x4", "float8_e4m3fn_x4", 1),
        (32, 6, 40, "float4_e2m1fn_x4", "float8_e5m2_x4", 2),  # MXFP4 x MXFP8, accumulated
        (96, 34, 16, "float8_e5m2_x4", "float4_e2m1fn_x4", 1),  # ragged: three quadrants
    ],
)
def test_nc_matmul_mx_matches_dequantized_matmul(k, m, n, sname, mname, chain):
    s, ss, sd = _mx_operand(chain, k, m, sname)
    mv, ms, md = _mx_operand(chain, k, n, mname)
    got = run(_matmul_kernel(k, m, n, sname, mname, chain=chain), s, ss, mv, ms, target="trn3")
    want = sum(
        _dequant(s[i], sd[i], sname).reshape(k, m, 4).transpose(1, 0, 2).reshape(m, -1)
        @ _dequant(mv[i], md[i], mname).reshape(k, n, 4).transpose(1, 0, 2).reshape(n, -1).T
        for i in range(chain)
    )
    np.testing.assert_allclose(got.outputs, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_nc_matmul_mx_bf16_dst_rounds_and_row_tiling_runs():
    s, ss, sd = _mx_operand(1, 64, 8, "float8_e4m3fn_x4")
    mv, ms, md = _mx_operand(1, 64, 16, "float8_e4m3fn_x4")
    kernel = _matmul_kernel(
        64, 8, 16, "float8_e4m3fn_x4", "float8_e4m3fn_x4", nl.bfloat16, tiling=((64, 0), (64, 128))
    )
    got = run(kernel, s, ss, mv, ms, target="trn3").outputs
    d_s = _dequant(s[0], sd[0], "float8_e4m3fn_x4").reshape(64, 8, 4).transpose(1, 0, 2)
    d_m = _dequant(mv[0], md[0], "float8_e4m3fn_x4").reshape(64, 16, 4).transpose(1, 0, 2)
    want = (d_s.reshape(8, -1) @ d_m.reshape(16, -1).T).astype(np.float32).astype(BF16)
    np.testing.assert_array_equal(got, want)


def test_mx_instructions_are_traced_and_priced():
    x = rng.standard_normal((128, 512)).astype(BF16)

    def kernel(xh):
        src = nl.ndarray((128, 512), xh.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=xh)
        q = nl.ndarray((128, 128), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        sc = nl.ndarray((128, 128), nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=src, dst_scale=sc)
        acc = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=q, moving=q, stationary_scale=sc, moving_scale=sc)
        o = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        sb = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=acc)
        nisa.dma_copy(dst=o, src=sb)
        return o

    res = run(kernel, x, target="trn3", trace_only=False)
    qrec = next(i for i in res.trace if i.opcode == "quantize_mx")
    mrec = next(i for i in res.trace if i.opcode == "nc_matmul_mx")
    assert (qrec.engine, qrec.p, qrec.n) == ("vector", 128, 512)
    assert (mrec.engine, mrec.attrs["K"], mrec.attrs["M"], mrec.attrs["N"]) == (
        "tensor", 512, 128, 128,
    )  # fmt: skip
    assert mrec.flops == 2 * 512 * 128 * 128
    # modeled (cost model, trn3): a bf16 matmul's max(N, 64) cycles (plus the fitted
    # cycles per TensorE instruction, cost model v3) for 4x the contraction; QuantizeMX at
    # 4 elements per partition per cycle
    tgt = get_target("trn3")
    mm_cycles = 128 + tgt.matmul_extra_cycles
    assert costs.compute_ns(mrec, tgt) == pytest.approx(mm_cycles / tgt.tensor_ghz)
    assert costs.compute_ns(qrec, tgt) == pytest.approx(512 / 4 / tgt.vector_ghz)
    est = estimate_trace(res.trace, "trn3")
    assert est.latency_ns > 0 and est.flops == mrec.flops
    # trace-only mode records the same instructions without computing
    spec = run(kernel, TensorSpec((128, 512), nl.bfloat16), target="trn3", trace_only=True)
    assert [i.opcode for i in spec.trace] == [i.opcode for i in res.trace]
    assert isinstance(spec.outputs, TensorSpec)
    # the dequantized product of x with itself is x.T @ x up to the fp8 rounding
    xd = x.astype(np.float64)
    want = np.einsum("kiq,kjq->ij", xd.reshape(128, 128, 4), xd.reshape(128, 128, 4))
    err = np.abs(res.outputs - want).max() / np.abs(want).max()
    assert err < 0.05


# ---- rules --------------------------------------------------------------------------------
def _rule(rule, kernel, *args, target="trn3"):
    expect_rule(rule, run, kernel, *args, target=target)


def test_mx_instructions_need_neuroncore_v4():
    x = rng.standard_normal((32, 8)).astype(BF16)
    _rule("VERSION", _quantize_kernel("float8_e4m3fn_x4", 32, 8), x, target="trn2")
    s, ss, _ = _mx_operand(1, 32, 4, "float8_e4m3fn_x4")
    kernel = _matmul_kernel(32, 4, 4, "float8_e4m3fn_x4", "float8_e4m3fn_x4")
    _rule("VERSION", kernel, s, ss, s, ss, target="trn2")


def test_quantize_mx_shape_dtype_and_scale_placement_rules():
    x = rng.standard_normal((48, 8)).astype(BF16)
    _rule("MX_SHAPE", _quantize_kernel("float8_e4m3fn_x4", 48, 8), x)  # not 32-multiple
    x64 = rng.standard_normal((64, 8)).astype(BF16)
    _rule("MX_SCALE", _quantize_kernel("float8_e4m3fn_x4", 64, 8, scale_offset=2), x64)
    _rule("MX_SCALE", _quantize_kernel("float8_e4m3fn_x4", 64, 8, scale_offset=30), x64)
    _rule("DTYPE", _quantize_kernel("float4_e2m1fn_x4", 64, 8), x64)  # no fp4 output
    _rule("DTYPE", _quantize_kernel("float8_e4m3fn_x4", 64, 8), x64.astype(np.float32))


def test_nc_matmul_mx_shape_and_tiling_rules():
    s, ss, _ = _mx_operand(1, 32, 5, "float8_e4m3fn_x4")
    odd = _matmul_kernel(32, 5, 5, "float8_e4m3fn_x4", "float8_e4m3fn_x4")
    _rule("MM_M", odd, s, ss, s, ss)
    s, ss, _ = _mx_operand(1, 64, 4, "float8_e4m3fn_x4")
    col_tiled = _matmul_kernel(
        64, 4, 4, "float8_e4m3fn_x4", "float8_e4m3fn_x4", tiling=((0, 0), (64, 64))
    )
    _rule("ARG", col_tiled, s, ss, s, ss)
    small = _matmul_kernel(
        64, 4, 4, "float8_e4m3fn_x4", "float8_e4m3fn_x4", tiling=((0, 0), (32, 128))
    )
    _rule("MM_K", small, s, ss, s, ss)


def test_engines_cannot_convert_values_to_or_from_x4():
    def to_x4(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        q = nl.ndarray(x.shape, nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.tensor_copy(dst=q, src=t)

    def from_x4(x):
        q = nl.ndarray(x.shape, nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(dst=q, value=0)
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=q)

    def memset_one(x):
        q = nl.ndarray(x.shape, nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(dst=q, value=1.0)

    x = np.ones((32, 4), np.float32)
    _rule("DTYPE_X4", to_x4, x)
    _rule("DTYPE_X4", from_x4, x)
    _rule("MEMSET_X4", memset_one, x)


def test_float8_e8m0fnu_scales_hold_the_same_codes_as_uint8():
    x = rng.standard_normal((32, 16)).astype(BF16)

    def kernel(xh):
        src = nl.ndarray((32, 16), xh.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=xh)
        q = nl.ndarray((32, 4), nl.float8_e5m2_x4, buffer=nl.sbuf)
        sc = nl.ndarray((4, 4), nl.float8_e8m0fnu, buffer=nl.sbuf)  # [P // 8, F // 4] for P <= 32
        nisa.quantize_mx(dst=q, src=src, dst_scale=sc)
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=q, moving=q, stationary_scale=sc, moving_scale=sc)
        so = nl.ndarray((4, 4), nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=so, src=sc.view(nl.uint8))
        sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=acc)
        o = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=sb)
        return so, o

    so, o = run(kernel, x, target="trn3").outputs
    q, code = ref_quantize(x, "float8_e5m2_x4")
    np.testing.assert_array_equal(so, code)
    d = q * np.repeat(np.repeat(2.0 ** (code - 127.0), 8, 0), 4, 1)  # [32, 16] dequantized
    want = np.einsum("kiq,kjq->ij", d.reshape(32, 4, 4), d.reshape(32, 4, 4))
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
