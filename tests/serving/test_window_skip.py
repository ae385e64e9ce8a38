"""Keys before the sliding window are not read: the segmented body's plan gives the keys
before the window of every row of a work item row -1 (the DMA skips them, their V is
zeroed), with the same tiles and steps as when it read them; a non-finite value there
(vLLM's never-written null block) never reaches the output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _steps import make_step, nan_before_windows, same_bits

from nki_kernels.attention.decode_host import StreamConfig
from nki_kernels.attention.decode_plan import BIG, NO_ROW
from nki_kernels.ops.serving import serving_attention
from nki_kernels.serving.decode_step_host import decode_sequences
from nki_kernels.serving.decode_step_host import plan as decode_plan
from nki_kernels.serving.host import CacheGeometry, plan_step, step_key_tiles


def _plan(step, window, layout="nhd", group=2):  # type: ignore[no-untyped-def]
    geo = CacheGeometry.of(step.k_cache, layout)
    return plan_step(step.query_start_loc.numpy(), step.cached_seq_len.numpy(),
                     step.block_table.numpy(), geo, group, window)  # fmt: skip


@pytest.mark.parametrize("window", [1, 5, 16, 21, 1000])
def test_plan_skips_exactly_the_keys_before_every_rows_window(window: int) -> None:
    """Each item's key rows: -1 before min(lo) of its rows, else those of the plan without
    a window (same kv_tile, same steps, kept keys at the same place); rowinfo unchanged."""
    step = make_step([(40, 7), (64, 20), (0, 9), (33, 1)], pad_tokens=1)
    full, win = _plan(step, None), _plan(step, window)
    assert (win.kv_tile, win.n_steps, win.tq) == (full.kv_tile, full.n_steps, full.tq)
    assert np.array_equal(win.item_tokens, full.item_tokens)
    skipped = 0
    for it in range(win.n_items):
        n = int((win.item_tokens[it] >= 0).sum())
        lo = win.rowinfo[it, :n, 0]
        first = int(lo.min())
        assert first == max(0, int(win.rowinfo[it, 0, 1]) - window)  # the item's first row
        keys = np.arange(win.key_rows.shape[1])
        want = np.where(keys >= first, full.key_rows[it, :, 0], -1)
        assert np.array_equal(win.key_rows[it, :, 0], want)
        skipped += int(((keys < first) & (full.key_rows[it, :, 0] >= 0)).sum())
    assert (skipped > 0) == (window < 1000)
    assert np.array_equal(win.rowinfo, _plan(step, window).rowinfo)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_grouped_tiles_of_a_group_straddling_the_window(layout: str) -> None:
    """512-key steps gather 4 keys per partition from the group's first key: a group whose
    first keys lie before the window keeps its row (from a later key), and the mask zeroes
    only the V of the keys before the window."""
    step = make_step([(560, 3)], layout=layout, pad_tokens=0)
    full, win = _plan(step, None, layout), _plan(step, 50, layout)  # lo = 560 - 49 = 511
    assert win.kv_tile == 512
    rows_f, mask_f = step_key_tiles(full, 16)
    rows_w, mask_w = step_key_tiles(win, 16)
    assert mask_f is not None and mask_w is not None
    keys = np.arange(win.n_steps * 512).reshape(win.n_steps, 128, 4)
    read = keys >= 511
    assert np.array_equal(mask_w[0], np.where(read, mask_f[0], 0))
    group_read = read.any(-1)[..., None]
    assert np.array_equal(rows_w[0], np.where(group_read, rows_f[0], -1))
    assert group_read[0, 127, 0] and not read[0, 127, 0]  # keys 508..511: only 511 read


CASES = {
    "prefill": [(40, 7), (33, 20)],
    "chunk": [(64, 16), (0, 9), (31, 5)],
    "drafts": [(40, 3), (50, 1), (17, 4)],
}


@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize(("kind", "window", "sinks"), [
    ("prefill", 6, False), ("chunk", 1, True), ("chunk", 17, False), ("drafts", 32, True),
    ("drafts", 1000, False),
])  # fmt: skip
def test_nan_before_the_window_never_reaches_the_output(
    kind: str, window: int, sinks: bool, layout: str, fp8: bool
) -> None:
    """Bit-identical to the run over a finite cache; window 17 starts chunk's first query
    (position 64) at key 48, a block boundary. Decode rows go to the decode body (mixed
    steps) with the same NaN before their window."""
    cdt = torch.float8_e4m3fn if fp8 else None
    kw = dict(sliding_window=window, layout=layout)
    if fp8:
        kw.update(k_scale=torch.tensor(0.5), v_scale=torch.tensor(0.25))
    if sinks:
        kw["sinks"] = torch.randn(4, generator=torch.Generator().manual_seed(1))
    outs = []
    for nan in (False, True):
        step = make_step(CASES[kind], layout=layout, cache_dtype=cdt, pad_tokens=1)
        if nan:
            nan_before_windows(step, window, layout)
        outs.append(serving_attention(step.q, step.k_cache, step.v_cache, step.block_table,
                                      step.cached_seq_len, step.query_start_loc, k=step.k,
                                      v=step.v, slot_mapping=step.slot_mapping, **kw))  # fmt: skip
    assert bool(torch.isfinite(outs[1]).all()) and same_bits(outs[1], outs[0])


DECODE_ROWS = [(40, 1), (20, 1), (70, 1), (3, 1), (33, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize(("block_size", "window", "sinks"), [
    (16, 6, False), (16, 3, True), (32, 20, False), (16, 40, True), (32, 1, False),
])  # fmt: skip
def test_decode_body_never_uses_v_before_the_window(
    dtype: torch.dtype, layout: str, block_size: int, window: int, sinks: bool
) -> None:
    """The decode body reads the window's first block whole (its pieces of C keys) and the
    last partial block key by key (the tail): NaN K / V at every key before the window
    (window 6 at block 16: the first kept block's pieces straddle the start; 3: the start
    in the tail; 20 at block 32 with 8-key pieces; 1: only the query's own key) leaves the
    output bit-identical to a finite cache's."""
    _decode_rows_with_nan_before_the_window(dtype, layout, block_size, window, sinks, 32)


def test_decode_body_zeroes_v_of_an_odd_head_dim() -> None:
    """bf16 rows of 33 elements are not whole 32-bit words: the V rows go to 0 by 16 bits."""
    _decode_rows_with_nan_before_the_window(torch.bfloat16, "hnd", 16, 6, False, 33)


def _decode_rows_with_nan_before_the_window(  # type: ignore[no-untyped-def]
    dtype, layout, block_size, window, sinks, d
) -> None:
    kw: dict[str, object] = dict(sliding_window=window, layout=layout)
    if sinks:
        kw["sinks"] = torch.randn(4, generator=torch.Generator().manual_seed(1))
    outs = []
    for nan in (False, True):
        step = make_step(DECODE_ROWS, layout=layout, dtype=dtype, block_size=block_size,
                         d=d, pad_tokens=1)  # fmt: skip
        qsl, ctx = step.query_start_loc.numpy(), step.cached_seq_len.numpy()
        assert decode_sequences(qsl[1:] - qsl[:-1], ctx, 2, window).all()
        if nan:
            nan_before_windows(step, window, layout)
        outs.append(serving_attention(step.q, step.k_cache, step.v_cache, step.block_table,
                                      step.cached_seq_len, step.query_start_loc, k=step.k,
                                      v=step.v, slot_mapping=step.slot_mapping, **kw))  # fmt: skip
    assert bool(torch.isfinite(outs[1]).all()) and same_bits(outs[1], outs[0])


def test_decode_plan_masks_and_skips_the_keys_before_the_window() -> None:
    """With a window the plan gives the keys before each sequence's start (in the kept
    blocks) position BIG in the slabs, whose V the kernel zeroes (`zero_masked_v`), and
    does not gather them in the tail (NO_ROW: zero K and V)."""
    # window 6: sequence 0 (positions 35..40) keeps block 2 (keys 32..40, shifted 0..8,
    # start 3); sequence 1 (15..20) keeps both blocks (start 15); window 3 on (45, 1):
    # keys 43..45, block 2 kept (shifted 0..13, start 11: in the tail 8..13)
    step = make_step([(40, 1), (20, 1), (45, 1)], pad_tokens=0)
    geo = CacheGeometry.of(step.k_cache, "nhd")
    qsl, ctx, table = (step.query_start_loc.numpy(), step.cached_seq_len.numpy(),
                       step.block_table.numpy())  # fmt: skip
    cfg = StreamConfig(piece=8)
    assert not decode_plan(qsl, ctx, table, geo, 4, 4, None, cfg, 1).stream.zero_masked_v
    for window, s, first, pieces, tail in [(6, 0, 3, 1, 1), (6, 1, 15, 2, 5), (3, 2, 11, 1, 6)]:
        p = decode_plan(qsl, ctx, table, geo, 4, 4, window, cfg, 1).stream
        assert p.zero_masked_v and p.piece == 8
        t, sl = next((t, s - b0) for t, (b0, n, _, _) in enumerate(p.tiles) if b0 <= s < b0 + n)
        kp = p.kpos[t, 0, :pieces, sl, :].reshape(-1)
        keys = np.arange(pieces * 8, dtype=np.float32)
        assert np.array_equal(kp, np.where(keys < first, BIG, keys))
        tail_keys = pieces * 8 + np.arange(tail, dtype=np.float32)
        want = np.where(tail_keys < first, np.float32(BIG), tail_keys)
        assert np.array_equal(p.tail_kpos[t, :tail, sl], want)
        assert np.array_equal(p.tail_idx[t, :tail, sl] == NO_ROW, tail_keys < first)
        # no piece lies wholly inside these short windows: the padding repeats entry 0
        assert (p.idx[t, 0, pieces:, sl] == p.idx[t, 0, 0, sl]).all()
    # window 20 on sequence 0: keys 21..40, block 1 kept (shifted 0..24, start 5): pieces
    # 8..15 and 16..23 lie inside it; the padding repeats the last (entry 2), not entry 0
    p = decode_plan(qsl, ctx, table, geo, 4, 4, 20, cfg, 1).stream
    assert p.zero_masked_v == 1 and p.tiles[0][0] == 0  # sequence 0: tile 0, slot 0
    keys = np.arange(8, dtype=np.float32)
    assert np.array_equal(p.kpos[0, 0, 0, 0], np.where(keys < 5, np.float32(BIG), keys))
    rows = p.idx[0, 0, :, 0]
    assert (rows[3:] == rows[2]).all() and rows[2] != rows[0]


def test_decode_body_window_over_two_slabs() -> None:
    """A window of 2,060 keys spans two slabs of 128 x 16-key pieces: the first slab's V
    before the window is zeroed, the second slab's padding repeats a piece inside the
    window (a short sequence beside it has all its keys inside); NaN before the window
    leaves the output bit-identical."""
    outs = []
    for nan in (False, True):
        step = make_step([(2100, 1), (40, 1)], pad_tokens=0)
        if nan:
            nan_before_windows(step, 2060, "nhd")
        outs.append(serving_attention(step.q, step.k_cache, step.v_cache, step.block_table,
                                      step.cached_seq_len, step.query_start_loc, k=step.k,
                                      v=step.v, slot_mapping=step.slot_mapping,
                                      sliding_window=2060))  # fmt: skip
    assert bool(torch.isfinite(outs[1]).all()) and same_bits(outs[1], outs[0])
