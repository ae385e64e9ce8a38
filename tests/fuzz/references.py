"""float64 references for the property-based suite, written from the README contracts.

Independent of `nki_kernels.*.reference` (those are fp32 and shared with the unit tests):
every value is computed in float64 with plain torch ops, straight from the documented
semantics (mask formulas, routing and capacity rules, norm formulas).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

F64 = torch.float64


# ---- attention ------------------------------------------------------------------------
def attention_allowed(
    b: int,
    sq: int,
    sk: int,
    causal: bool,
    window: int | None,
    kv_lens: list[int] | None,
    segment_ids: Tensor | None,
) -> Tensor:
    """bool [B, Sq, Sk]: key j allowed for query i (bottom-right causal / window)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    allowed = torch.ones(b, sq, sk, dtype=torch.bool)
    diag = i + (sk - sq)
    if causal or window is not None:
        allowed &= j <= diag
    if window is not None:
        allowed &= j > diag - window
    if kv_lens is not None:
        allowed &= j[None] < torch.tensor(kv_lens)[:, None, None]
    if segment_ids is not None:
        allowed &= segment_ids[:, :, None] == segment_ids[:, None, :]
    return allowed


def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """out [B, Hq, Sq, D] float64 (differentiable); rows with no allowed key are 0."""
    group = q.shape[1] // k.shape[1]
    kk = k.to(F64).repeat_interleave(group, dim=1)
    vv = v.to(F64).repeat_interleave(group, dim=1)
    s = scale * q.to(F64) @ kk.transpose(-1, -2)
    mask = allowed[:, None]
    s = s.masked_fill(~mask, -math.inf)
    any_key = mask.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(any_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(mask, p, torch.zeros_like(p))
    return p @ vv


def attention_grad_magnitudes(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, allowed: Tensor, scale: float
) -> tuple[float, float]:
    """(max M_dq, max M_dk): the magnitudes the dq / dk sums are made of,
    M_dq = s * |P * (|dP| + |Delta|)| |K| and M_dk = s * (P * (|dP| + |Delta|))^T |Q|
    (summed over a GQA group). dS = P * (dP - Delta) cancels to ~0 when few keys are
    allowed (one key: exactly 0), so the rounding of dP and Delta, relative to these
    magnitudes, is what a kernel's dq / dk error is bounded by."""
    group = q.shape[1] // k.shape[1]
    qf, dof = q.detach().to(F64), dout.detach().to(F64)
    kk = k.detach().to(F64).repeat_interleave(group, dim=1)
    vv = v.detach().to(F64).repeat_interleave(group, dim=1)
    mask = allowed[:, None]
    s = (scale * qf @ kk.transpose(-1, -2)).masked_fill(~mask, -math.inf)
    any_key = mask.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(any_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(mask, p, torch.zeros_like(p))
    dp = dof @ vv.transpose(-1, -2)
    delta = (dof * (p @ vv)).sum(dim=-1, keepdim=True)
    m = p * (dp.abs() + delta.abs())
    m_dq = scale * m @ kk.abs()
    m_dk = scale * m.transpose(-1, -2) @ qf.abs()
    b, hq, sk, d = m_dk.shape
    m_dk = m_dk.reshape(b, hq // group, group, sk, d).sum(dim=2)
    return float(m_dq.max()) if m_dq.numel() else 0.0, float(m_dk.max()) if m_dk.numel() else 0.0


# ---- MoE --------------------------------------------------------------------------------
def route(logits: Tensor, top_k: int, scoring: str, renormalize: bool) -> tuple[Tensor, Tensor]:
    """(weights [T, k] float64 differentiable, ids [T, k] int64); ties -> lower id."""
    lf = logits.to(F64)
    scores = torch.softmax(lf, dim=-1) if scoring == "softmax" else torch.sigmoid(lf)
    # stable descending sort: equal scores keep ascending expert order
    order = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices
    ids = order[:, :top_k]
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def capacity_keep(ids: Tensor, e: int, capacity_factor: float | None) -> Tensor:
    """bool [T, k]: assignments kept under capacity max(1, ceil(cf * T * k / E)), served
    in (choice rank j, token t) order."""
    t, k = ids.shape
    keep = torch.ones(t, k, dtype=torch.bool)
    if capacity_factor is None:
        return keep
    cap = max(1, math.ceil(capacity_factor * t * k / e))
    used = [0] * e
    for j in range(k):
        for tok in range(t):
            ex = int(ids[tok, j])
            if used[ex] < cap:
                used[ex] += 1
            else:
                keep[tok, j] = False
    return keep


def moe(
    x: Tensor,
    logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    top_k: int,
    scoring: str,
    renormalize: bool,
    capacity_factor: float | None,
) -> Tensor:
    """[T, H] float64 (differentiable in every input) of the SwiGLU MoE layer."""
    e = w_gate_up.shape[0]
    i = w_gate_up.shape[2] // 2
    w, ids = route(logits, top_k, scoring, renormalize)
    keep = capacity_keep(ids, e, capacity_factor)
    xf = x.to(F64)
    out = torch.zeros_like(xf)
    for ex in range(e):
        sel = (ids == ex) & keep
        toks, js = sel.nonzero(as_tuple=True)
        if toks.numel() == 0:
            continue
        xe = xf[toks]
        gu = xe @ w_gate_up[ex].to(F64)
        y = (torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]) @ w_down[ex].to(F64)
        out = out.index_add(0, toks, w[toks, js, None] * y)
    return out


# ---- norms ------------------------------------------------------------------------------
def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    xf = x.to(F64)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y * weight.to(F64) if weight is not None else y


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    xf = x.to(F64)
    mean = xf.mean(dim=-1, keepdim=True)
    var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(F64)
    if bias is not None:
        y = y + bias.to(F64)
    return y
