"""Attention ops: `torch.ops.nki.flash_attention` (+ its backward op) and `sdpa`.

    flash_attention(q [B, Hq, Sq, D], k, v [B, Hkv, Sk, D], *, causal=False,
                    softmax_scale=None, sliding_window=None, kv_lens=None,
                    segment_ids=None, return_lse=False) -> (out [B, Hq, Sq, D], lse [B, Hq, Sq])

The op always returns (out, lse): the backward needs the log-sum-exp and a custom op's
autograd can only save its inputs and outputs. `nki_kernels.ops.attention.flash_attention`
(the Python API) returns `out`, or `(out, lse)` when `return_lse=True`.

A call runs: pad Sq and Sk to their buckets -> per-query key bounds and the static tile
plan on the host (masks.py; padded keys are outside every bound, padded rows are empty)
-> config lookup per bucket -> NKI forward kernel (keys beyond what one kernel keeps
resident are split into chunks merged by log-sum-exp) -> unpad -> rows with no allowed
key get out = 0 and lse = -inf. The backward pads the same way and runs the NKI backward
kernel (dK / dV reduced over each GQA group on chip).
"""

from __future__ import annotations

import math
import numbers
import threading
import warnings
from typing import Any

import torch
from torch import Tensor

from ..attention import flex
from ..attention.host import MaskArgs, backward, forward
from ..attention.host import lse_from_kernel as _lse_from_kernel  # noqa: F401 (autotune uses it)
from ..attention.host import lse_to_kernel as _lse_to_kernel  # noqa: F401
from .checks import FLOAT_DTYPES, check_is_tensor, check_positive, check_same, check_tensor
from .registry import call_host_op, define_host_op, define_op, tracing

# forward and backward: Q^T / K^T (and dO^T / V^T) in 128-row chunks of D, one
# accumulating contraction pass each
HEAD_DIM_MAX = 256
# Masked scores are filled with FP32_MIN (range_select's only fill) before scaling; below
# this scale, exp(scale * (FP32_MIN - max)) would no longer underflow to exactly 0
# (that needs scale * 3.4e38 >~ 104), so masked keys would get weight. 1e-30 leaves a
# margin of 10^6 (masked weights exp(-3.4e8) = 0).
SOFTMAX_SCALE_MIN = 1e-30
INDEX_DTYPES = (torch.int32, torch.int64)


# ---- argument checks (metadata only: they also run on FakeTensors) ------------------------
def check_softmax_scale(softmax_scale: float | None) -> None:
    """None, or a positive finite number >= SOFTMAX_SCALE_MIN (the masking limit: masked
    scores times the scale must still underflow to weight 0); shared by the attention and
    serving ops."""
    if softmax_scale is None:
        return
    check_positive("softmax_scale", softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite number; got {softmax_scale}")
    if softmax_scale < SOFTMAX_SCALE_MIN:
        raise ValueError(
            f"softmax_scale: expected a number >= {SOFTMAX_SCALE_MIN:g} (masking limit); "
            f"got {softmax_scale:g}"
        )


def _check_attn_mask(attn_mask: Tensor, q: Tensor, k: Tensor) -> None:
    """attn_mask: bool or additive float, broadcastable to [B, Hq, Sq, Sk]."""
    check_tensor("attn_mask", attn_mask, dtypes=(torch.bool, *FLOAT_DTYPES))
    b, hq, sq, _ = q.shape
    full = (b, hq, sq, k.shape[2])
    shape = tuple(attn_mask.shape)
    if not 2 <= len(shape) <= 4 or any(
        n not in (1, want) for n, want in zip(shape[::-1], full[::-1])
    ):
        raise ValueError(
            f"attn_mask: expected a shape broadcastable to {full} [B | 1, Hq | 1, Sq, Sk] "
            f"(2 to 4 dims); got {shape}"
        )
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask: expected device {q.device} (as q); got {attn_mask.device}")


def _check(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_lens: Any,
    segment_ids: Any,
    kw: Any,
    attn_mask: Any = None,
) -> None:
    """Checks of the inputs and options both ops take (`kw`: their keyword arguments)."""
    causal = kw.get("causal", False)
    softmax_scale = kw.get("softmax_scale")
    sliding_window = kw.get("sliding_window")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(arg, t, dtypes=FLOAT_DTYPES, min_dim=4)
        if t.dim() != 4:
            raise ValueError(f"{arg}: expected 4 dims [B, H, S, D]; got shape {tuple(t.shape)}")
    check_same("k", k, "q", q)
    check_same("v", v, "q", q)
    b, hq, sq, d = q.shape
    if d > HEAD_DIM_MAX:
        raise ValueError(f"q: expected head_dim (dim 3) <= {HEAD_DIM_MAX}; got {d}")
    if k.shape[0] != b:
        raise ValueError(f"k: expected batch {b} (as q); got {k.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"k: expected head_dim {d} (as q); got {k.shape[3]}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected shape {tuple(k.shape)} (as k); got {tuple(v.shape)}")
    if hq % k.shape[1]:
        raise ValueError(
            f"k: expected a number of heads dividing q's {hq} (GQA / MQA); got {k.shape[1]}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool; got {type(causal).__name__}")
    check_softmax_scale(softmax_scale)
    softcap = kw.get("softcap")
    if softcap is not None:
        check_positive("softcap", softcap)
        if not math.isfinite(softcap):
            raise ValueError(f"softcap: expected a finite number; got {softcap}")
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
            raise TypeError(f"sliding_window: expected an int; got {type(sliding_window).__name__}")
        if sliding_window <= 0:
            raise ValueError(
                f"sliding_window: expected an int >= 1 (the W most recent keys); got "
                f"{sliding_window}"
            )
    sk = k.shape[2]
    if kv_lens is not None:
        check_tensor("kv_lens", kv_lens, dtypes=INDEX_DTYPES)
        if tuple(kv_lens.shape) != (b,):
            raise ValueError(f"kv_lens: expected shape ({b},) [B]; got {tuple(kv_lens.shape)}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens: expected device {q.device} (as q); got {kv_lens.device}")
    if segment_ids is not None:
        check_tensor("segment_ids", segment_ids, dtypes=INDEX_DTYPES)
        if sq != sk:
            raise ValueError(
                f"segment_ids: packed documents need Sq == Sk; got Sq = {sq}, Sk = {sk}"
            )
        if tuple(segment_ids.shape) != (b, sq):
            raise ValueError(
                f"segment_ids: expected shape ({b}, {sq}) [B, S]; got {tuple(segment_ids.shape)}"
            )
        if segment_ids.device != q.device:
            raise ValueError(
                f"segment_ids: expected device {q.device} (as q); got {segment_ids.device}"
            )
    if attn_mask is not None:
        _check_attn_mask(attn_mask, q, k)


OPTIONAL_TENSORS = ("kv_lens", "segment_ids", "attn_mask")  # both ops, after their tensors


def _optional_tensors(rest: tuple[Any, ...], kw: dict[str, Any]) -> tuple[Any, Any, Any]:
    """kv_lens, segment_ids, attn_mask of an op call, by position (`rest`) or by name
    (taken out of `kw`, which then holds the options only)."""
    vals = [*rest, *(None,) * (len(OPTIONAL_TENSORS) - len(rest))]
    for i, name in enumerate(OPTIONAL_TENSORS):
        if name in kw:
            vals[i] = kw.pop(name)
    return vals[0], vals[1], vals[2]


# ---- the ops --------------------------------------------------------------------------------
def _fwd_fake(q: Tensor, *args: Any, **kw: Any) -> tuple[Tensor, Tensor]:
    b, h, s, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


def _fwd_validate(q: Tensor, k: Tensor, v: Tensor, *rest: Any, **kw: Any) -> None:
    kv_lens, segment_ids, attn_mask = _optional_tensors(rest, kw)
    _check(q, k, v, kv_lens, segment_ids, kw, attn_mask)
    if not isinstance(kw.get("return_lse", False), bool):
        raise TypeError(f"return_lse: expected a bool; got {type(kw['return_lse']).__name__}")


def _setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any
) -> None:
    q, k, v, kv_lens, segment_ids, attn_mask = inputs
    out, lse = output
    opts = dict(keyword_only_inputs)
    opts.pop("return_lse", None)
    ctx.save_for_backward(q, k, v, out, lse, kv_lens, segment_ids, attn_mask)
    ctx.opts = opts
    ctx.mask_needs_grad = isinstance(attn_mask, Tensor) and attn_mask.requires_grad


MASK_GRAD_ERROR = (
    "attn_mask: expected a mask that does not require grad (the kernels give no gradient "
    "for it; detach it, or use nki_kernels.sdpa, which hands such calls to torch's SDPA)"
)


def _grad(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Any, ...]:
    if ctx.mask_needs_grad:
        raise ValueError(MASK_GRAD_ERROR)
    q, k, v, out, lse, kv_lens, segment_ids, attn_mask = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.nki.flash_attention_backward(
        grad_out, grad_lse, q, k, v, out, lse, kv_lens, segment_ids, attn_mask, **ctx.opts
    )
    return dq, dk, dv, None, None, None


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Small sample calls (opcheck, tests)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 77, 64, generator=g, requires_grad=True)
    k = torch.randn(1, 1, 90, 64, generator=g, requires_grad=True)
    v = torch.randn(1, 1, 90, 64, generator=g, requires_grad=True)
    return [((q, k, v), {"causal": True})]


def _flash_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_lens: Tensor | None = None,
    segment_ids: Tensor | None = None,
    attn_mask: Tensor | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(scale * q k^T + mask) v; see the module docstring."""
    if tracing(kv_lens, segment_ids, attn_mask):  # the tile plan reads the masks' values
        return call_host_op("flash_attention", q, k, v, kv_lens, segment_ids, attn_mask,
                            causal=causal, softmax_scale=softmax_scale,
                            sliding_window=sliding_window, softcap=softcap,
                            return_lse=return_lse)  # fmt: skip
    m = MaskArgs(causal, softmax_scale, sliding_window, kv_lens, segment_ids, attn_mask, softcap)
    return forward(q, k, v, m)


define_host_op("flash_attention", _flash_attention_op, fake=_fwd_fake, validate=_fwd_validate)
define_op("flash_attention", _flash_attention_op, fake=_fwd_fake, validate=_fwd_validate,
          backward=_grad, setup_context=_setup, examples=_examples, traceable=True)  # fmt: skip


def _bwd_fake(
    grad_out: Tensor, grad_lse: Any, q: Tensor, k: Tensor, v: Tensor, *args: Any, **kw: Any
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _bwd_validate(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *rest: Any,
    **kw: Any,
) -> None:
    kv_lens, segment_ids, attn_mask = _optional_tensors(rest, kw)
    _check(q, k, v, kv_lens, segment_ids, kw, attn_mask)
    for arg, t in (("grad_out", grad_out), ("out", out)):
        check_tensor(arg, t, min_dim=4)
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{arg}: expected shape {tuple(q.shape)} (as q); got {tuple(t.shape)}")
    expected = tuple(q.shape[:3])
    for arg, st in (("lse", lse), ("grad_lse", grad_lse)):
        if st is None:
            continue
        check_tensor(arg, st, dtypes=(torch.float32,), min_dim=3)
        if tuple(st.shape) != expected:
            raise ValueError(f"{arg}: expected shape {expected} [B, Hq, Sq]; got {tuple(st.shape)}")


def _bwd_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    (q, k, v), kw = _examples()[0]
    out, lse = _flash_attention_op(q.detach(), k.detach(), v.detach(), **kw)
    g = torch.randn_like(out)
    return [((g, None, q.detach(), k.detach(), v.detach(), out, lse), kw)]


def _flash_attention_backward_op(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    kv_lens: Tensor | None = None,
    segment_ids: Tensor | None = None,
    attn_mask: Tensor | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flash_attention from its saved output and log-sum-exp."""
    if tracing(kv_lens, segment_ids, attn_mask):  # the tile plan reads the masks' values
        return call_host_op("flash_attention_backward", grad_out, grad_lse, q, k, v, out, lse,
                            kv_lens, segment_ids, attn_mask, causal=causal,
                            softmax_scale=softmax_scale, sliding_window=sliding_window,
                            softcap=softcap)  # fmt: skip
    m = MaskArgs(causal, softmax_scale, sliding_window, kv_lens, segment_ids, attn_mask, softcap)
    return backward(grad_out, grad_lse, q, k, v, out, lse, m)


define_host_op("flash_attention_backward", _flash_attention_backward_op, fake=_bwd_fake,
               validate=_bwd_validate)  # fmt: skip
define_op("flash_attention_backward", _flash_attention_backward_op, fake=_bwd_fake,
          validate=_bwd_validate, examples=_bwd_examples, traceable=True)  # fmt: skip


# ---- Python API ------------------------------------------------------------------------------
def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    kv_lens: Tensor | None = None,
    segment_ids: Tensor | None = None,
    attn_mask: Tensor | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
    bucket_policy: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """`torch.ops.nki.flash_attention`, returning `out` (or `(out, lse)` with return_lse).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D] (Hq a multiple of Hkv; D <= 256). Causal
    masks align bottom-right (query i sees keys <= i + Sk - Sq); `sliding_window` W keeps
    the W most recent keys (and implies causal); `kv_lens` [B] masks keys >= kv_lens[b];
    `segment_ids` [B, S] restricts attention to each query's own (contiguous) document;
    `attn_mask` (bool: True = allowed, or additive float) broadcastable to [B, Hq, Sq, Sk]
    combines with all of them; `softcap` c > 0 soft-caps the scaled scores to
    c * tanh(score / c) before the mask is added. Rows with no allowed key return
    out = 0, lse = -inf (as torch's SDPA and flex_attention do). `bucket_policy`: the
    sequence-length buckets of this call (`runtime.buckets.parse_policy` spec).
    """
    check_is_tensor(q=q, k=k, v=v)
    if _mask_needs_grad(attn_mask):
        raise ValueError(MASK_GRAD_ERROR)
    out, lse = torch.ops.nki.flash_attention(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        sliding_window=sliding_window,
        kv_lens=kv_lens,
        segment_ids=segment_ids,
        attn_mask=attn_mask,
        softcap=softcap,
        return_lse=return_lse,
        bucket_policy=bucket_policy,
    )
    return (out, lse) if return_lse else out


def _mask_needs_grad(attn_mask: Any) -> bool:
    return isinstance(attn_mask, Tensor) and attn_mask.requires_grad and torch.is_grad_enabled()


# Taken at import, before anyone can monkeypatch the name: with
# `F.scaled_dot_product_attention = nki_kernels.sdpa`, a fallback through the name would
# call sdpa again (RecursionError).
TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention


def flex_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """`torch.nn.attention.flex_attention`'s call on the NKI kernels (see `attention.flex`).

    block_mask: from `attention.flex.create_block_mask` (or torch's BlockMask: its
    mask_mod is evaluated at this call's shape); score_mod: additive (ALiBi, biases) or
    `attention.flex.softcap`. Returns out [B, Hq, Sq, D] (and lse [B, Hq, Sq] fp32).
    """
    check_is_tensor(query=query, key=key, value=value)
    b, hq, sq, _ = query.shape
    sk = key.shape[2]
    if hq != key.shape[1] and not enable_gqa:
        raise ValueError(
            f"key: expected {hq} heads (as query) unless enable_gqa=True; got {key.shape[1]}"
        )
    allowed = None
    if block_mask is not None:
        if isinstance(block_mask, flex.BlockMask):
            allowed = block_mask.allowed
        elif callable(getattr(block_mask, "mask_mod", None)):
            allowed = flex.create_block_mask(
                block_mask.mask_mod, b, hq, sq, sk, query.device
            ).allowed
        else:
            raise TypeError(
                f"block_mask: expected a BlockMask (nki_kernels.attention.flex or torch's); got "
                f"{type(block_mask).__name__}"
            )
        if allowed.shape[-2:] != (sq, sk):
            raise ValueError(
                f"block_mask: expected Q_LEN, KV_LEN = {sq}, {sk} (as query, key); got "
                f"{tuple(allowed.shape[-2:])}"
            )
        allowed = allowed.to(query.device)
    cap = None
    if isinstance(score_mod, flex.SoftCap):
        cap, score_mod = score_mod.cap, score_mod.then
    mask: Tensor | None = allowed
    if score_mod is not None:
        bias = flex.additive_bias(
            score_mod, b, hq, sq, sk, query.device, query, key, scale, cap, allowed
        )
        if _mask_needs_grad(bias):
            raise ValueError(
                "score_mod: expected no learnable tensors (the kernels give no gradient for "
                "the bias it adds; got one that requires grad)"
            )
        mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
    out, lse = torch.ops.nki.flash_attention(
        query, key, value, attn_mask=mask, softmax_scale=scale, softcap=cap, return_lse=return_lse
    )
    return (out, lse) if return_lse else out


def _cu_check(arg: str, cu: Tensor, total: int, device: torch.device) -> None:
    check_tensor(arg, cu, dtypes=INDEX_DTYPES)
    if cu.device != device:
        raise ValueError(f"{arg}: expected device {device} (as q); got {cu.device}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{arg}: expected [num_docs + 1] offsets; got shape {tuple(cu.shape)}")
    if not torch.compiler.is_compiling():
        c = cu.detach().cpu()
        if int(c[0]) != 0 or int(c[-1]) != total or bool((c[1:] < c[:-1]).any()):
            raise ValueError(
                f"{arg}: expected non-decreasing offsets from 0 to {total} (the packed length); "
                f"got {c.tolist()}"
            )


def _doc_of(cu: Tensor, total: int) -> Tensor:
    """Document index of every packed position (empty documents own none)."""
    pos = torch.arange(total, device=cu.device)
    return torch.searchsorted(cu[1:].to(torch.int64), pos, right=True)


def flash_attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """flash-attn's varlen call: documents packed along the token axis.

    q [total_q, Hq, D], k, v [total_k, Hkv, D]; document i holds queries
    cu_seqlens_q[i]:cu_seqlens_q[i + 1] and keys cu_seqlens_k[i]:cu_seqlens_k[i + 1]
    (empty and one-token documents allowed). Causal aligns each document bottom-right,
    as flash-attn does. Returns out [total_q, Hq, D] (and lse [Hq, total_q] fp32).
    With cu_seqlens_q == cu_seqlens_k this is the segment_ids path; otherwise the
    per-document key intervals are passed as a mask that the host reads back as bounds.
    max_seqlen_q / max_seqlen_k are checked, not needed (no per-document launch).
    """
    check_is_tensor(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for arg, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, (numbers.Integral, torch.SymInt)):
            raise TypeError(f"{arg}: expected an int; got {type(n).__name__}")
    for arg, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):  # a mask-path call would take any truthy value
            raise TypeError(f"{arg}: expected a bool; got {type(flag).__name__}")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{arg}: expected [total, H, D]; got shape {tuple(t.shape)}")
    tq, tk = q.shape[0], k.shape[0]
    _cu_check("cu_seqlens_q", cu_seqlens_q, tq, q.device)
    _cu_check("cu_seqlens_k", cu_seqlens_k, tk, q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_k: expected {cu_seqlens_q.numel()} offsets (as cu_seqlens_q); got "
            f"{cu_seqlens_k.numel()}"
        )
    if not torch.compiler.is_compiling():
        for arg, cu, mx in (
            ("max_seqlen_q", cu_seqlens_q, max_seqlen_q),
            ("max_seqlen_k", cu_seqlens_k, max_seqlen_k),
        ):
            longest = int((cu[1:] - cu[:-1]).max())
            if longest > mx:
                raise ValueError(f"{arg}: expected >= the longest document ({longest}); got {mx}")
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, total, D]
    same = cu_seqlens_q is cu_seqlens_k or (
        tq == tk
        and not torch.compiler.is_compiling()
        and torch.equal(cu_seqlens_q.cpu(), cu_seqlens_k.cpu())
    )
    if same:
        seg = _doc_of(cu_seqlens_q, tq).unsqueeze(0)
        out, lse = torch.ops.nki.flash_attention(
            qb, kb, vb, segment_ids=seg, causal=causal, softmax_scale=softmax_scale
        )
    else:
        dq, dk = _doc_of(cu_seqlens_q, tq), _doc_of(cu_seqlens_k, tk)
        allowed = dq[:, None] == dk[None, :]
        if causal:  # bottom-right per document: j - k0 <= i - q0 + (len_k - len_q)
            cq, ck = cu_seqlens_q.to(torch.int64), cu_seqlens_k.to(torch.int64)
            i = torch.arange(tq, device=q.device) - cq[dq]
            j = torch.arange(tk, device=q.device) - ck[dk]
            shift = (ck[1:] - ck[:-1] - (cq[1:] - cq[:-1]))[dq]
            allowed &= j[None, :] <= (i + shift)[:, None]
        out, lse = torch.ops.nki.flash_attention(
            qb, kb, vb, attn_mask=allowed, softmax_scale=softmax_scale
        )
    out = out[0].transpose(0, 1)
    return (out, lse[0]) if return_lse else out


class SdpaFallbackWarning(UserWarning):
    """`nki_kernels.sdpa` handed a call to torch's scaled_dot_product_attention."""


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def _first_fallback(reason: str) -> bool:
    """Whether this is the first fallback for `reason` (its warning is due), exactly once
    among threads. Inside torch.compile no lock is taken (Dynamo cannot trace one)."""
    if torch.compiler.is_compiling():
        first = reason not in _WARNED
        _WARNED.add(reason)
        return first
    with _WARNED_LOCK:
        first = reason not in _WARNED
        _WARNED.add(reason)
        return first


def _sdpa_unsupported(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> str | None:
    """Why the NKI op cannot serve this call (None: it can)."""
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, query.dtype):
        return f"attn_mask of dtype {attn_mask.dtype} (supported: bool or the query's dtype)"
    if attn_mask is not None and is_causal:
        return "attn_mask together with is_causal (torch rejects the combination)"
    if _mask_needs_grad(attn_mask):
        return "an attn_mask that requires grad (the kernels give no gradient for the mask)"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p} (attention dropout is not supported)"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return "inputs that are not 4-D [B, H, S, D]"
    if query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (supported: float32, bfloat16, float16, all equal)"
    if query.device.type not in ("cpu", "neuron"):
        return f"device {query.device} (supported: cpu, neuron)"
    if query.shape[-1] > HEAD_DIM_MAX or key.shape[-1] != query.shape[-1]:
        return f"head_dim {query.shape[-1]} (supported: <= {HEAD_DIM_MAX})"
    if value.shape != key.shape or key.shape[0] != query.shape[0]:
        return "key/value shapes that differ from the [B, Hkv, Sk, D] layout"
    if query.shape[1] != key.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return "different query / key head counts without enable_gqa"
    if is_causal and query.shape[2] != key.shape[2]:
        return (
            "is_causal with Sq != Sk (torch aligns the causal mask top-left, this op bottom-right)"
        )
    if scale is not None and not scale > 0:
        return f"scale={scale} (supported: > 0)"
    if min(query.shape) == 0 or min(key.shape) == 0:
        return "empty inputs"
    return None


def sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for `torch.nn.functional.scaled_dot_product_attention` on the NKI kernels.

    Calls the NKI op cannot serve (dropout, other layouts, head_dim >
    256, ...) go to torch's SDPA, with one `SdpaFallbackWarning` per reason that says why.
    """
    reason = _sdpa_unsupported(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )
    if reason is not None:
        if _first_fallback(reason):
            warnings.warn(
                f"nki_kernels.sdpa: falling back to torch scaled_dot_product_attention for "
                f"{reason}",
                SdpaFallbackWarning,
                stacklevel=2,
            )
        return TORCH_SDPA(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    out, _ = torch.ops.nki.flash_attention(
        query, key, value, attn_mask=attn_mask, causal=is_causal, softmax_scale=scale
    )
    return out


__all__ = [
    "SdpaFallbackWarning",
    "flash_attention",
    "flash_attention_varlen",
    "flex_attention",
    "sdpa",
]
