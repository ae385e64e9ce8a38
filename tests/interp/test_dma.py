"""DMA instructions against NumPy: dma_copy (ragged tiles, casts through fp32, indirect
gather/scatter with oob_mode) and dma_transpose; plus their trace records and rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tile_harness import expect_rule

from nki_kernels.interp import NkiValidationError, nisa, nl, run

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3)
rng = np.random.default_rng(3)


def _raises(rule, kernel, *args, target="trn2"):
    return expect_rule(rule, run, kernel, *args, target=target)


def _via_sbuf(x, dst_dtype, out_dtype=None):
    """HBM x -> SBUF tile of dst_dtype -> HBM tensor of out_dtype (default dst_dtype)."""

    def kernel(h):
        sb = nl.ndarray(h.shape, dst_dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=h)
        out = nl.ndarray(h.shape, out_dtype or dst_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return run(kernel, x).outputs


def test_ragged_row_tiles_copy_exactly_and_leave_unwritten_partitions_nan():
    x = rng.standard_normal((300, 70)).astype(np.float32)

    def kernel(h):
        n, f = h.shape
        out = nl.ndarray((n, f), h.dtype, buffer=nl.shared_hbm)
        last = nl.ndarray((128, f), h.dtype, buffer=nl.shared_hbm)
        for r0 in range(0, n, 128):
            rows = min(128, n - r0)
            sb = nl.ndarray((128, f), h.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=sb[0:rows, :], src=h[r0 : r0 + rows, :])
            nisa.dma_copy(dst=out[r0 : r0 + rows, :], src=sb[0:rows, :])
        nisa.dma_copy(dst=last, src=sb)
        return out, last

    res = run(kernel, x)
    out, last = res.outputs
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(last[:44], x[256:])
    assert np.isnan(last[44:]).all()
    recs = [i for i in res.trace if i.opcode == "dma_copy"]
    assert len(recs) == 7
    # HBM -> SBUF of 44 rows x 70 fp32: one descriptor per partition row
    assert (recs[4].p, recs[4].n, recs[4].hbm_read) == (44, 70, 44 * 70 * 4)
    assert recs[4].attrs["descriptors"] == 44
    assert recs[4].attrs["descriptor_bytes"] == 280


@pytest.mark.parametrize(
    ("src_dtype", "dst_dtype"),
    [
        (np.float32, BF16),
        (np.float32, np.float16),
        (BF16, FP8),
        (np.float32, np.dtype(ml_dtypes.float8_e5m2)),
        (np.int32, np.float32),
        (BF16, np.float32),
    ],
)
def test_dtype_casts_round_through_fp32(src_dtype, dst_dtype):
    x = (rng.standard_normal((16, 33)) * 50).astype(src_dtype)
    got = _via_sbuf(x, dst_dtype)
    ref = x.astype(np.float32).astype(dst_dtype)
    assert got.dtype == np.dtype(dst_dtype)
    np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_float_to_int_rounds_half_to_even_and_saturates():
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 126.6, 300.0, -300.0, np.nan, np.inf]], np.float32)
    got = _via_sbuf(x, nl.int8)
    np.testing.assert_array_equal(got[0], [0, 2, 2, 0, -2, 127, 127, -128, 0, 127])


def test_int_to_int_casts_go_through_fp32():
    # 2**24 + 1 is not an fp32 value: through fp32 it becomes 2**24, then saturates to int16
    x = np.array([[2**24 + 1, -(2**24) - 1, 7, -9]], np.int32)
    got = _via_sbuf(x, nl.int32, out_dtype=nl.int16)
    np.testing.assert_array_equal(got[0], [32767, -32768, 7, -9])
    wide = _via_sbuf(x, nl.float32)
    assert wide[0, 0] == np.float32(2**24)


def test_broadcast_source_replicates_rows():
    w = rng.standard_normal((9,)).astype(np.float32)

    def kernel(h):
        sb = nl.ndarray((5, 9), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=h.reshape((1, 9)).broadcast(0, 5))
        out = nl.ndarray((5, 9), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    np.testing.assert_array_equal(run(kernel, w).outputs, np.tile(w, (5, 1)))


def test_copy_order_is_row_major_when_shapes_differ():
    x = rng.standard_normal((6, 4)).astype(np.float32)

    def kernel(h):
        sb = nl.ndarray((3, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=h)
        out = nl.ndarray((3, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    np.testing.assert_array_equal(run(kernel, x).outputs, x.reshape(3, 8))


# ---- indirect gather / scatter ----------------------------------------------------------
def _gather_rows(table, idx, *, skip=False, dtype=None):
    """out[p] = table[idx[p]] via `.ap(vector_offset=...)` (the nki-library MoE pattern)."""

    def kernel(t, ix):
        p, h = ix.shape[0], t.shape[-1]
        idx_sb = nl.ndarray((p, 1), ix.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        rows = nl.ndarray((p, h), dtype or t.dtype, buffer=nl.sbuf)
        nisa.memset(dst=rows, value=-1)
        nisa.dma_copy(
            dst=rows[0:p, 0:h],
            src=t.ap([[h, p], [1, h]], offset=0, vector_offset=idx_sb, indirect_dim=0),
            oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error,
        )
        out = nl.ndarray((p, h), rows.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=rows)
        return out

    return run(kernel, table, idx).outputs


def test_vector_offset_gather_reads_one_row_per_partition():
    table = rng.standard_normal((50, 24)).astype(np.float32)
    idx = rng.integers(0, 50, size=(97, 1)).astype(np.int32)
    np.testing.assert_array_equal(_gather_rows(table, idx), table[idx[:, 0]])


def test_vector_offset_gather_with_cast_to_bf16():
    table = rng.standard_normal((20, 16)).astype(np.float32)
    idx = np.array([[3], [19], [0], [3]], np.uint32)
    got = _gather_rows(table, idx, dtype=nl.bfloat16)
    np.testing.assert_array_equal(got, table[[3, 19, 0, 3]].astype(BF16))


def test_out_of_bounds_index_errors_unless_skipped():
    table = rng.standard_normal((10, 8)).astype(np.float32)
    idx = np.array([[1], [10], [-1], [9], [0xFFFFFFFF]], np.int64).astype(np.uint32)
    with pytest.raises(NkiValidationError) as e:
        _gather_rows(table, idx)
    assert e.value.rule == "DMA_OOB" and "oob_mode" in str(e.value)
    got = _gather_rows(table, idx, skip=True)
    np.testing.assert_array_equal(got[[0, 3]], table[[1, 9]])
    assert (got[[1, 2, 4]] == -1).all()  # skipped rows keep the destination


def test_oob_skip_keeps_integer_destination_bits():
    table = np.arange(40, dtype=np.int32).reshape(10, 4)
    idx = np.array([[2], [77], [5]], np.int32)
    got = _gather_rows(table, idx, skip=True)
    np.testing.assert_array_equal(got, [[8, 9, 10, 11], [-1, -1, -1, -1], [20, 21, 22, 23]])


def test_sharded_vector_gather_reads_token_rows_of_one_shard():
    # moe_cte shard_on_block: output (T, 2, H), pattern [[2H, P], [1, H]] + offset of the
    # shard's half; the index is a token, i.e. a row of the tensor's dim 0 (stride 2H)
    shards, tokens, h = 2, 11, 6
    data = rng.standard_normal((tokens, shards, h)).astype(np.float32)
    idx = np.array([[4], [0], [10], [4], [7]], np.int32)

    def kernel(t, ix):
        idx_sb = nl.ndarray((5, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        outs = []
        for shard in range(shards):
            rows = nl.ndarray((5, h), nl.float32, buffer=nl.sbuf)
            src = t.ap([[shards * h, 5], [1, h]], offset=shard * h, vector_offset=idx_sb)
            nisa.dma_copy(dst=rows, src=src)
            o = nl.ndarray((5, h), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=rows)
            outs.append(o)
        return tuple(outs)

    for shard, got in enumerate(run(kernel, data, idx).outputs):
        np.testing.assert_array_equal(got, data[idx[:, 0], shard])


def test_a_vector_index_counts_rows_of_the_tensor_not_pattern_partition_steps():
    """router_topk scatters into a flattened (T*E,) view with partition stride k (the
    index is the flat element); attention_block_tkg writes a (B*S, d) cache with
    partition stride 1 (the index is a row, scaled by d)."""
    t, e, k = 4, 8, 2
    flat_idx = np.array([[1], [9], [18], [31]], np.int32)  # token r's expert: r*E + expert
    vals = np.arange(1, t + 1, dtype=np.float32).reshape(t, 1)

    def scatter_flat(ix, v):
        idx_sb = nl.ndarray((t, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        v_sb = nl.ndarray((t, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb, src=v)
        out = nl.ndarray((t, e), nl.float32, buffer=nl.shared_hbm)
        zero = nl.ndarray((t, e), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        nisa.dma_copy(dst=out, src=zero)
        flat = out.reshape((t * e,))
        nisa.dma_copy(dst=flat.ap([[k, t], [1, 1]], offset=0, vector_offset=idx_sb), src=v_sb)
        return out

    want = np.zeros(t * e, np.float32)
    want[flat_idx[:, 0]] = vals[:, 0]
    got = run(scatter_flat, flat_idx, vals).outputs
    np.testing.assert_array_equal(got, want.reshape(t, e))

    rows, d = 6, 4
    cache = rng.standard_normal((rows, d)).astype(np.float32)
    row_idx = np.array([[5], [2]], np.int32)

    def gather_rows(c, ix):
        idx_sb = nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        sb = nl.ndarray((2, d), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=c.ap([[1, 2], [1, d]], offset=0, vector_offset=idx_sb))
        out = nl.ndarray((2, d), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    np.testing.assert_array_equal(run(gather_rows, cache, row_idx).outputs, cache[[5, 2]])


def test_vector_offset_scatter_writes_rows_back_in_place():
    out = np.zeros((12, 5), np.float32)
    src = rng.standard_normal((4, 5)).astype(np.float32)
    idx = np.array([[7], [2], [11], [30]], np.int32)

    def kernel(o, s, ix):
        idx_sb = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        rows = nl.ndarray((4, 5), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=s)
        nisa.dma_copy(
            dst=o.ap([[5, 4], [1, 5]], vector_offset=idx_sb, indirect_dim=0),
            src=rows,
            oob_mode=nisa.oob_mode.skip,
        )

    run(kernel, out, src, idx)
    ref = np.zeros((12, 5), np.float32)
    ref[[7, 2, 11]] = src[:3]
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(NkiValidationError) as e:

        def strict(o, s, ix):
            idx_sb = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=idx_sb, src=ix)
            rows = nl.ndarray((4, 5), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=rows, src=s)
            nisa.dma_copy(dst=o.ap([[5, 4], [1, 5]], vector_offset=idx_sb), src=rows)

        run(strict, out, src, idx)
    assert e.value.rule == "DMA_OOB"


def test_scalar_offset_from_a_tile_a_register_and_dynamic_select():
    # k: (batch, seqlen, d); rows [off, off + 4) of batch 1 (attention_cte's strided load)
    k = rng.standard_normal((2, 10, 3)).astype(np.float32)

    def kernel(kh, oh):
        o_sb = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=o_sb, src=oh)
        a = nl.ndarray((4, 3), nl.float32, buffer=nl.sbuf)
        src = kh.ap([[3, 4], [1, 3]], offset=30, scalar_offset=o_sb, indirect_dim=1)
        nisa.dma_copy(dst=a, src=src)
        reg = nisa.register_alloc(1)
        b = nl.ndarray((1, 10, 3), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=kh.ap([[30, 1], [3, 10], [1, 3]], scalar_offset=reg))
        one = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=one, value=1)
        sel = nl.ndarray((10, 3), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sel, src=kh.select(0, one))
        outs = []
        for t in (a, b, sel):
            o = nl.ndarray(t.shape, nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=t)
            outs.append(o)
        return tuple(outs)

    for off in (0, 5, 6):
        a, b, sel = run(kernel, k, np.array([[off]], np.int32)).outputs
        np.testing.assert_array_equal(a, k[1, off : off + 4])
        np.testing.assert_array_equal(b[0], k[1])
        np.testing.assert_array_equal(sel, k[1])


def test_scalar_offset_out_of_bounds_is_an_error():
    k = rng.standard_normal((2, 10, 3)).astype(np.float32)

    def kernel(kh):
        reg = nisa.register_alloc(2)
        b = nl.ndarray((1, 30), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=kh.ap([[30, 1], [1, 30]], scalar_offset=reg))

    _raises("DMA_OOB", kernel, k)

    def ok(kh):
        reg = nisa.register_alloc(1)
        b = nl.ndarray((1, 30), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=kh.ap([[30, 1], [1, 30]], scalar_offset=reg))
        o = nl.ndarray((1, 30), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=b)
        return o

    np.testing.assert_array_equal(run(ok, k).outputs[0], k[1].reshape(-1))


def test_vector_select_gathers_rows_of_a_3d_tensor():
    data = rng.standard_normal((6, 2, 4)).astype(np.float32)
    idx = np.array([[5], [1], [1]], np.int32)

    def kernel(d, ix):
        idx_sb = nl.ndarray((3, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        rows = nl.ndarray((3, 2, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=d.vector_select(0, idx_sb))
        o = nl.ndarray((3, 2, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=rows)
        return o

    np.testing.assert_array_equal(run(kernel, data, idx).outputs, data[[5, 1, 1]])


# ---- dma_transpose ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "axes"), [((40, 24), (1, 0)), ((3, 5, 8), (2, 1, 0)), ((2, 3, 4, 5), (3, 1, 2, 0))]
)
def test_dma_transpose_permutes(shape, axes):
    x = rng.standard_normal(shape).astype(BF16)
    out_shape = tuple(shape[a] for a in axes)

    def kernel(h):
        sb = nl.ndarray(out_shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=sb, src=h, axes=axes)
        o = nl.ndarray(out_shape, nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=sb)
        return o

    res = run(kernel, x)
    np.testing.assert_array_equal(res.outputs, np.transpose(x, axes))
    rec = next(i for i in res.trace if i.opcode == "dma_transpose")
    assert rec.engine == "dma" and rec.attrs["descriptors"] == x.size


def test_dma_transpose_of_fp32_on_trn2_and_its_trace_record():
    # trn2's DMA transposes 4-byte elements too; the record carries the transpose's shape
    x = rng.standard_normal((24, 40)).astype(np.float32)

    def kernel(h):
        a = nl.ndarray((40, 24), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=a, src=h)
        b = nl.ndarray((24, 40), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=b, src=a)
        o = nl.ndarray((24, 40), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=b)
        return o

    res = run(kernel, x, target="trn2")
    np.testing.assert_array_equal(res.outputs, x)
    first, second = [i for i in res.trace if i.opcode == "dma_transpose"]
    assert (first.attrs["transpose"], second.attrs["transpose"]) == ("hbm2sbuf", "sbuf2sbuf")
    assert (first.p, first.attrs["transpose_inner"], first.attrs["itemsize"]) == (40, 24, 4)
    assert first.nbytes == second.nbytes == 24 * 40 * 4


def test_dma_transpose_of_a_ragged_hbm_window_into_an_sbuf_window():
    x = rng.standard_normal((100, 60)).astype(BF16)

    def kernel(h):
        sb = nl.ndarray((128, 96), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=sb[5:45, 2:79], src=h[13:90, 7:47])
        o = nl.ndarray((128, 96), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=sb)
        return o

    got = run(kernel, x).outputs.astype(np.float32)
    np.testing.assert_array_equal(got[5:45, 2:79], x[13:90, 7:47].T.astype(np.float32))
    untouched = np.ones_like(got, dtype=bool)
    untouched[5:45, 2:79] = False
    assert np.isnan(got[untouched]).all()


def test_indirect_dma_transpose_with_2d_indices_reads_them_column_major():
    # two index columns need 128 index rows (the documented indirect-transpose limits)
    src = rng.standard_normal((300, 16)).astype(np.float16)
    idx = rng.integers(0, 300, size=(128, 2)).astype(np.uint32)

    def kernel(s, ix):
        idx_sb = nl.ndarray((128, 2), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx_sb, src=ix)
        dst = nl.ndarray((16, 256), nl.float16, buffer=nl.sbuf)
        nisa.dma_transpose(
            dst=dst, src=s.ap([[16, 256], [1, 16]], vector_offset=idx_sb), axes=(1, 0)
        )
        o = nl.ndarray((16, 256), nl.float16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=dst)
        return o

    flat = idx.T.reshape(-1)
    np.testing.assert_array_equal(run(kernel, src, idx).outputs, src[flat].T)


# ---- rules ----------------------------------------------------------------------------------
def _k_psum_src(h):
    ps = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
    o = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=ps)


def _k_psum_dst(h):
    ps = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
    nisa.dma_copy(dst=ps, src=h)


def _k_count(h):
    sb = nl.ndarray((4, 5), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h)


def _k_hwdge_cast(h):
    sb = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, dge_mode=nisa.dge_mode.hwdge)


def _k_engine_without_hwdge(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, engine=nisa.engine.scalar)


def _k_vector_engine(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, engine=nisa.engine.vector, dge_mode=nisa.dge_mode.hwdge)


def _k_raw_enum(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, oob_mode=1)


def _k_unknown_kwarg(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, mask=None)


def _k_priority(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=h, priority=1)


def _k_transpose_fp32(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(dst=sb, src=h)


def _k_transpose_fp32_hwdge(h):
    sb = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(dst=sb, src=h, dge_mode=nisa.dge_mode.hwdge)


def _k_transpose_fp32_to_bf16(h):
    sb = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=sb, src=h)


def _k_transpose_to_hbm(h):
    o = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_transpose(dst=o, src=h)


def _k_transpose_shape(h):
    sb = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
    src = nl.ndarray((4, 2), nl.bfloat16, buffer=nl.hbm)
    nisa.dma_transpose(dst=sb, src=src)


def _k_transpose_axes(h):
    sb = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf)
    src = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.hbm)
    nisa.dma_transpose(dst=sb, src=src, axes=(0, 1))


@pytest.mark.parametrize(
    ("kernel", "rule", "target"),
    [
        (_k_psum_src, "DMA_PSUM", "trn2"),
        (_k_psum_dst, "DMA_PSUM", "trn2"),
        (_k_count, "DMA_COUNT", "trn2"),
        (_k_hwdge_cast, "DTYPE", "trn2"),
        (_k_hwdge_cast, "VERSION", "trn1"),
        (_k_engine_without_hwdge, "ARG", "trn2"),
        (_k_vector_engine, "ENGINE", "trn2"),
        (_k_raw_enum, "ARG", "trn2"),
        (_k_unknown_kwarg, "KWARG", "trn2"),
        (_k_priority, "VERSION", "trn2"),
        (_k_transpose_fp32, "DTYPE", "trn1"),  # 4-byte transposes: NC-v3+ only
        (_k_transpose_fp32_hwdge, "DTYPE", "trn2"),  # ... and not through the hardware DGE
        (_k_transpose_fp32_to_bf16, "DTYPE", "trn2"),
        (_k_transpose_to_hbm, "BUF", "trn2"),
        (_k_transpose_shape, "TRANSPOSE", "trn2"),
        (_k_transpose_axes, "TRANSPOSE", "trn2"),
    ],
)
def test_dma_rules(kernel, rule, target):
    _raises(rule, kernel, np.zeros((4, 4), np.float32), target=target)


def test_dma_count_error_names_both_counts():
    err = _raises("DMA_COUNT", _k_count, np.zeros((4, 4), np.float32))
    assert "holds 20 elements" in str(err) and "holds 16" in str(err)


def test_dma_transpose_with_static_descriptors_dge_none():
    """dge_mode.none is a documented value (nki-library's mlp_tkg passes it as 3)."""
    x = rng.standard_normal((48, 20)).astype(BF16)

    def kernel(h):
        sb = nl.ndarray((20, 48), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=sb, src=h, dge_mode=nisa.dge_mode.none)
        sb2 = nl.ndarray((48, 20), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=sb2, src=sb, dge_mode=3)
        o = nl.ndarray((20, 48), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=sb)
        o2 = nl.ndarray((48, 20), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=sb2)
        return o, o2

    t, back = run(kernel, x).outputs
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(back, x)


def test_indirect_dma_transpose_needs_a_dge():
    src = rng.standard_normal((40, 16)).astype(np.float16)
    idx = np.arange(8, dtype=np.uint32).reshape(8, 1)

    def kernel(h, i):
        it = nl.ndarray((8, 1), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=it, src=i)
        sb = nl.ndarray((16, 8), nl.float16, buffer=nl.sbuf)
        view = h.ap([[16, 8], [1, 16]], vector_offset=it)
        nisa.dma_transpose(dst=sb, src=view, dge_mode=nisa.dge_mode.none)

    with pytest.raises(NkiValidationError) as e:
        run(kernel, src, idx)
    assert e.value.rule == "ARG"
    assert "indirect source needs dge_mode unknown or swdge" in str(e.value)
