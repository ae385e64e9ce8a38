"""Serving ops: `torch.ops.nki.kv_cache_write` and `torch.ops.nki.serving_attention`.

    kv_cache_write(k [T, Hkv, D], v, k_cache!, v_cache!, slot_mapping [T], k_scale=None,
                   v_scale=None, *, layout="nhd") -> ()
    serving_attention(q [T, Hq, D], k [T, Hkv, D] | None, v | None, k_cache!, v_cache!,
                      slot_mapping [T] | None, block_table [S, max_blocks],
                      cached_seq_len [S], query_start_loc [S + 1], sinks [Hq] | None,
                      k_scale | None, v_scale | None, *, softmax_scale=None,
                      sliding_window=None, layout="nhd", max_query_len=None) -> out [T, Hq, D]

Both write the caches in place and declare them mutated (`mutates_args`), so
`torch.compile` and functionalization see the write. `serving_attention` writes k, v
at `slot_mapping` (when given) and attends in the same launch (`serving/segmented.py`).
Cache layouts: "nhd" [num_blocks, block_size, Hkv, D] (vLLM), "hnd" [num_blocks, Hkv,
block_size, D] (vLLM-Neuron; a contiguous [B, Hkv, S_max, D] cache with block_table
[[0], [1], ...]). Caches: q's dtype, or fp8 (float8_e4m3fn / float8_e5m2) with k_scale /
v_scale fp32 of shape [] / [1] (per tensor) or [Hkv] (per head), every element finite
and >= fp32's smallest normal (read on the host). Slot -1 is skipped; any other slot
may appear once (two writes to one slot land in an undefined order: refused).

The step's plan reads the metadata (lengths, block table, slots) on the host, so each op
is one opaque node under `torch.compile`; no autograd (inference ops).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..runtime.host_array import host_numpy
from ..serving.decode_step_host import decode_sequences, serving_decode
from ..serving.host import FP8_MAX, LAYOUTS, CacheGeometry, check_keys, write_cache, write_rows
from ..serving.host import serving_attention as _serving_attention
from .attention import SOFTMAX_SCALE_MIN, check_softmax_scale
from .checks import FLOAT_DTYPES, check_is_tensor, check_tensor
from .registry import call_host_op, define_host_op, define_op, tracing

HEAD_DIM_MAX = 256  # Q^T / K^T in 128-row chunks
INDEX_DTYPES = (torch.int32, torch.int64)
CACHE_DTYPES = (*FLOAT_DTYPES, *FP8_MAX)
# The kernels multiply by 1 / scale (fp32): a scale below fp32's smallest normal has no
# finite reciprocal. The effective score scale softmax_scale * k_scale must stay
# >= SOFTMAX_SCALE_MIN so the masked keys' fill still underflows to weight 0.
KV_SCALE_MIN = torch.finfo(torch.float32).tiny


def _check_cache(k_cache: Tensor, v_cache: Tensor, layout: str, hkv: int, d: int) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}; got {layout!r}")
    shape = (
        "[num_blocks, block_size, Hkv, D]"
        if layout == "nhd"
        else "[num_blocks, Hkv, block_size, D]"
    )
    for arg, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(arg, c, dtypes=CACHE_DTYPES, min_dim=4)
        heads = c.shape[2] if layout == "nhd" else c.shape[1]
        if c.dim() != 4 or heads != hkv or c.shape[3] != d:
            raise ValueError(
                f"{arg}: expected {shape} ({layout}) with Hkv = {hkv}, D = {d}; got "
                f"{tuple(c.shape)}"
            )
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"v_cache: expected shape {tuple(k_cache.shape)} and dtype {k_cache.dtype} (as "
            f"k_cache); got {tuple(v_cache.shape)}, {v_cache.dtype}"
        )


def _check_scale(arg: str, s: Tensor | None, hkv: int, cache_dtype: torch.dtype) -> None:
    if s is None:
        return
    if cache_dtype not in FP8_MAX:
        raise ValueError(
            f"{arg}: expected None for a {cache_dtype} cache (scales apply to fp8 caches: "
            f"{', '.join(str(d) for d in FP8_MAX)}); got a tensor"
        )
    check_tensor(arg, s, dtypes=(torch.float32,), min_dim=0)
    if s.numel() not in (1, hkv) or s.dim() > 1:
        raise ValueError(
            f"{arg}: expected shape [] or [1] (per tensor) or [{hkv}] (per KV head); got "
            f"{tuple(s.shape)}"
        )


def _check_devices(ref_arg: str, ref: Tensor, **named: Tensor | None) -> None:
    """The launch's tensors on `ref`'s device (the metadata, sinks and scales are read on
    the host and may sit anywhere)."""
    for arg, t in named.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{arg}: expected device {ref.device} (as {ref_arg}); got {t.device}")


def _check_distinct_caches(k_cache: Tensor, v_cache: Tensor) -> None:
    """k_cache and v_cache not one memory (eager: a FakeTensor has no data pointer). Views
    starting at the same element overlap; vLLM's halves of one [2, ...] tensor do not."""
    if k_cache.data_ptr() == v_cache.data_ptr():
        raise ValueError(
            "v_cache: expected a cache apart from k_cache (V would overwrite the K just "
            f"written); got a view of the same memory (data_ptr {v_cache.data_ptr():#x})"
        )


def _check_scale_values(
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    softmax_scale: float | None = None,
    head_dim: int | None = None,
) -> None:
    """Data checks of the fp8 scales (eager: a host read; never on a FakeTensor). With
    head_dim, the attention's effective scale softmax_scale * k_scale is checked too."""
    for arg, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            continue
        vals = s.detach().to("cpu", torch.float64).reshape(-1)
        bad = ~torch.isfinite(vals) | (vals < KV_SCALE_MIN)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise ValueError(
                f"{arg}: expected finite values >= {KV_SCALE_MIN:g} (strictly positive; fp32's "
                f"smallest normal, so 1 / scale is finite); got {float(vals[i]):g} at element {i}"
            )
    if head_dim is None:
        return
    sc = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    if k_scale is None:
        return  # softmax_scale alone is checked by _validate_attention
    ks_min = float(k_scale.detach().to("cpu", torch.float64).min())
    if sc * ks_min < SOFTMAX_SCALE_MIN:
        raise ValueError(
            f"softmax_scale: expected softmax_scale * min(k_scale) >= {SOFTMAX_SCALE_MIN:g} "
            f"(masking limit); got {sc:g} * {ks_min:g} = {sc * ks_min:g}"
        )


def _check_new_rows(k: Tensor, v: Tensor, slot_mapping: Tensor, t_tok: int, dtype: Any) -> None:
    for arg, x in (("k", k), ("v", v)):
        check_tensor(arg, x, dtypes=FLOAT_DTYPES, min_dim=3)
        if x.dim() != 3 or x.shape[0] != t_tok or x.dtype != dtype:
            raise ValueError(
                f"{arg}: expected [T = {t_tok}, Hkv, D] of dtype {dtype}; got "
                f"{tuple(x.shape)} {x.dtype}"
            )
    if v.shape != k.shape:
        raise ValueError(f"v: expected shape {tuple(k.shape)} (as k); got {tuple(v.shape)}")
    check_tensor("slot_mapping", slot_mapping, dtypes=INDEX_DTYPES)
    if tuple(slot_mapping.shape) != (t_tok,):
        raise ValueError(
            f"slot_mapping: expected shape ({t_tok},) [T]; got {tuple(slot_mapping.shape)}"
        )


def _validate_write(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    *,
    layout: str = "nhd",
) -> None:
    check_tensor("k", k, dtypes=FLOAT_DTYPES, min_dim=3)
    _check_new_rows(k, v, slot_mapping, k.shape[0], k.dtype)
    _check_cache(k_cache, v_cache, layout, k.shape[1], k.shape[2])
    _check_devices("k", k, v=v, k_cache=k_cache, v_cache=v_cache)
    if k_cache.dtype not in FP8_MAX and k_cache.dtype != k.dtype:
        raise ValueError(
            f"k_cache: expected dtype {k.dtype} (as k) or an fp8 dtype; got {k_cache.dtype}"
        )
    _check_scale("k_scale", k_scale, k.shape[1], k_cache.dtype)
    _check_scale("v_scale", v_scale, k.shape[1], k_cache.dtype)


def _fake_write(*args: Any, **kw: Any) -> None:
    return None


def _kv_cache_write(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    *,
    layout: str = "nhd",
) -> None:
    """Write k, v at slot_mapping into the caches (in place); see the module docstring."""
    if tracing(k, k_cache, slot_mapping):  # the rows are planned from slot_mapping's values
        call_host_op("kv_cache_write", k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
                     layout=layout)  # fmt: skip
        return
    _check_distinct_caches(k_cache, v_cache)
    _check_scale_values(k_scale, v_scale)
    write_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, layout)


def _examples_write() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(5, 2, 32, generator=g), torch.randn(5, 2, 32, generator=g)
    cache = torch.randn(6, 16, 2, 32, generator=g)
    slots = torch.tensor([3, 17, -1, 90, 40])
    hnd = torch.randn(6, 2, 16, 32, generator=g)
    # (no fp8 example: opcheck's schema check compares tensors with allclose, which
    # torch 2.13 does not implement for fp8; the fp8 caches are tested in tests/serving)
    return [
        ((k, v, cache, cache.clone(), slots), {}),
        ((k, v, hnd, hnd.clone(), slots), {"layout": "hnd"}),
    ]  # fmt: skip


def _validate_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor | None,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    layout: str = "nhd",
    max_query_len: int | None = None,
) -> None:
    check_tensor("q", q, dtypes=FLOAT_DTYPES, min_dim=3)
    if q.dim() != 3:
        raise ValueError(f"q: expected [T, Hq, D]; got shape {tuple(q.shape)}")
    t_tok, hq, d = q.shape
    if d > HEAD_DIM_MAX:
        raise ValueError(f"q: expected head_dim (dim 2) <= {HEAD_DIM_MAX}; got {d}")
    hkv = k_cache.shape[2] if layout == "nhd" and k_cache.dim() == 4 else k_cache.shape[1]
    if hq % hkv or hq // hkv > 128:
        raise ValueError(
            f"k_cache: expected a number of KV heads dividing q's {hq} heads with at most "
            f"128 query heads each; got {hkv}"
        )
    _check_cache(k_cache, v_cache, layout, hkv, d)
    _check_devices("q", q, k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    if k_cache.dtype not in FP8_MAX and k_cache.dtype != q.dtype:
        raise ValueError(
            f"k_cache: expected dtype {q.dtype} (as q) or an fp8 dtype; got {k_cache.dtype}"
        )
    if (k is None) != (v is None) or (k is None) != (slot_mapping is None):
        given = [
            n for n, t in (("k", k), ("v", v), ("slot_mapping", slot_mapping)) if t is not None
        ]
        raise ValueError(
            "k, v, slot_mapping: expected all three (write, then attend) or none; got only "
            + ", ".join(given)
        )
    if k is not None and v is not None and slot_mapping is not None:
        _check_new_rows(k, v, slot_mapping, t_tok, q.dtype)
        if k.shape[1:] != (hkv, d):
            raise ValueError(f"k: expected [T, {hkv}, {d}]; got {tuple(k.shape)}")
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES)
    if block_table.dim() != 2:
        raise ValueError(f"block_table: expected [S, max_blocks]; got {tuple(block_table.shape)}")
    n_seq = block_table.shape[0]
    check_tensor("cached_seq_len", cached_seq_len, dtypes=INDEX_DTYPES)
    if tuple(cached_seq_len.shape) not in ((n_seq,), (n_seq, 1)):
        raise ValueError(
            f"cached_seq_len: expected [S = {n_seq}] (or [S, 1]); got {tuple(cached_seq_len.shape)}"
        )
    check_tensor("query_start_loc", query_start_loc, dtypes=INDEX_DTYPES)
    if tuple(query_start_loc.shape) != (n_seq + 1,):
        raise ValueError(
            f"query_start_loc: expected shape ({n_seq + 1},) [S + 1]; got "
            f"{tuple(query_start_loc.shape)}"
        )
    if sinks is not None:
        check_tensor("sinks", sinks, dtypes=(torch.float32, torch.bfloat16, torch.float16))
        if tuple(sinks.shape) != (hq,):
            raise ValueError(f"sinks: expected shape ({hq},) [Hq]; got {tuple(sinks.shape)}")
    _check_scale("k_scale", k_scale, hkv, k_cache.dtype)
    _check_scale("v_scale", v_scale, hkv, k_cache.dtype)
    check_softmax_scale(softmax_scale)
    if sliding_window is not None and (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, int)
        or sliding_window < 1
    ):
        raise ValueError(f"sliding_window: expected an int >= 1 or None; got {sliding_window!r}")
    if max_query_len is not None and (
        isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or max_query_len < 1
    ):
        raise ValueError(f"max_query_len: expected an int >= 1 or None; got {max_query_len!r}")


def _fake_attention(q: Tensor, *args: Any, **kw: Any) -> Tensor:
    return torch.empty_like(q)


def _check_lengths(
    query_start_loc: Tensor, cached_seq_len: Tensor, t_tok: int, mql: int | None
) -> None:
    """Data checks of the metadata (eager: the values are read on the host anyway)."""
    qsl = query_start_loc.detach().cpu().long()
    qlen = qsl[1:] - qsl[:-1]
    if int(qsl[0]) != 0 or bool((qlen < 0).any()) or int(qsl[-1]) > t_tok:
        raise ValueError(
            f"query_start_loc: expected 0 = q_0 <= q_1 <= ... <= q_S <= T = {t_tok}; got "
            f"{qsl.tolist()}"
        )
    if mql is not None and qlen.numel() and int(qlen.max()) > mql:
        s = int(torch.argmax(qlen))
        raise ValueError(
            f"max_query_len: sequence {s} has {int(qlen[s])} query tokens, more than the "
            f"declared maximum {mql}"
        )
    if bool((cached_seq_len.detach().cpu() < 0).any()):
        raise ValueError(f"cached_seq_len: expected values >= 0; got {cached_seq_len.tolist()}")


def _check_slots_follow_table(
    slot_mapping: Tensor,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    geo: CacheGeometry,
) -> None:
    """The block table (`check_keys`), slots inside the cache and none twice
    (`write_rows`), then each new token's slot the cache position its queries read it
    back from: block_table[s, p // block_size] * block_size + p % block_size for token i
    of sequence s at position p = cached_seq_len[s] + i (or -1: not written, the cache
    already holds it). Padding tokens (past query_start_loc[-1]) are not checked against
    the table. Eager: a host read."""
    slots = host_numpy(slot_mapping).astype(np.int64).reshape(-1)
    qsl = host_numpy(query_start_loc).astype(np.int64)
    ctx = host_numpy(cached_seq_len).astype(np.int64).reshape(-1)
    table = host_numpy(block_table).astype(np.int64)
    qlen = qsl[1:] - qsl[:-1]
    check_keys(qlen, ctx, table, geo)  # the table's capacity and block ids first
    write_rows(slots, geo)
    block_size = geo.block_size
    seq = np.repeat(np.arange(len(qlen)), qlen)  # each live token's sequence
    tok = np.arange(int(qsl[-1]))
    pos = ctx[seq] + tok - qsl[seq]
    col = pos // block_size
    want = table[seq, col] * block_size + pos % block_size
    bad = (slots[tok] >= 0) & (slots[tok] != want)
    if bad.any():
        t = int(np.flatnonzero(bad)[0])
        s, c = int(seq[t]), int(col[t])
        raise ValueError(
            f"slot_mapping: expected the slot block_table[s, p // {block_size}] * {block_size} + "
            f"p % {block_size} of each new token (position p of sequence s; -1: not written), "
            f"where its queries read it back; got {int(slots[t])} at token {t} (sequence {s}, "
            f"position {int(pos[t])}: slot {int(want[t])}, block_table[{s}, {c}] = "
            f"{int(table[s, c])})"
        )


def _serving_attention_op(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor | None,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    layout: str = "nhd",
    max_query_len: int | None = None,
) -> Tensor:
    """Write k, v (if given), then segmented attention; see the module docstring."""
    if tracing(q, k_cache, block_table, cached_seq_len, query_start_loc):  # plans on metadata
        return call_host_op(  # type: ignore[no-any-return]
            "serving_attention", q, k, v, k_cache, v_cache, slot_mapping, block_table,
            cached_seq_len, query_start_loc, sinks, k_scale, v_scale,
            softmax_scale=softmax_scale, sliding_window=sliding_window, layout=layout,
            max_query_len=max_query_len,
        )  # fmt: skip
    _check_lengths(query_start_loc, cached_seq_len, q.shape[0], max_query_len)
    _check_distinct_caches(k_cache, v_cache)
    _check_scale_values(k_scale, v_scale, softmax_scale, q.shape[2])
    geo = CacheGeometry.of(k_cache, layout)
    if slot_mapping is not None:
        _check_slots_follow_table(slot_mapping, block_table, cached_seq_len, query_start_loc,
                                  geo)  # fmt: skip
    qsl = host_numpy(query_start_loc).astype(np.int64)
    ctx = host_numpy(cached_seq_len).reshape(-1).astype(np.int64)
    group = q.shape[1] // geo.kv_heads
    decode = decode_sequences(qsl[1:] - qsl[:-1], ctx, group, sliding_window)
    if decode.any():
        # decode rows / drafts: the streamed decode body (with the segmented body for the
        # step's prefill sequences, if any), one launch
        return serving_decode(
            q, k, v, k_cache, v_cache, slot_mapping, block_table, cached_seq_len.reshape(-1),
            query_start_loc, sinks, softmax_scale, sliding_window, layout, decode, k_scale,
            v_scale,
        )  # fmt: skip
    return _serving_attention(
        q, k, v, k_cache, v_cache, slot_mapping, block_table, cached_seq_len.reshape(-1),
        query_start_loc, sinks, k_scale, v_scale, softmax_scale, sliding_window, layout,
    )  # fmt: skip


def _examples_attention() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 32, generator=g)
    k, v = torch.randn(6, 2, 32, generator=g), torch.randn(6, 2, 32, generator=g)
    cache = torch.randn(8, 16, 2, 32, generator=g)
    table = torch.tensor([[3, 5], [0, 7]], dtype=torch.int32)
    ctx = torch.tensor([18, 4])
    qsl = torch.tensor([0, 1, 5])
    slots = torch.tensor([5 * 16 + 2, 4, 5, 6, 7, -1])
    hnd = torch.randn(8, 2, 16, 32, generator=g)
    return [
        ((q, k, v, cache, cache.clone(), slots, table, ctx, qsl), {}),
        ((q, None, None, cache, cache.clone(), None, table, ctx, qsl, torch.randn(4, generator=g)),
         {"sliding_window": 3, "softmax_scale": 0.3}),
        ((q, k, v, hnd, hnd.clone(), slots, table, ctx, qsl),
         {"layout": "hnd", "max_query_len": 4}),
    ]  # fmt: skip


# The step's plan reads the metadata's values (slots, lengths, block table): when the body
# is traced (TorchNeuron's nki_op, `tracing()`), the whole call is one nki_host node.
_CACHES = ("k_cache", "v_cache")
define_host_op("kv_cache_write", _kv_cache_write, fake=_fake_write, validate=_validate_write,
               mutates_args=_CACHES)  # fmt: skip
define_host_op("serving_attention", _serving_attention_op, fake=_fake_attention,
               validate=_validate_attention, mutates_args=_CACHES)  # fmt: skip
define_op("kv_cache_write", _kv_cache_write, fake=_fake_write, validate=_validate_write,
          mutates_args=_CACHES, examples=_examples_write, traceable=True)  # fmt: skip
define_op("serving_attention", _serving_attention_op, fake=_fake_attention,
          validate=_validate_attention, mutates_args=_CACHES, examples=_examples_attention,
          traceable=True)  # fmt: skip


def _check_optional_tensors(**named: Any) -> None:
    """Each given value a tensor (a float scale reached the schema check: a RuntimeError)."""
    check_is_tensor(**{arg: t for arg, t in named.items() if t is not None})


def kv_cache_write(
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot_mapping: Tensor,
    *,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    layout: str = "nhd",
) -> None:
    """`torch.ops.nki.kv_cache_write`: k, v [T, Hkv, D] into the caches at slot_mapping."""
    check_is_tensor(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    _check_optional_tensors(k_scale=k_scale, v_scale=v_scale)
    torch.ops.nki.kv_cache_write(
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, layout=layout
    )


def serving_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    cached_seq_len: Tensor,
    query_start_loc: Tensor,
    *,
    k: Tensor | None = None,
    v: Tensor | None = None,
    slot_mapping: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    layout: str = "nhd",
    max_query_len: int | None = None,
) -> Tensor:
    """`torch.ops.nki.serving_attention`: out [T, Hq, D] of every packed query over its
    sequence's cached prefix plus its own new tokens (causal); with k, v, slot_mapping
    the new tokens are written first, in the same launch. Tokens of no sequence (past
    query_start_loc[-1]) and rows that see no key return 0."""
    check_is_tensor(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                    cached_seq_len=cached_seq_len, query_start_loc=query_start_loc)  # fmt: skip
    _check_optional_tensors(k=k, v=v, slot_mapping=slot_mapping, sinks=sinks, k_scale=k_scale,
                            v_scale=v_scale)  # fmt: skip
    return torch.ops.nki.serving_attention(  # type: ignore[no-any-return]
        q, k, v, k_cache, v_cache, slot_mapping, block_table, cached_seq_len, query_start_loc,
        sinks, k_scale, v_scale, softmax_scale=softmax_scale, sliding_window=sliding_window,
        layout=layout, max_query_len=max_query_len,
    )  # fmt: skip


__all__ = ["kv_cache_write", "serving_attention"]
