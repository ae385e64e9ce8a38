"""Host side of the decode-step kernel (torch + NumPy): when a step takes it, its plan,
its launch.

`serving_attention` sends a step here (`decode_step_eligible`) when every sequence
brings at most MAX_QUERIES queries (decode rows, speculative drafts), the G query heads
x queries of a KV head are at most MAX_ROWS packed rows (where this kernel models
faster than the segmented one) and a sliding window, if any, starts at the same key for
all of a sequence's queries (true for decode rows; the streamed body bounds keys from
above only): per sequence, `decode_sequences`. The cache is in q's dtype or fp8 (the
body's FP8 staging, `attention/decode_stream_fp8.py`: softmax_scale * k_scale multiplies
K, so the body's softmax scale is 1; v_scale each output column). In a mixed step the
other sequences (prefill chunks, long drafts, drafts under a window) go to the segmented
kernel's body in the same launch (`decode_step.serving_mixed_fwd`); a step with no
decode sequence runs the segmented kernel alone.

The plan (`plan`):
* the active sequences (query_len > 0) in order, their queries right-aligned in
  q [B, Hq, Sq, D]: decode_plan's bound hi = len - Sq + i + 1 is then each query's
  position + 1 (len = cached + new keys); left padding rows are dropped on return;
* a sliding window W starting at key lo: the blocks wholly before lo are cut from the
  sequence's block table (its positions shift by whole blocks), the keys of the first
  kept block before lo get position BIG (masked by the kernel's select);
* the piece tables from `attention/decode_plan.plan_decode` with the decode op's config
  (`decode_attention`'s store entries: the same streamed body).

Attention sinks fold in on return with the kernel's log-sum-exp: the sink is a key of
logit `sink` and no value, so out_with_sink = out * Z / (Z + e^sink) with log Z = lse,
i.e. out * sigmoid(lse - sink) (one elementwise product; exact up to the output's
rounding). At LNC 2 a single sequence splits its keys in two (as `decode_attention`),
merged here by log-sum-exp.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..attention.decode_host import DecodeProblem, StreamConfig, _merge
from ..attention.decode_plan import BIG, NO_ROW, P, StreamPlan, plan_decode
from ..attention.decode_stream import decode_stream_fwd
from ..runtime.buckets import bucket
from ..runtime.config_store import lookup_config
from ..runtime.host_array import host_numpy
from ..runtime.launch import launch
from ..runtime.lnc import runtime_lnc
from ..targets import get_target
from .decode_step import serving_decode_fwd, serving_mixed_fwd
from .host import (
    CacheGeometry,
    StepPlan,
    check_keys,
    fp8_max,
    kv_scales,
    plan_step,
    scatter_out,
    segmented_inputs,
    write_rows,
)

MAX_QUERIES = 16  # queries per sequence the decode path takes (speculative drafts: 2-16)
# packed rows (G query heads x queries) per KV head up to which the streamed body is
# the faster kernel: its piece size C shrinks as C * packed columns <= 512, the
# segmented kernel's work does not grow with the rows (modeled, cost model v3, trn2,
# 8 sequences x 2K keys, bf16, decode body vs segmented: rows 16 -> 408 vs 926 us,
# 32 -> 672 vs 927 us (G 4 and G 8 alike), 48 -> 1,098 vs 927 us)
MAX_ROWS = 32
DECODE_LAYOUT = {"nhd": "paged", "hnd": "paged_hm"}
# fp8 caches: the body converts each slab ring - 1 slabs ahead of its scores, so a third
# slot keeps the conversions off the softmax chain; pieces of 8 keys keep the slots and
# the raw fp8 rings in SBUF (modeled, cost model v3, trn2, Llama-3 8B 8 x 1 over 2K, hnd,
# e4m3: piece 16 / ring 2 565 us, 8 / 2 498 us, 8 / 3 354 us; 16 / 3 does not fit)
FP8_STREAM = StreamConfig(piece=8, ring=3)


def stream_config(cfg: StreamConfig, cache_dtype: torch.dtype) -> StreamConfig:
    """The body's tunables for a cache: the decode op's tuned ones (`cfg`, bf16 / fp32
    caches) or, for fp8, FP8_STREAM (not tuned: the op's configs are for 2-byte K^T)."""
    return FP8_STREAM if fp8_max(cache_dtype) > 0.0 else cfg


def window_start(pos: np.ndarray, window: int | None) -> np.ndarray:
    """First key a query at position `pos` sees (0 without a window)."""
    if window is None:
        return np.zeros_like(pos)
    return np.maximum(pos - window + 1, 0)


def decode_sequences(
    qlen: np.ndarray,
    ctx: np.ndarray,
    group: int,
    sliding_window: int | None,
) -> np.ndarray:
    """bool [S]: the sequences the streamed decode body serves (see the module
    docstring; any cache dtype)."""
    first = window_start(ctx, sliding_window)
    last = window_start(ctx + np.maximum(qlen, 1) - 1, sliding_window)
    return (qlen > 0) & (qlen <= MAX_QUERIES) & (group * qlen <= MAX_ROWS) & (first == last)


def decode_step_eligible(
    qlen: np.ndarray,
    ctx: np.ndarray,
    group: int,
    sliding_window: int | None,
) -> bool:
    """True when the streamed decode body serves every sequence of the step."""
    dec = decode_sequences(qlen, ctx, group, sliding_window)
    return bool(dec.any() and (dec | (qlen == 0)).all())


@dataclass(frozen=True)
class DecodeStepPlan:
    """The launch plan of one step (see the module docstring)."""

    seqs: np.ndarray  # int64 [B]: the step's sequence of each batch row
    tokens: np.ndarray  # int64 [B, Sq]: token of each query row, -1 = left padding
    stream: StreamPlan


def plan(
    query_start_loc: np.ndarray,
    cached_seq_len: np.ndarray,
    block_table: np.ndarray,
    geo: CacheGeometry,
    hq: int,
    itemsize: int,
    sliding_window: int | None,
    config: StreamConfig,
    ksplit: int,
    only: np.ndarray | None = None,
) -> DecodeStepPlan:
    """Plan the decode body over the sequences with queries (those of `only`, when
    given); raises ValueError naming the argument at fault (keys past the block table,
    blocks outside the pool)."""
    qsl = query_start_loc.astype(np.int64)
    ctx = cached_seq_len.astype(np.int64)
    qlen = qsl[1:] - qsl[:-1]
    check_keys(qlen, ctx, block_table, geo)
    seqs = np.flatnonzero((qlen > 0) & (True if only is None else only))
    sq = int(qlen[seqs].max())
    bs = geo.block_size
    total = ctx[seqs] + qlen[seqs]
    lo = window_start(total - 1, sliding_window)  # the same for all of a sequence's queries
    cut = lo // bs  # whole blocks before the window
    lens = total - cut * bs
    width = max(1, int((-(-lens // bs)).max()))
    table = np.zeros((len(seqs), width), np.int64)
    for b, s in enumerate(seqs):
        n = -(-int(lens[b]) // bs)
        table[b, :n] = block_table[s, cut[b] : cut[b] + n]
    layout = DECODE_LAYOUT[geo.layout]
    shape = (geo.num_blocks, geo.block_size, geo.kv_heads, geo.head_dim)
    if layout == "paged_hm":
        shape = (geo.num_blocks, geo.kv_heads, geo.block_size, geo.head_dim)
    stream = plan_decode(lens, hq, geo.kv_heads, sq, layout, shape, table, geo.head_dim,
                         itemsize, config.piece, config.ring, ksplit)  # fmt: skip
    if sliding_window is not None:
        stream = _mask_before(stream, lo - cut * bs, bs)
    tokens = np.full((len(seqs), sq), -1, np.int64)
    for b, s in enumerate(seqs):
        n = int(qlen[s])
        tokens[b, sq - n :] = qsl[s] + np.arange(n)
    return DecodeStepPlan(seqs, tokens, stream)


def _mask_before(stream: StreamPlan, first: np.ndarray, block_size: int) -> StreamPlan:
    """The plan with the keys before each sequence's window start (positions < first[b],
    in the plan's shifted positions, all in the first kept block: first < block_size)
    masked: position BIG (the kernel selects their scores away); tail rows not gathered
    (NO_ROW: zero K and V); in the slabs that hold the first block's pieces the kernel
    zeroes the V rows of masked keys (`zero_masked_v`); a slab's padding entries repeat a
    piece inside the window (a window of >= 2C - 1 keys has one; a shorter one keeps every
    piece within those slabs). Those V rows may be non-finite (vLLM's never-written null
    block), and 0 x NaN in P V would reach the row. Same pieces, slabs and key order as
    reading them: outputs bit-identical on finite caches."""
    c, nseq = stream.piece, stream.idx.shape[3]
    # slabs that can hold pieces of the first block (pieces of up to block_size + 2C keys)
    zero = -(-(block_size // c + 2) // P)
    for t, (b0, ns, _h0, nh) in enumerate(stream.tiles):
        rows = stream.hi.shape[1] // (nseq * nh)
        for sl in range(ns):
            f = float(first[b0 + sl])
            kp = stream.kpos[t, :, :, sl, :].reshape(-1, c)  # [entries, C]
            ix = stream.idx[t, :, :, sl].reshape(-1)
            real = (kp < BIG).any(axis=1)  # padding entries are masked whole
            lo_key = kp.min(axis=1)
            safe = real & (lo_key >= f)
            unsafe = real & ~safe
            pad = ~real
            if pad.any() and safe.any():
                # a piece every query of the sequence sees, else the last one in the window
                hi_min = float(stream.hi[t, sl * nh * rows : (sl + 1) * nh * rows].min())
                seen = safe & (np.where(real[:, None], kp, -1.0).max(axis=1) < hi_min)
                ix[pad] = ix[np.flatnonzero(seen if seen.any() else safe)[-1]]
            elif real.any() and unsafe[0]:
                unsafe |= pad  # padding repeats entry 0
            if unsafe[zero * P :].any():  # not expected (see above): zero every slab
                zero = max(zero, stream.n_slabs)
            kp[kp < f] = BIG
            stream.kpos[t, :, :, sl, :] = kp.reshape((*stream.kpos.shape[1:3], c))
            stream.idx[t, :, :, sl] = ix.reshape(stream.idx.shape[1:3])
            tk = stream.tail_kpos[t, :, sl]
            before = tk < f
            tk[before] = BIG
            stream.tail_idx[t, :, sl][before] = NO_ROW
    return dataclasses.replace(stream, zero_masked_v=zero)


def serving_decode(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor | None,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    sinks: Tensor | None,
    softmax_scale: float | None,
    sliding_window: int | None,
    layout: str,
    decode: np.ndarray,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """out [T, Hq, D]: write k, v (if given) at slot_mapping, then the streamed decode
    body over the sequences of `decode` (bool [S], `decode_sequences`) and, when other
    sequences have queries, the segmented body over those: one launch (k_scale /
    v_scale: an fp8 cache's, as `serving_attention`)."""
    t_tok, hq, d = q.shape
    geo = CacheGeometry.of(k_cache, layout)
    hkv, group = geo.kv_heads, hq // geo.kv_heads
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    scales = kv_scales(k_scale, v_scale, hkv, scale)  # [Hkv, 4], the segmented kernel's
    fp8 = fp8_max(k_cache.dtype)
    target = get_target(None)
    qsl_np = host_numpy(query_start_loc).astype(np.int64)
    ctx_np = host_numpy(cached_seq_len).astype(np.int64)
    table_np = host_numpy(block_table)
    qlen = qsl_np[1:] - qsl_np[:-1]
    rest = (qlen > 0) & ~decode  # the segmented body's sequences
    sq = int(qlen[decode].max())
    n_seq = int(decode.sum())
    longest = max(1, int((ctx_np + qlen)[decode].max()))
    dtype = str(q.dtype).removeprefix("torch.")
    problem = DecodeProblem(1, hq, hkv, sq, bucket(longest), d, dtype, "contiguous")
    cfg = lookup_config("decode_attention", problem, decode_stream_fwd, target=target,
                        config_cls=StreamConfig, lnc=1)  # fmt: skip
    assert isinstance(cfg, StreamConfig)
    cfg = stream_config(cfg, k_cache.dtype)
    ksplit = 2 if n_seq == 1 and runtime_lnc(target) == 2 else 1
    p = plan(qsl_np, ctx_np, table_np, geo, hq, q.element_size(), sliding_window, cfg, ksplit,
             decode)  # fmt: skip
    dev = q.device
    seg = None
    if rest.any():  # the prefill sequences, compacted: their tokens in order
        seg = _segmented_part(q, qsl_np, ctx_np, table_np, rest, geo, sinks, scales,
                              sliding_window, k_cache.element_size())  # fmt: skip
    rows_w = None
    if k is not None:
        assert slot_mapping is not None
        rows_w = torch.from_numpy(write_rows(host_numpy(slot_mapping), geo)).to(dev)
    tok = torch.from_numpy(p.tokens)
    gather = torch.where(tok >= 0, tok, t_tok).reshape(-1).to(dev)
    q_pad = torch.cat([q, q.new_zeros((1, hq, d))])
    q4 = q_pad.index_select(0, gather).reshape(n_seq, sq, hq, d).permute(0, 2, 1, 3)
    s = p.stream
    arrays = (s.idx, s.kpos, s.tail_idx, s.tail_kpos, s.hi, s.full)
    kc = k_cache if k_cache.is_contiguous() else k_cache.contiguous()
    vc = v_cache if v_cache.is_contiguous() else v_cache.contiguous()
    new: list[Tensor | None] = [None, None]
    if k is not None and v is not None and t_tok > 0:
        new = [k.reshape(t_tok, -1).contiguous(), v.reshape(t_tok, -1).contiguous()]
    # fp8: softmax_scale * k_scale multiplies K in the body (its softmax scale 1)
    args = [q4.contiguous(), *new, kc, vc, rows_w,
            *[torch.from_numpy(a).to(dev) for a in arrays], 1.0 if fp8 else scale,
            *s.static_args()]  # fmt: skip
    mults: tuple[Tensor | None, Tensor | None] = (None, None)
    if fp8:
        k_mult, v_mult = fp8_mults(scales, s, group * sq)
        mults = (k_mult.to(dev), v_mult.to(dev))
    if seg is None:
        outs, lses = launch(serving_decode_fwd, *args, scales.to(dev), fp8, *mults,
                            target=target, mutated=(3, 4))  # fmt: skip
    else:
        outs, lses, res = launch(serving_mixed_fwd, *args, *seg[1], fp8, *mults, target=target,
                                 mutated=(3, 4))  # fmt: skip
    if kc is not k_cache:
        k_cache.copy_(kc)
    if vc is not v_cache:
        v_cache.copy_(vc)
    o, lse = _merge(outs, lses)  # [B, Hq, Sq, D], [B, Hq, Sq]
    if sinks is not None:
        snk = sinks.to(device=dev, dtype=torch.float32).view(1, hq, 1)
        o = (o.float() * torch.sigmoid(lse - snk)[..., None]).to(q.dtype)
    rows = o.permute(0, 2, 1, 3).reshape(n_seq * sq, hq, d)  # [B * Sq, Hq, D]
    sel = (tok >= 0).reshape(-1).to(dev)
    out = q.new_zeros((t_tok + 1, hq, d))
    out = out.index_copy(0, gather[sel], rows[sel])
    if seg is not None:
        tokens, _args, seg_plan = seg
        part = scatter_out(res, seg_plan, q.new_zeros((len(tokens), hq, d)), sinks is not None,
                           hkv, group)  # fmt: skip
        out = out.index_copy(0, torch.from_numpy(tokens).to(dev), part)
    return out[:t_tok]


def _segmented_part(
    q: Tensor,
    qsl: np.ndarray,
    ctx: np.ndarray,
    table: np.ndarray,
    rest: np.ndarray,
    geo: CacheGeometry,
    sinks: Tensor | None,
    scales: Tensor,
    sliding_window: int | None,
    cache_itemsize: int,
) -> tuple[np.ndarray, tuple[object, ...], StepPlan]:
    """(token indices, the segmented body's arguments, its plan) for the sequences of
    `rest`, their tokens compacted in order (`scales`: `host.kv_scales`)."""
    hq = q.shape[1]
    hkv, group = geo.kv_heads, hq // geo.kv_heads
    seqs = np.flatnonzero(rest)
    tokens = np.concatenate([np.arange(qsl[s], qsl[s + 1]) for s in seqs])
    qlen_c = (qsl[1:] - qsl[:-1])[seqs]
    qsl_c = np.concatenate([[0], np.cumsum(qlen_c)])
    sp = plan_step(qsl_c, ctx[seqs], table[seqs], geo, group, sliding_window)
    q_c = q.index_select(0, torch.from_numpy(tokens).to(q.device))
    row_bytes = geo.head_dim * cache_itemsize
    q_t, key_rows, key_mask, info = segmented_inputs(q_c, sp, sinks, scales, hkv, group,
                                                     geo.block_size, row_bytes)  # fmt: skip
    args = (q_t, key_rows, key_mask, info, scales.to(q.device), sp.n_steps, sp.kv_tile)
    return tokens, args, sp


def fp8_mults(scales: Tensor, stream: StreamPlan, rows: int) -> tuple[Tensor, Tensor]:
    """The body's FP8 multipliers from `kv_scales`' [Hkv, 4]: k_mult [1, Hkv] (softmax_scale
    * k_scale) and v_mult [T, NGR] (each packed column's v_scale: column (sequence, head,
    row) of tile (b0, nseq, h0, nh) is KV head h0 + head; `rows` = G x queries)."""
    ngr = stream.hi.shape[1]
    vs = scales[:, 1].numpy()
    v_mult = np.ones((len(stream.tiles), ngr), np.float32)
    for t, (_b0, ns, h0, nh) in enumerate(stream.tiles):
        cols = np.repeat(vs[h0 : h0 + nh], rows)
        v_mult[t, : ns * nh * rows] = np.tile(cols, ns)
    return scales[:, 0].reshape(1, -1).contiguous(), torch.from_numpy(v_mult)


__all__ = [
    "MAX_QUERIES",
    "MAX_ROWS",
    "DecodeStepPlan",
    "decode_sequences",
    "decode_step_eligible",
    "fp8_mults",
    "plan",
    "serving_decode",
    "stream_config",
]
