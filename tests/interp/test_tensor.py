"""Tensors and views: allocation, indexing rules, view methods and `.ap()` patterns.

Views are checked two ways: their shape/strides/offset attributes inside a kernel, and the
values an instruction reads through them against the same NumPy view of the input.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from tile_harness import expect_rule

from nki_kernels.interp import NkiValidationError, nisa, nl, run

BF16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(7)


def _gather(view_fn, x, *, out_shape=None):
    """Copy `view_fn(x_hbm)` (any HBM view) into a fresh shared_hbm tensor via SBUF."""

    def kernel(xh):
        v = view_fn(xh)
        shape = out_shape or (v.size,)
        sb = nl.ndarray((1, v.size), v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(sb, v)
        out = nl.ndarray(shape, v.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, sb)
        return out

    return run(kernel, x).outputs


def _in_kernel(body, *args, target="trn2"):
    return run(body, *args, target=target)


def _raises(rule, body, *args, target="trn2"):
    return expect_rule(rule, _in_kernel, body, *args, target=target)


# ---- on-chip int indexing keeps dim 0 and stays >= 2-D --------------------------------
def test_on_chip_int_indexing_keeps_partition_dim_and_two_dims():
    seen = {}

    def body():
        t = nl.ndarray((64, 64, 64), nl.float32, buffer=nl.sbuf)
        seen["a"] = t[0, 0, 10]
        seen["b"] = t[:, 0, 10]
        seen["c"] = t[3]
        seen["d"] = t[..., 5]
        seen["e"] = t[-1, 2:4]

    _in_kernel(body)
    a, b, c, d, e = (seen[k] for k in "abcde")
    assert (a.shape, a.offset) == ((1, 1), 10)
    assert (b.shape, b.strides, b.offset) == ((64, 1), (4096, 1), 10)
    assert (c.shape, c.offset) == ((1, 64, 64), 3 * 4096)
    assert (d.shape, d.strides, d.offset) == ((64, 64), (4096, 64), 5)
    assert (e.shape, e.offset) == ((1, 2, 64), 63 * 4096 + 2 * 64)


def test_hbm_int_indexing_drops_dims_numpy_style():
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    np.testing.assert_array_equal(_gather(lambda h: h[1], x, out_shape=(5, 6)), x[1])
    np.testing.assert_array_equal(_gather(lambda h: h[-1, :, 2], x), x[-1, :, 2])
    np.testing.assert_array_equal(_gather(lambda h: h[1, 2, 3], x), x[1, 2, 3].reshape(1))
    seen = {}

    def body(h):
        seen["v"] = h[1, 2, 3]

    _in_kernel(body, x)
    assert seen["v"].shape == (1,)  # HBM results stay at least 1-D


def test_slices_steps_ds_and_negative_indexes_read_the_numpy_elements():
    x = rng.standard_normal((9, 20)).astype(np.float32)
    cases = [
        (lambda h: h[2:7, 3:19:4], x[2:7, 3:19:4]),
        (lambda h: h[nl.ds(4, 3), -5:], x[4:7, -5:]),
        (lambda h: h[::-2, 1], x[::-2, 1]),
        (lambda h: h[..., 7:8], x[..., 7:8]),
    ]
    for view_fn, ref in cases:
        np.testing.assert_array_equal(_gather(view_fn, x, out_shape=ref.shape), ref)


@pytest.mark.parametrize(
    "key",
    [
        lambda t: t[64, 0],  # int past the end
        lambda t: t[0:65, :],  # slice past the end (no clamping)
        lambda t: t[:, -33],
        lambda t: t[:, 5:3],
        lambda t: t[0, 0, 0],  # too many indexes
        lambda t: t[..., ..., 0],
        lambda t: t[1.0, 0],  # tensor values need .ap()/select
        lambda t: t[:, nl.ds(30, 3)],
    ],
)
def test_out_of_range_and_malformed_indexes_fail(key):
    def body():
        key(nl.ndarray((64, 32), nl.float32, buffer=nl.sbuf))

    _raises("IDX", body)


# ---- view methods -----------------------------------------------------------------------
def test_reshape_broadcast_permute_select_values():
    x = rng.standard_normal((6, 4, 5)).astype(np.float32)
    w = rng.standard_normal((7,)).astype(np.float32)
    np.testing.assert_array_equal(
        _gather(lambda h: h.reshape((24, 5)), x, out_shape=(24, 5)), x.reshape(24, 5)
    )
    np.testing.assert_array_equal(
        _gather(lambda h: h.reshape((6, -1)), x, out_shape=(6, 20)), x.reshape(6, 20)
    )
    np.testing.assert_array_equal(
        _gather(lambda h: h.permute((2, 0, 1)), x, out_shape=(5, 6, 4)), x.transpose(2, 0, 1)
    )
    np.testing.assert_array_equal(
        _gather(lambda h: h.select(1, 2), x, out_shape=(6, 5)), x[:, 2, :]
    )
    np.testing.assert_array_equal(
        _gather(lambda h: h.slice(2, 1, 5, 2), x, out_shape=(6, 4, 2)), x[:, :, 1:5:2]
    )
    np.testing.assert_array_equal(
        _gather(lambda h: h.reshape((1, 7)).broadcast(0, 3), w, out_shape=(3, 7)),
        np.broadcast_to(w, (3, 7)),
    )
    # a permuted view can only be reshaped where the layout allows it
    np.testing.assert_array_equal(
        _gather(lambda h: h.permute((1, 0, 2)).reshape((4, 6, 5)), x, out_shape=(4, 6, 5)),
        x.transpose(1, 0, 2),
    )


def test_rearrange_splits_reorders_and_merges():
    x = rng.standard_normal((6, 24)).astype(np.float32)
    swap = (("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
    got = _gather(lambda h: h.rearrange(*swap), x, out_shape=(6, 6, 4))
    np.testing.assert_array_equal(got, x.reshape(6, 4, 6).transpose(0, 2, 1))
    merged = _gather(lambda h: h.rearrange(("b", "f"), (("b", "f"),)), x, out_shape=(144,))
    np.testing.assert_array_equal(merged, x.reshape(-1))
    seen = {}

    def body():
        t = nl.ndarray((128, 24), nl.float32, buffer=nl.sbuf)
        seen["r"] = t.rearrange(("p", ("a", "b")), ("p", "b", "a"), {"b": 3})
        seen["cast"] = t.reinterpret_cast(nl.int32)

    _in_kernel(body)
    assert seen["r"].shape == (128, 3, 8) and seen["r"].strides == (24, 1, 3)
    assert seen["cast"].dtype == nl.int32

    for bad in [
        lambda t: t.rearrange(("p", "f"), ("f", "p")),  # moves the partition dim
        lambda t: t.rearrange(("p", ("a", "b")), ("p", "a", "b"), {"a": 5}),  # 24 % 5
        lambda t: t.rearrange(("p", "f"), ("p", "g")),  # unknown name
        lambda t: t.rearrange(("p",), ("p",)),  # too few dims
    ]:

        def body_bad(bad=bad):
            bad(nl.ndarray((128, 24), nl.float32, buffer=nl.sbuf))

        _raises("VIEW", body_bad)


def test_dim_helpers_expand_squeeze_flatten_reshape_dim():
    seen = {}

    def body():
        t = nl.ndarray((128, 24), nl.float32, buffer=nl.sbuf)
        seen["rd"] = t.reshape_dim(1, (4, -1))
        seen["ex"] = t.expand_dim(1)
        seen["sq"] = t.expand_dim(1).squeeze_dim(1)
        seen["fl"] = seen["rd"].flatten_dims(1, 2)
        seen["sel"] = t.select(1, 3)

    _in_kernel(body)
    assert seen["rd"].shape == (128, 4, 6) and seen["rd"].strides == (24, 6, 1)
    assert seen["ex"].shape == (128, 1, 24)
    assert seen["sq"].shape == (128, 24)
    assert seen["fl"].shape == (128, 24) and seen["fl"].is_contiguous()
    assert seen["sel"].shape == (128, 1)  # on chip: never below two dims


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.reshape((64, 64)),  # changes the partition dim on chip
        lambda t: t.reshape((128, 31)),  # element count
        lambda t: t[0:1, :].broadcast(0, 4),  # on-chip partition broadcast
        lambda t: t.broadcast(1, 4),  # dim is not size 1
        lambda t: t.permute((1, 0)),  # moves the partition dim
        lambda t: t.permute((0, 0)),
        lambda t: t.select(0, 1),  # partition select on chip
        lambda t: t.expand_dim(0),
        lambda t: t.flatten_dims(0, 1),
        lambda t: t[:, 0:31].view(nl.float32),  # 31 bf16 = 62 B, not a multiple of 4
        lambda t: t[:, 0:32:2].view(nl.float32),  # last dim not contiguous
        lambda t: t.reshape_dim(1, (5, -1)),  # 32 is not a multiple of 5
    ],
)
def test_view_rules(make):
    def body():
        make(nl.ndarray((128, 32), nl.bfloat16, buffer=nl.sbuf))

    with pytest.raises(NkiValidationError) as e:
        _in_kernel(body)
    assert e.value.rule in ("VIEW", "IDX"), str(e.value)


def test_reshape_of_a_non_contiguous_slice_needs_a_copy():
    def body():
        t = nl.ndarray((4, 8, 8), nl.float32, buffer=nl.hbm)
        t[:, 0:4, :].reshape((4, 32))  # legal: the two inner dims are one run
        t[:, :, 0:4].reshape((4, 32))  # rows of 4 with gaps: not one run

    err = _raises("VIEW", body)
    assert "needs a copy" in str(err)


def test_view_dtype_reinterprets_bits():
    x = rng.standard_normal((3, 8)).astype(np.float32)
    got = _gather(lambda h: h.view(nl.uint8), x, out_shape=(3, 32))
    np.testing.assert_array_equal(got, x.view(np.uint8))
    got16 = _gather(lambda h: h.view(nl.bfloat16), x, out_shape=(3, 16))
    np.testing.assert_array_equal(got16.view(np.uint16), x.view(np.uint16))
    back = _gather(lambda h: h.view(nl.uint8)[1:3, 8:16].view(nl.int32), x, out_shape=(2, 2))
    np.testing.assert_array_equal(back, x.view(np.int32)[1:3, 2:4])


# ---- .ap() access patterns ------------------------------------------------------------
def test_ap_on_hbm_is_an_arbitrary_strided_pattern_from_the_view_offset():
    x = np.arange(200, dtype=np.float32)
    ref = np.lib.stride_tricks.as_strided(x[13:], shape=(3, 4, 2), strides=(40 * 4, 4, 0))
    got = _gather(lambda h: h.ap([[40, 3], [1, 4], [0, 2]], offset=13), x, out_shape=(3, 4, 2))
    np.testing.assert_array_equal(got, ref)
    # offset composes with the view's own offset; None keeps it
    got2 = _gather(lambda h: h[10:].ap([[1, 5]], offset=3), x)
    np.testing.assert_array_equal(got2, x[13:18])
    got3 = _gather(lambda h: h[10:].ap([[2, 5]]), x)
    np.testing.assert_array_equal(got3, x[10:20:2])


def test_ap_dtype_counts_in_the_new_dtype():
    x = rng.standard_normal((4, 6)).astype(np.float32)
    view = lambda h: h.ap([[12, 4], [1, 4]], offset=2, dtype=nl.bfloat16)  # noqa: E731
    got = _gather(view, x, out_shape=(4, 4))
    ref = x.view(np.uint16).reshape(4, 12)[:, 2:6]
    np.testing.assert_array_equal(got.view(np.uint16), ref)


def test_ap_on_sbuf_needs_the_partition_stride_and_allows_broadcast_free_strides():
    x = rng.standard_normal((8, 5)).astype(np.float32)

    def kernel(h):
        sb = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(sb, h)
        rep = nl.ndarray((8, 3, 5), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(rep, sb.ap([[5, 8], [0, 3], [1, 5]]))
        out = nl.ndarray((8, 3, 5), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, rep)
        return out

    np.testing.assert_array_equal(run(kernel, x).outputs, np.repeat(x[:, None, :], 3, axis=1))

    def bad():
        nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf).ap([[4, 8], [1, 5]])

    assert "partition pair's stride 4" in str(_raises("VIEW", bad))


def test_ap_out_of_storage_fails_where_an_instruction_uses_it_and_offset_conflicts_fail():
    def too_far():
        h = nl.ndarray((4, 8), nl.float32, buffer=nl.hbm)
        sb = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=h.ap([[8, 4], [1, 8]], offset=1))

    assert "reaches elements 1..32 outside its storage of 32" in str(_raises("IDX", too_far))

    def built_not_used():  # output_projection_tkg's skipped last partial tile
        h = nl.ndarray((4, 8), nl.float32, buffer=nl.hbm)
        h.ap([[8, 4], [1, 8]], offset=1)
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        sb = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=1.0)
        nisa.dma_copy(dst=out, src=sb)
        return out

    assert (run(built_not_used).outputs == 1).all()

    def used_by_matmul():
        w = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        x = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=w, value=1.0)
        nisa.memset(dst=x, value=1.0)
        ps = nl.ndarray((4, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=w.ap([[8, 4], [1, 4]], offset=5), moving=x)

    _raises("IDX", used_by_matmul)

    def both():
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nl.ndarray((4, 8), nl.float32, buffer=nl.hbm).ap(
            [[8, 4], [1, 8]], scalar_offset=idx[0:1, :], vector_offset=idx
        )

    _raises("VIEW", both)

    def vector_on_chip():
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf).ap([[8, 4], [1, 8]], vector_offset=idx)

    _raises("VIEW", vector_on_chip)

    def vector_rows_mismatch():
        idx = nl.ndarray((3, 1), nl.int32, buffer=nl.sbuf)
        nl.ndarray((4, 8), nl.float32, buffer=nl.hbm).ap([[8, 4], [1, 8]], vector_offset=idx)

    _raises("VIEW", vector_rows_mismatch)


def test_indirect_views_refuse_further_indexing():
    def body():
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        v = nl.ndarray((9, 8), nl.float32, buffer=nl.hbm).ap([[8, 4], [1, 8]], vector_offset=idx)
        assert v.is_indirect()
        v[0:2, :]

    _raises("VIEW", body)


# ---- allocation -------------------------------------------------------------------------
def test_fresh_allocations_are_nan_or_int_sentinel_and_fills_work():
    def kernel():
        outs = []
        for dtype in (nl.float32, nl.bfloat16, nl.int32, nl.uint8):
            sb = nl.ndarray((3, 4), dtype, buffer=nl.sbuf)
            o = nl.ndarray((3, 4), dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(o, sb)
            outs.append(o)
        z = nl.zeros((2, 3), nl.float32, buffer=nl.sbuf)
        f = nl.full((2, 3), 7, nl.int16, buffer=nl.sbuf)
        zl = nl.zeros_like(f, dtype=nl.bfloat16)
        for t in (z, f, zl):
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(o, t)
            outs.append(o)
        outs.append(nl.full((2, 2), 1.5, nl.float32, buffer=nl.shared_hbm))
        return tuple(outs)

    f32, b16, i32, u8, z, f, zl, hb = run(kernel).outputs
    assert np.isnan(f32).all() and np.isnan(b16.astype(np.float32)).all()
    assert (i32 == 4).all() and (u8 == 4).all()
    assert (z == 0).all() and (f == 7).all() and f.dtype == np.int16
    assert zl.dtype == BF16 and (zl.astype(np.float32) == 0).all()
    assert (hb == 1.5).all()


def test_shared_constant_and_identity_matrix():
    const = rng.standard_normal((3, 5)).astype(np.float32)

    def kernel():
        c = nl.shared_constant(const)
        ident = nl.shared_identity_matrix(4, dtype=nl.bfloat16)
        o = nl.ndarray((4, 4), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(o, ident)
        return c, o

    c, ident = run(kernel).outputs
    np.testing.assert_array_equal(c, const)
    np.testing.assert_array_equal(ident.astype(np.float32), np.eye(4))


def test_identity_matrix_into_a_dst_view_leaves_the_rest_alone():
    def kernel():
        big = nl.full((8, 8), 5.0, nl.float32)
        ident = nl.shared_identity_matrix(3, dst=big[2:5, 4:7])
        assert ident.shape == (3, 3) and ident.dtype == nl.float32
        o = nl.ndarray((8, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(o, big)
        return o

    got = run(kernel).outputs
    expect = np.full((8, 8), 5.0, np.float32)
    expect[2:5, 4:7] = np.eye(3)
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize(
    ("call", "rule", "message"),
    [
        (lambda: nl.shared_identity_matrix(0), "ARG", "n must be a positive int; got 0"),
        (lambda: nl.shared_identity_matrix(2.0), "ARG", "n must be a positive int; got 2.0"),
        (
            lambda: nl.shared_identity_matrix(4, dst=nl.ndarray((4, 3), nl.float32)),
            "ARG",
            "dst must have shape (4, 4); got (4, 3)",
        ),
        (
            lambda: nl.shared_identity_matrix(4, dst=nl.ndarray((4, 4), nl.float32, nl.psum)),
            "BUF",
            "dst must be a direct SBUF view",
        ),
        (lambda: nl.shared_identity_matrix(256), "TC1", "partition dim 256"),
    ],
)
def test_identity_matrix_rules(call, rule, message):
    err = _raises(rule, lambda: call())
    assert message in str(err)


def test_tensor_attributes_and_queries():
    seen = {}

    def body():
        t = nl.ndarray((16, 6, 8), nl.bfloat16, buffer=nl.psum, name="acc")
        v = t[2:10, 1:5, ::2]
        seen.update(
            shape=v.shape,
            strides=v.strides,
            offset=v.offset,
            ndim=v.ndim,
            size=v.size,
            buffer=v.buffer,
            name=v.name,
            contig=(t.is_contiguous(), v.is_contiguous(), t[:, 1:3, :].is_contiguous()),
            pattern=v.get_pattern(),
            dtype=v.dtype,
        )

    _in_kernel(body)
    assert seen["shape"] == (8, 4, 4) and seen["strides"] == (48, 8, 2)
    assert seen["offset"] == 2 * 48 + 8 and seen["ndim"] == 3 and seen["size"] == 128
    assert seen["buffer"] is nl.psum and nl.is_psum(seen["buffer"]) and seen["name"] == "acc"
    assert seen["contig"] == (True, False, True)
    assert seen["pattern"] == [[48, 8], [8, 4], [2, 4]] and seen["dtype"] == nl.bfloat16


@pytest.mark.parametrize(
    ("alloc", "rule"),
    [
        (lambda: nl.ndarray((129, 4), nl.float32, buffer=nl.sbuf), "TC1"),
        (lambda: nl.ndarray((256, 4), nl.float32, buffer=nl.psum), "TC1"),
        (lambda: nl.ndarray((4, 0), nl.float32, buffer=nl.sbuf), "ARG"),
        (lambda: nl.ndarray((4, 4), nl.float32, buffer="sbuf"), "ARG"),
        (lambda: nl.ndarray((4, 4.5), nl.float32, buffer=nl.sbuf), "ARG"),
    ],
)
def test_allocation_rules(alloc, rule):
    err = _raises(rule, lambda: alloc())
    if rule == "TC1":
        assert "exceeds 128" in str(err)


def test_hbm_tensors_have_no_partition_limit():
    def body():
        nl.ndarray((1000, 3), nl.float32, buffer=nl.hbm)

    _in_kernel(body)


def test_setitem_copies_into_the_view():
    x = rng.standard_normal((4, 6)).astype(np.float32)

    def kernel(h):
        sb = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        sb[:, :] = h
        sb2 = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        sb2[...] = 0.0
        sb2[:, 0:3] = sb[:, 3:6]
        out = nl.ndarray((4, 6), nl.float32, buffer=nl.shared_hbm)
        out[...] = sb2
        return out

    got = run(kernel, x).outputs
    np.testing.assert_array_equal(got[:, 0:3], x[:, 3:6])
    assert (got[:, 3:] == 0).all()
