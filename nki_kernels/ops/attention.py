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
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..attention import masks
from ..attention.config import AttentionProblem, FlashFwdConfig, max_resident_keys
from ..attention.flash_bwd import flash_attention_bwd
from ..attention.flash_fwd import flash_attention_fwd
from ..runtime import launch, lookup_config, pad_dim, pad_to_bucket
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_positive, check_same, check_tensor
from .registry import define_op

HEAD_DIM_MAX = 128
INDEX_DTYPES = (torch.int32, torch.int64)


# ---- argument checks (metadata only: they also run on FakeTensors) ------------------------
def _check(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: Any = False,
    softmax_scale: Any = None,
    sliding_window: Any = None,
    kv_lens: Any = None,
    segment_ids: Any = None,
) -> None:
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
    if softmax_scale is not None:
        check_positive("softmax_scale", softmax_scale)
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale: expected a finite number; got {softmax_scale}")
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


def _check_data(kv_lens: Tensor | None, segment_ids: Tensor | None, sk: int) -> None:
    """Checks that read tensor values (run in the kernels' host code, not in fakes)."""
    if kv_lens is not None and kv_lens.numel():
        lo, hi = int(kv_lens.min()), int(kv_lens.max())
        if lo < 0 or hi > sk:
            raise ValueError(f"kv_lens: expected values in [0, {sk}] (Sk); got min {lo}, max {hi}")
    if segment_ids is not None:
        masks.segment_runs(segment_ids.detach().cpu().numpy())


# ---- host plumbing ----------------------------------------------------------------------
def _scale(q: Tensor, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _mask_kind(causal: bool, window: int | None, kv_lens: Any, segment_ids: Any) -> str:
    if kv_lens is not None or segment_ids is not None:
        return "data"
    if window is not None:
        return "window"
    return "causal" if causal else "none"


def _bounds(
    b: int,
    sqb: int,
    skb: int,
    sq: int,
    sk: int,
    causal: bool,
    window: int | None,
    kv_lens: Tensor | None,
    segment_ids: Tensor | None,
) -> tuple[np.ndarray, np.ndarray]:
    seg = None
    if segment_ids is not None:
        s = segment_ids.detach().cpu().numpy().astype(np.int64)
        fill = int(s.min()) - 1 if s.size else 0  # padded positions: a document of their own
        seg = np.concatenate([s, np.full((b, sqb - sq), fill, dtype=np.int64)], axis=1)
    kl = kv_lens.detach().cpu().numpy() if kv_lens is not None else None
    return masks.query_bounds(
        b,
        sqb,
        skb,
        causal=causal,
        sliding_window=window,
        kv_lens=kl,
        segment_ids=seg,
        sq_valid=sq,
        sk_valid=sk,
    )


def _plan_and_bounds(
    lo: np.ndarray, hi: np.ndarray, sk: int, device: torch.device
) -> tuple[Any, Tensor | None]:
    """Static tile plan (() when every tile is FULL) and the kernels' bounds operand."""
    classes = masks.classify_tiles(lo, hi, sk)
    if (classes == masks.FULL).all():
        return (), None
    if (classes == classes[:1]).all():
        classes = classes[:1]  # the same plan for every batch row: one shared table
    bounds = torch.from_numpy(masks.kernel_bounds(lo, hi)).to(device)
    return masks.tile_plan(classes), bounds


def _problem(q: Tensor, k: Tensor, sqb: int, skb: int, mask: str) -> AttentionProblem:
    return AttentionProblem(
        seq_q=sqb,
        seq_k=skb,
        head_dim=q.shape[3],
        q_heads=q.shape[1],
        kv_heads=k.shape[1],
        batch=q.shape[0],
        dtype=str(q.dtype).removeprefix("torch."),
        mask=mask,
    )


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    softmax_scale: float | None,
    sliding_window: int | None,
    kv_lens: Tensor | None,
    segment_ids: Tensor | None,
) -> tuple[Tensor, Tensor]:
    b, _, sq, _ = q.shape
    sk = k.shape[2]
    _check_data(kv_lens, segment_ids, sk)
    scale = _scale(q, softmax_scale)
    target = get_target(None)
    qp, _ = pad_to_bucket(q, dim=2)
    kp, _ = pad_to_bucket(k, dim=2)
    vp = pad_dim(v, 2, kp.shape[2])
    sqb, skb = qp.shape[2], kp.shape[2]
    lo, hi = _bounds(b, sqb, skb, sq, sk, causal, sliding_window, kv_lens, segment_ids)
    mask = _mask_kind(causal, sliding_window, kv_lens, segment_ids)
    chunk = _key_chunk(q, k, sqb, skb, mask, target)
    parts = []
    for c0 in range(0, skb, chunk):
        c1 = min(skb, c0 + chunk)
        clo, chi = np.clip(lo - c0, 0, c1 - c0), np.clip(hi - c0, 0, c1 - c0)
        plan, bounds = _plan_and_bounds(clo, chi, c1 - c0, q.device)
        problem = _problem(q, k, sqb, c1 - c0, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        out_c, lse_c = launch(
            flash_attention_fwd,
            qp,
            kp[:, :, c0:c1].contiguous(),
            vp[:, :, c0:c1].contiguous(),
            bounds,
            scale,
            plan,
            config=cfg,
            target=target,
        )
        lse_c = _lse_from_kernel(lse_c)
        empty = torch.from_numpy(clo >= chi).to(q.device)[:, None, :]
        parts.append((out_c, lse_c.masked_fill(empty, float("-inf"))))
    out, lse = parts[0] if len(parts) == 1 else _merge(parts)
    out, lse = out[:, :, :sq], lse[:, :, :sq]
    empty = torch.from_numpy(lo[:, :sq] >= hi[:, :sq]).to(q.device)[:, None, :]
    if bool(empty.any()):
        out = out.masked_fill(empty[..., None], 0.0)
        lse = lse.masked_fill(empty, float("-inf"))
    return out.contiguous(), lse.contiguous()


def _key_chunk(q: Tensor, k: Tensor, sqb: int, skb: int, mask: str, target: Any) -> int:
    """Keys per forward call: all of them, or the longest range whose K^T / V fit in
    SBUF under the config that will run it (re-checked for the chunk's own config)."""
    chunk = skb
    for _ in range(4):
        problem = _problem(q, k, sqb, chunk, mask)
        cfg = lookup_config("flash_attention", problem, flash_attention_fwd, target=target)
        assert isinstance(cfg, FlashFwdConfig)
        limit = max_resident_keys(cfg, problem, target)
        if limit >= chunk:
            return chunk
        chunk = limit
    return chunk


def _lse_from_kernel(lse_pm: Tensor) -> Tensor:
    """[B, H, 128, nq] partition-major (the kernels' layout) -> [B, H, nq * 128]."""
    b, h, p, nq = lse_pm.shape
    return lse_pm.transpose(2, 3).reshape(b, h, nq * p)


def _lse_to_kernel(lse: Tensor) -> Tensor:
    """[B, H, nq * 128] -> the kernels' partition-major [B, H, 128, nq] (contiguous)."""
    b, h, s = lse.shape
    return lse.reshape(b, h, s // 128, 128).transpose(2, 3).contiguous()


def _merge(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Combine per-key-chunk results: lse = logsumexp(lse_c), out = sum w_c * out_c."""
    lses = torch.stack([p[1] for p in parts])
    lse = torch.logsumexp(lses, dim=0)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    out = torch.zeros_like(parts[0][0], dtype=torch.float32)
    for out_c, lse_c in parts:
        out += torch.exp(lse_c - safe).unsqueeze(-1) * out_c.float()
    return out.to(parts[0][0].dtype), lse


def _backward(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: bool,
    softmax_scale: float | None,
    sliding_window: int | None,
    kv_lens: Tensor | None,
    segment_ids: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    b, _, sq, _ = q.shape
    sk = k.shape[2]
    scale = _scale(q, softmax_scale)
    target = get_target(None)
    qp, _ = pad_to_bucket(q, dim=2)
    kp, _ = pad_to_bucket(k, dim=2)
    sqb, skb = qp.shape[2], kp.shape[2]
    vp = pad_dim(v, 2, skb)
    op, dop = pad_dim(out, 2, sqb), pad_dim(grad_out.to(q.dtype), 2, sqb)
    lo, hi = _bounds(b, sqb, skb, sq, sk, causal, sliding_window, kv_lens, segment_ids)
    # rows without an allowed key (and padded rows) get lse = +inf: their P is exactly 0
    empty = torch.from_numpy(lo >= hi).to(q.device)[:, None, :]
    lse_p = _lse_to_kernel(pad_dim(lse.float(), 2, sqb).masked_fill(empty, float("inf")))
    dlse = None
    if grad_lse is not None:
        dlse = _lse_to_kernel(pad_dim(grad_lse.float(), 2, sqb).masked_fill(empty, 0.0))
    plan, bounds = _plan_and_bounds(lo, hi, skb, q.device)
    problem = _problem(q, k, sqb, skb, _mask_kind(causal, sliding_window, kv_lens, segment_ids))
    cfg = lookup_config("flash_attention_bwd", problem, flash_attention_bwd, target=target)
    dq, dk, dv = launch(
        flash_attention_bwd,
        qp,
        kp,
        vp,
        op.contiguous(),
        dop.contiguous(),
        lse_p,
        dlse,
        bounds,
        scale,
        plan,
        config=cfg,
        target=target,
    )
    return dq[:, :, :sq].contiguous(), dk[:, :, :sk].contiguous(), dv[:, :, :sk].contiguous()


# ---- the ops --------------------------------------------------------------------------------
def _fwd_fake(
    q: Tensor, k: Tensor, v: Tensor, kv_lens: Any = None, segment_ids: Any = None, **kw: Any
) -> tuple[Tensor, Tensor]:
    b, h, s, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


def _fwd_validate(
    q: Tensor, k: Tensor, v: Tensor, kv_lens: Any = None, segment_ids: Any = None, **kw: Any
) -> None:
    _check(
        q,
        k,
        v,
        kw.get("causal", False),
        kw.get("softmax_scale"),
        kw.get("sliding_window"),
        kv_lens,
        segment_ids,
    )
    if not isinstance(kw.get("return_lse", False), bool):
        raise TypeError(f"return_lse: expected a bool; got {type(kw['return_lse']).__name__}")


def _setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any
) -> None:
    q, k, v, kv_lens, segment_ids = inputs
    out, lse = output
    opts = dict(keyword_only_inputs)
    opts.pop("return_lse", None)
    ctx.save_for_backward(q, k, v, out, lse, kv_lens, segment_ids)
    ctx.opts = opts


def _grad(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse, kv_lens, segment_ids = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.nki.flash_attention_backward(
        grad_out, grad_lse, q, k, v, out, lse, kv_lens, segment_ids, **ctx.opts
    )
    return dq, dk, dv, None, None


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Small sample calls (opcheck, tests)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 77, 64, generator=g, requires_grad=True)
    k = torch.randn(1, 1, 90, 64, generator=g, requires_grad=True)
    v = torch.randn(1, 1, 90, 64, generator=g, requires_grad=True)
    return [((q, k, v), {"causal": True})]


@define_op(
    "flash_attention",
    fake=_fwd_fake,
    validate=_fwd_validate,
    backward=_grad,
    setup_context=_setup,
    examples=_examples,
)
def _flash_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_lens: Tensor | None = None,
    segment_ids: Tensor | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(scale * q k^T + mask) v; see the module docstring."""
    return _forward(q, k, v, causal, softmax_scale, sliding_window, kv_lens, segment_ids)


def _bwd_fake(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    kv_lens: Any = None,
    segment_ids: Any = None,
    **kw: Any,
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
    kv_lens: Any = None,
    segment_ids: Any = None,
    **kw: Any,
) -> None:
    _check(
        q,
        k,
        v,
        kw.get("causal", False),
        kw.get("softmax_scale"),
        kw.get("sliding_window"),
        kv_lens,
        segment_ids,
    )
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


@define_op(
    "flash_attention_backward",
    fake=_bwd_fake,
    validate=_bwd_validate,
    examples=_bwd_examples,
)
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
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flash_attention from its saved output and log-sum-exp."""
    return _backward(
        grad_out,
        grad_lse,
        q,
        k,
        v,
        out,
        lse,
        causal,
        softmax_scale,
        sliding_window,
        kv_lens,
        segment_ids,
    )


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
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """`torch.ops.nki.flash_attention`, returning `out` (or `(out, lse)` with return_lse).

    q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D] (Hq a multiple of Hkv; D <= 128). Causal
    masks align bottom-right (query i sees keys <= i + Sk - Sq); `sliding_window` W keeps
    the W most recent keys (and implies causal); `kv_lens` [B] masks keys >= kv_lens[b];
    `segment_ids` [B, S] restricts attention to each query's own (contiguous) document.
    """
    out, lse = torch.ops.nki.flash_attention(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        sliding_window=sliding_window,
        kv_lens=kv_lens,
        segment_ids=segment_ids,
        return_lse=return_lse,
    )
    return (out, lse) if return_lse else out


class SdpaFallbackWarning(UserWarning):
    """`nki_kernels.sdpa` handed a call to torch's scaled_dot_product_attention."""


_WARNED: set[str] = set()


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
    if attn_mask is not None:
        return (
            "an explicit attn_mask (arbitrary dense masks are not supported; flash_attention "
            "takes causal, sliding_window, kv_lens and segment_ids)"
        )
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

    Calls the NKI op cannot serve (a dense attn_mask, dropout, other layouts, head_dim >
    128, ...) go to torch's SDPA, with one `SdpaFallbackWarning` per reason that says why.
    """
    reason = _sdpa_unsupported(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )
    if reason is not None:
        if reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(
                f"nki_kernels.sdpa: falling back to torch scaled_dot_product_attention for "
                f"{reason}",
                SdpaFallbackWarning,
                stacklevel=2,
            )
        return torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    out, _ = torch.ops.nki.flash_attention(query, key, value, causal=is_causal, softmax_scale=scale)
    return out


__all__ = ["SdpaFallbackWarning", "flash_attention", "sdpa"]
