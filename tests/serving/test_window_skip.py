"""Keys before the sliding window are not read: the segmented body's plan gives the keys
before the window of every row of a work item row -1 (the DMA skips them, their V is
zeroed), with the same tiles and steps as when it read them; a non-finite value there
(vLLM's never-written null block) never reaches the output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _steps import make_step, same_bits

from nki_kernels.ops.serving import serving_attention
from nki_kernels.serving.decode_step_host import decode_sequences
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


def _nan_before_windows(step, window, only, layout):  # type: ignore[no-untyped-def]
    """NaN K and V at every cached key before the first query's window of the sequences of
    `only`; for the others, at every key of the whole blocks before it."""
    bs = step.k_cache.shape[1 if layout == "nhd" else 2]
    for s, ctx in enumerate(step.cached_seq_len.tolist()):
        lo = max(0, ctx - window + 1)
        end = lo if only[s] else (lo // bs) * bs
        for p in range(min(end, ctx)):
            blk, off = int(step.block_table[s, p // bs]), p % bs
            for c in (step.k_cache, step.v_cache):
                if layout == "hnd":
                    c[blk, :, off] = float("nan")
                else:
                    c[blk, off] = float("nan")


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
    (position 64) at key 48, a block boundary. Decode rows (the decode body) get NaN only in
    the whole blocks before the window (it still reads the window's first block whole)."""
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
            qsl, ctx = step.query_start_loc.numpy(), step.cached_seq_len.numpy()
            dec = decode_sequences(qsl[1:] - qsl[:-1], ctx, 2, step.k_cache.dtype, window)
            _nan_before_windows(step, window, ~dec, layout)
        outs.append(serving_attention(step.q, step.k_cache, step.v_cache, step.block_table,
                                      step.cached_seq_len, step.query_start_loc, k=step.k,
                                      v=step.v, slot_mapping=step.slot_mapping, **kw))  # fmt: skip
    assert bool(torch.isfinite(outs[1]).all()) and same_bits(outs[1], outs[0])
