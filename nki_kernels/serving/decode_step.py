"""Decode and speculative steps as one NKI kernel: write the new tokens' K / V into the
cache at their slots, then attend with the streamed decode body over the same cache.

A step whose sequences each bring at most a few queries (decode rows, 2-16 speculative
drafts) is what `attention/decode_stream.py` is built for: the whole batch per launch,
keys on partitions, K and V the stationary matmul operands, (sequence, KV head) groups
packed to 128 columns. This kernel is that body (imported, unmodified) preceded by the
serving kernels' cache write (`segmented._write_new_rows`), in one launch:

    for each 128-token tile of the new rows:                 # phase 1 (k_new given)
        cache rows[write_rows[tile]] = k_new[tile]           # indirect DMA, slot -1 skipped
        (V alike; every program of kernel[2] writes every row: idempotent, no barrier)
    out, lse = decode_stream_body(q, caches, piece tables)  # phase 2, decode_stream.py

The host (`serving/decode_step_host.py`) lays each sequence's queries right-aligned in
q [B, Hq, Sq, D] (Sq = the step's longest query count), so the decode plan's causal
bound hi = len - Sq + i + 1 is each query's own position + 1, and plans the piece
tables with `attention/decode_plan.py`. The write precedes the gathers in issue order on
the same HBM tensors (the interpreter and the cost model order them by storage). After a
write, the body loads its per-slab piece indices and key positions through ScalarE's
hardware DGE queue: on the sync queue they would wait behind the gathers, which the
write's scatters leave with a standing backlog (modeled, trn2, Llama-3 8B 8 x 1 over 2K,
hnd: 270.2 us fused vs 259.2 us write + attend in two launches; 259.7 us with it).

Layouts: "paged" = [num_blocks, block_size, Hkv, D] (the serving ops' "nhd"), "paged_hm"
= [num_blocks, Hkv, block_size, D] ("hnd"). Caches in q's dtype (the streamed body's
K^T comes from 2-byte DMA transposes, or TensorE transposes for fp32) or fp8: the write
quantizes with the segmented kernel's `_write_new_rows` (scales [Hkv, 4] from
`host.kv_scales`, fp8_max > 0), the body gathers the fp8 rows and converts them
(`attention/decode_stream_fp8.py`; k_mult [1, Hkv] = softmax_scale * k_scale with
softmax_scale 1, v_mult [T, NGR] each column's v_scale).

A mixed step (prefill chunks next to decode rows) runs `serving_mixed_fwd`: the same
write and decode body over the decode rows' sequences, then the segmented kernel's body
(`segmented.serving_attention_body`, no write) over the prefill sequences, one launch.

Inputs: q [B, Hq, Sq, D]; k_new, v_new [T, Hkv * D] or None; write_rows int32 [T, 1]
(layout row of each new token, negative = skip) or None; the decode plan's idx, kpos,
tail_idx, tail_kpos, hi, full and static arguments (`decode_plan.StreamPlan`); for fp8
caches scales, fp8_max, k_mult, v_mult (above). Returns
out [ksplit, B, Hq, Sq, D] (q's dtype), lse [ksplit, B, Hq, Sq] fp32.
"""

from __future__ import annotations

from ..attention.decode_stream import decode_stream_body
from ..nki import nki
from .segmented import _flat_views, _write_new_rows, serving_attention_body

WRITE_LAYOUT = {"paged": "nhd", "paged_hm": "hnd"}  # the cache write's names


@nki.jit
def serving_decode_fwd(
    q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi, full,
    softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
    scales=None, fp8_max=0.0, k_mult=None, v_mult=None,
):  # fmt: skip
    """The NKI entry point of `serving_decode_body` (same arguments)."""
    return serving_decode_body(
        q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi,
        full, softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
        scales, fp8_max, k_mult, v_mult,
    )  # fmt: skip


@nki.jit
def serving_mixed_fwd(
    q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi, full,
    softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
    q_t, key_rows, key_mask, rowinfo, scales, n_steps, kv_tile, fp8_max=0.0, k_mult=None,
    v_mult=None,
):  # fmt: skip
    """The NKI entry point of `serving_mixed_body` (same arguments)."""
    return serving_mixed_body(
        q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi,
        full, softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
        q_t, key_rows, key_mask, rowinfo, scales, n_steps, kv_tile, fp8_max, k_mult, v_mult,
    )  # fmt: skip


def serving_decode_body(
    q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi, full,
    softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
    scales=None, fp8_max=0.0, k_mult=None, v_mult=None,
):  # fmt: skip
    """(out, lse) of the streamed decode over the caches after the write; see above."""
    d = q.shape[3]
    if k_new is not None:
        wl = WRITE_LAYOUT[layout]
        hkv = k_cache.shape[2] if wl == "nhd" else k_cache.shape[1]
        kf, vf, bs = _flat_views(k_cache, v_cache, wl, hkv, d)
        # scales is read only for an fp8 cache (fp8_max > 0)
        _write_new_rows(k_new, kf, write_rows, scales, 2, wl, bs, hkv, d, fp8_max)
        _write_new_rows(v_new, vf, write_rows, scales, 3, wl, bs, hkv, d, fp8_max)
    return decode_stream_body(
        q, k_cache, v_cache, idx, kpos, tail_idx, tail_kpos, hi, full, softmax_scale,
        layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v, k_mult, v_mult,
        "sync" if k_new is None else "scalar",
    )  # fmt: skip


def serving_mixed_body(
    q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi, full,
    softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
    q_t, key_rows, key_mask, rowinfo, scales, n_steps, kv_tile, fp8_max=0.0, k_mult=None,
    v_mult=None,
):  # fmt: skip
    """A mixed step in one launch: the write, the streamed decode body over the decode
    rows' sequences (`serving_decode_body`), then the segmented body
    (`segmented.serving_attention_body`, without its write) over the prefill sequences'
    work items (q_t, key_rows, key_mask, rowinfo, scales, n_steps, kv_tile as there).
    `scales` (`host.kv_scales`) serves the write and the segmented body (fp8 caches:
    fp8_max, k_mult, v_mult as in `serving_decode_fwd`). Returns (out, lse) of the decode
    part and the segmented part's out [items, Hkv, R, D].
    The two bodies run one after the other (each frees its on-chip tiles on return)."""
    out, lse = serving_decode_body(
        q, k_new, v_new, k_cache, v_cache, write_rows, idx, kpos, tail_idx, tail_kpos, hi,
        full, softmax_scale, layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v,
        scales, fp8_max, k_mult, v_mult,
    )  # fmt: skip
    seg = serving_attention_body(
        q_t, None, None, k_cache, v_cache, None, key_rows, key_mask, rowinfo, scales,
        WRITE_LAYOUT[layout], n_steps, kv_tile, 0.0,
    )  # fmt: skip
    return out, lse, seg


__all__ = [
    "WRITE_LAYOUT",
    "serving_decode_body",
    "serving_decode_fwd",
    "serving_mixed_body",
    "serving_mixed_fwd",
]
