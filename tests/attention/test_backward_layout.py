"""The backward kernel's own row order and its two mask paths (bounds vs. the constant
causal-diagonal bias), its DMA shapes, and sections / DMA transposes over interleaved
query units and key blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import TOLERANCES, assert_rel_close, make_inputs, reference_grads

from nki_kernels.attention import masks
from nki_kernels.attention._bwd_plan import DIAG, bwd_row_order, mark_diagonal
from nki_kernels.attention.flash_bwd import flash_attention_bwd
from nki_kernels.attention.host import bwd_kernel_rows
from nki_kernels.interp import run
from nki_kernels.targets import get_target

TARGET = get_target("trn2")


def test_row_order_interleaves_full_units_and_keeps_the_tail() -> None:
    order = bwd_row_order(1100)
    assert sorted(order) == list(range(1100))
    # position 128 j + p of a unit is row 4 p + j
    assert order[0:4] == [0, 4, 8, 12] and order[128] == 1 and order[512 + 129] == 512 + 5
    assert order[1024:] == list(range(1024, 1100))


def _marked(sq: int, sk: int, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    perm = bwd_row_order(sq)
    lo, hi = masks.query_bounds(1, sq, sk, **kw)  # type: ignore[arg-type]
    lo, hi = lo[:, perm], hi[:, perm]
    classes = masks.classify_tiles(lo, hi, sk)
    mark_diagonal(classes, lo, hi, sk)
    return classes, masks.dense_mask(lo, hi, sk)


def test_diagonal_marks_exactly_the_aligned_causal_diagonal() -> None:
    classes, _ = _marked(1024, 1024, causal=True)
    diag = np.argwhere(classes[0] == DIAG)
    # every tile of query unit qb against every sub-tile of key block qb
    assert len(diag) == 2 * 4 * 4
    assert all(t // 4 == u // 4 for t, u in diag) and not (classes == masks.PARTIAL).any()


@pytest.mark.parametrize("kw", [{"sliding_window": 200}, {"causal": True}])
def test_diagonal_marks_only_sub_tiles_whose_mask_is_the_bias_pattern(kw: dict) -> None:
    classes, dense = _marked(1024, 1536, **kw)
    p = np.arange(128)[:, None]
    for t, u in np.argwhere(classes[0] == DIAG):
        j, c = t % 4, (u % 4) * 128 + np.arange(128)[None, :]
        got = dense[0, t * 128 : t * 128 + 128, u * 128 : u * 128 + 128]
        live = got.any(axis=1)
        assert (got[live] == (c <= 4 * p + j)[live]).all(), (t, u)
    if "sliding_window" in kw:  # the window's lower edge stays a bounds mask
        assert (classes == masks.PARTIAL).any()


def _grads(q, k, v, out, g, lse, causal, cfg, diagonal=True):  # type: ignore[no-untyped-def]
    b, _, sq, d = q.shape
    sk = k.shape[2]
    lo, hi = masks.query_bounds(b, sq, sk, causal=causal)
    plan, bounds, lse_k, _ = bwd_kernel_rows(lo, hi, sk, lse)
    if not diagonal and len(plan) > 0:
        plan = tuple(
            tuple(tuple(masks.PARTIAL if c == DIAG else c for c in row) for row in pb)
            for pb in plan
        )
    return run(
        flash_attention_bwd,
        q,
        k,
        v,
        out,
        g,
        lse_k,
        None,
        bounds,
        d**-0.5,
        plan,
        *cfg,
        target=TARGET,
    )


def _case(hq, sq, sk, causal):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach() for t in make_inputs(1, hq, 1, sq, sk, 64, torch.bfloat16))
    g = torch.randn(1, hq, sq, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref_out, ref_lse, ref_grads = reference_grads(q, k, v, g, causal=causal)
    return q, k, v, g, ref_out.to(torch.bfloat16), ref_lse, ref_grads


def _check(res, ref_grads) -> None:  # type: ignore[no-untyped-def]
    for name, got, ref in zip(("dq", "dk", "dv"), res.outputs, ref_grads):
        assert_rel_close(got, ref, TOLERANCES[torch.bfloat16][1], name)


def test_diagonal_bias_and_bounds_paths_agree_with_the_reference() -> None:
    q, k, v, g, out, lse, ref = _case(1, 1024, 1024, True)
    biased = _grads(q, k, v, out, g, lse, True, (64, 0, 8))
    selected = _grads(q, k, v, out, g, lse, True, (64, 0, 8), diagonal=False)
    _check(biased, ref)
    _check(selected, ref)
    ops = [i.opcode for i in biased.trace]
    assert "range_select" not in ops and "affine_select" in ops
    assert [i.opcode for i in selected.trace].count("range_select") == 2 * 4


@pytest.mark.parametrize("cfg", [(4, 4, 4), (16, 2, 6)], ids=["sections-dma4", "dma2"])
def test_sections_and_dma_transposes_over_interleaved_units(cfg: tuple) -> None:
    # 2 heads x 2 full units + a ragged key block: with section=4 every unit is its own
    # section (dK / dV partial sums through the HBM scratch)
    q, k, v, g, out, lse, ref = _case(2, 1024, 1100, True)
    _check(_grads(q, k, v, out, g, lse, True, cfg), ref)


def test_full_units_and_blocks_move_in_1kib_descriptors() -> None:
    qd = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    kd = torch.zeros(1, 1, 1024, 128, dtype=torch.bfloat16)
    lse_k = torch.zeros(1, 2, 128, 8)
    res = run(
        flash_attention_bwd,
        qd,
        kd,
        kd,
        qd,
        qd,
        lse_k,
        None,
        None,
        0.1,
        (),
        64,
        0,
        8,
        target=TARGET,
        trace_only=True,
    )
    hbm = [i for i in res.trace if i.opcode == "dma_copy" and i.attrs["partitions"] == 128]
    big = [i for i in hbm if i.nbytes == 128 * 4 * 128 * 2]
    # Q, dO, O per unit (4), K, V per block (2), dQ per unit, dK, dV per block
    assert len(big) == 4 * 3 + 2 * 2 + 4 + 2 * 2
    assert all(i.attrs["descriptor_bytes"] == 1024 for i in big)
