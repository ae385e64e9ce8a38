"""The "nki" attention implementation for Hugging Face transformers (5.x): an attention
function and, registered with it, its mask function.

Registering an attention function alone is not enough: transformers builds the mask
with the mask function registered under the same name, and without one it hands the
attention function no mask at all, so a left-padded batch silently attends to its
padding. Here the mask function turns the model's mask into what `flash_attention`
takes, once per forward pass (not per layer), as an `NkiMask` plan:

1. transformers' own SDPA mask builder gives the exact boolean mask [B, 1, Sq, Sk] the
   model means (causal or not, sliding window, padding, packing, offsets of a KV cache),
   or None when it is a plain causal mask;
2. a plan for the op is derived and checked against that mask, element by element on
   every query row that is not padding:
   - "plain": causal (bottom-right aligned, as the op aligns it) or full, with the
     sliding window, and nothing else;
   - "segments" (Sq == Sk, prefill and training): the 2-D padding mask becomes
     `segment_ids`, one id per run of real tokens / padding, so left- and right-padded
     rows and their padding keep to themselves;
   - "decode" (a few new queries over a KV cache, Sq < Sk, Sq <= DECODE_SQ_MAX; tried
     first for such shapes): the
     keys each row may see are gathered to the front, in order (no copy when that is
     the identity), and `torch.ops.nki.decode_attention` runs with `cache_lens` = their
     count: query i sees the first cache_len - Sq + i + 1 of them. This is how
     left-padded batched `generate()` runs (Sq != Sk with padding has no exact mapping
     onto flash_attention's kv_lens / segment_ids). decode_attention has no backward:
     when autograd needs the gradient, Sq == 1 runs flash_attention on the same
     gathered keys with `kv_lens`, longer chunks take the dense path;
   - "dense": anything else (a custom mask, a chunk whose rows see no key): the op's
     dense `attn_mask` path, with transformers' boolean mask.

A 4-D `attention_mask` the caller builds (bool or additive) never reaches the mask
function: transformers hands it to the attention function as it is, which then takes
the dense path with it.

Under `torch.compile` the plan cannot read mask values (each check would break the
graph), so it is chosen from what is static: no 2-D padding mask (with a dynamic cache:
keys from position 0, queries last) is "plain" causal with the sliding window, exactly
transformers' mask for those arguments; any padding mask takes the "dense" path, exact
for every mask. Both compile with `fullgraph=True`.

Attention sinks (GPT-OSS: transformers passes `s_aux`, one logit per query head that
joins every row's softmax denominator and carries no value): a "plain" plan runs
`torch.ops.nki.sink_attention`; every other plan runs `flash_attention` with its
log-sum-exp and joins the sink the same way (lse = logaddexp(lse0, sink), out = out0 *
exp(lse0 - lse), differentiable through the lse). decode_attention has no sinks: a
"decode" plan takes its flash_attention plan. A row that sees no key gets out = 0, as in
the model's eager attention (the sink takes the whole row).

Gemma-2's logit softcap (`softcap`) runs in the op (`flash_attention(softcap=)`; with
sinks or over a KV cache too, on the flash_attention plans). What the op cannot do at all
(attention dropout, head_dim > 256) runs through torch's SDPA with the same mask (with
sinks or a softcap, which SDPA lacks: a torch composition of the model's eager formula);
`fallbacks()` counts those calls by reason, so `nki-kernels probe` and the tests can tell.

Query rows that see no key at all (the padding of a left-padded row) get zeros and no
gradient, as from torch's SDPA: the plan keeps which rows those are and the output is
multiplied by it (the op itself would let padding attend to padding). This matters: with
shifted labels the last padding position predicts the first real token, so its output
does reach the loss.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..ops.attention import HEAD_DIM_MAX, TORCH_SDPA, flash_attention
from ..ops.decode import PACKED_ROWS_MAX
from ..ops.sinks import sink_attention

NAME = "nki"
DECODE_SQ_MAX = 16  # new queries per decode step routed to decode_attention
_FALLBACKS: collections.Counter[str] = collections.Counter()
_FALLBACKS_LOCK = threading.Lock()


@dataclass(frozen=True)
class NkiMask:
    """How one forward pass's attention maps onto `flash_attention` (see module doc)."""

    kind: str
    causal: bool = True
    window: int | None = None
    segment_ids: Tensor | None = None
    gather: Tensor | None = None
    kv_lens: Tensor | None = None
    dense: Tensor | None = None
    rows: Tensor | None = None

    # With a static cache, generate() builds each step's mask ahead through the mask
    # function and passes the plan back in as the model's `attention_mask`; transformers'
    # mask preprocessing then reads `.ndim` (2 would mean a padding mask to expand) and
    # hands the plan to the mask function again, which returns it unchanged.
    ndim = 4


def fallbacks() -> dict[str, int]:
    """How many attention calls fell back to torch SDPA since start, by reason."""
    with _FALLBACKS_LOCK:
        return dict(_FALLBACKS)


def _count_fallback(reason: str) -> None:
    """One more fallback for `reason`. Eager calls take the lock (models run on several
    threads); inside torch.compile none is taken (Dynamo cannot trace one under fullgraph):
    Dynamo applies the increment after each run of the compiled graph."""
    if torch.compiler.is_compiling():
        _FALLBACKS[reason] += 1
        return
    with _FALLBACKS_LOCK:
        _FALLBACKS[reason] += 1


def _allowed(sq: int, sk: int, causal: bool, window: int | None, device: Any) -> Tensor:
    """The op's own mask for (causal, sliding_window): [Sq, Sk] bool, bottom-right."""
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal or window is not None:
        ok = j <= i
    if window is not None:
        ok = ok & (j > i - window)
    return ok


def _segments(valid: Tensor) -> Tensor:
    """One id per run of equal values of `valid` [B, S] (0, 1, 2, ... per row)."""
    change = (valid[:, 1:] != valid[:, :-1]).to(torch.int32)
    return torch.cat([torch.zeros_like(change[:, :1]), change.cumsum(1, dtype=torch.int32)], 1)


def plan(
    dense: Tensor | None,
    padding: Tensor | None,
    batch: int,
    sq: int,
    sk: int,
    kv_offset: int,
    window: int | None,
    device: Any,
) -> NkiMask:
    """The plan for one forward pass: `dense` is transformers' boolean mask [B|1, 1, Sq, Sk]
    (None: plain causal), `padding` its 2-D padding mask [B, kv_offset + Sk] (or None)."""
    decode_shape = sq < sk and sq <= DECODE_SQ_MAX
    if dense is None:
        if decode_shape and window is None:  # the whole cache, every row
            lens = torch.full((batch,), sk, dtype=torch.int32, device=device)
            return NkiMask("decode", kv_lens=lens)
        return NkiMask("plain", causal=True, window=window)
    m = dense[:, 0].expand(batch, sq, sk)
    rows = m.any(-1)  # query rows that see some key (the others get zeros)
    empty = None if bool(rows.all()) else rows
    if decode_shape and empty is None:
        decode = _decode_plan(m, batch, sq, sk, device)
        if decode is not None:
            return NkiMask("decode", causal=False, dense=dense, gather=decode[0], kv_lens=decode[1])
    for causal in (True, False):
        base = _allowed(sq, sk, causal, window if causal else None, device)
        win = window if causal else None
        if bool((m == base).all()):
            return NkiMask("plain", causal=causal, window=win, dense=dense)
        if sq == sk and padding is not None:
            valid = padding[:, kv_offset : kv_offset + sk].to(torch.bool)
            seg = _segments(valid)
            ours = base & (seg[:, :, None] == seg[:, None, :])
            if bool(((m == ours).all(-1) | ~rows).all()):
                return NkiMask("segments", causal, win, segment_ids=seg, dense=dense, rows=empty)
    return NkiMask("dense", causal=False, dense=dense, rows=empty)


def _decode_plan(
    m: Tensor, batch: int, sq: int, sk: int, device: Any
) -> tuple[Tensor | None, Tensor] | None:
    """(key order or None for the identity, cache_lens) when decode_attention's rule on
    the gathered keys reproduces `m` [B, Sq, Sk] exactly; else None."""
    keep = m[:, -1]  # the last query sees every key any query of its row sees
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    lens = keep.sum(1).to(torch.int32)
    seen = torch.arange(sq, device=device)[None, :, None] + lens[:, None, None] - sq
    ours = torch.arange(sk, device=device)[None, None, :] <= seen
    if not bool((m.gather(2, order[:, None, :].expand(batch, sq, sk)) == ours).all()):
        return None
    identity = bool((order == torch.arange(sk, device=device)).all())
    return (None if identity else order), lens


def nki_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    local_size: int | None = None,
    **kwargs: Any,
) -> NkiMask:
    """The mask function of the "nki" implementation (transformers' mask-interface API)."""
    if isinstance(attention_mask, NkiMask):  # planned ahead by generate() (see NkiMask)
        return attention_mask
    from transformers.masking_utils import sdpa_mask

    # transformers passes False when it added or / and / packed-sequence masks
    plain_causal = bool(kwargs.pop("allow_is_causal_skip", True))
    device = kwargs.pop("device", "cpu")
    extra: dict[str, Any] = {}
    if mask_function is not None:
        extra["mask_function"] = mask_function
    compiling = torch.compiler.is_compiling()
    if compiling and plain_causal and attention_mask is None and kv_offset == 0:
        if isinstance(q_offset, int) and q_offset + q_length == kv_length:
            return NkiMask("plain", causal=True, window=local_size)  # see module doc
    dense = sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=plain_causal,
        device=device,
        use_vmap=kwargs.get("use_vmap", False),
        **extra,
    )
    if compiling:
        if dense is None:
            return NkiMask("plain", causal=True, window=local_size)
        return NkiMask("dense", causal=False, dense=dense)
    return plan(
        dense, attention_mask, batch_size, q_length, kv_length, kv_offset, local_size, device
    )


def _gather_keys(t: Tensor, order: Tensor) -> Tensor:
    idx = order[:, None, :, None].expand(t.shape[0], t.shape[1], order.shape[1], t.shape[3])
    return t.gather(2, idx)


def _sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scale: Any,
    causal: bool,
    reason: str,
) -> Tensor:
    _count_fallback(reason)
    return TORCH_SDPA(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=causal and mask is None,
        scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
    )


def _torch_eager(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scale: Any,
    sinks: Tensor | None,
    softcap: float | None,
    dropout: float,
    reason: str,
) -> Tensor:
    """The model's eager formula, with its sinks and logit softcap (for what the op cannot
    do; torch's SDPA has neither): [B, Hq, Sq, D]. A row that sees no key gets zeros."""
    _count_fallback(reason if sinks is None else f"{reason} with sinks")
    rep = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scores = query @ k.transpose(2, 3) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:  # Gemma-2's order: scale, cap, then the mask
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        )
    if sinks is not None:
        b, h, sq, _ = scores.shape
        sink = sinks.to(scores.dtype).reshape(1, h, 1, 1).expand(b, h, sq, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        unseen = (scores == float("-inf")).all(-1, keepdim=True)  # NaN scores stay NaN
        probs = torch.where(unseen, 0.0, torch.softmax(scores, -1))
    probs = torch.nn.functional.dropout(probs, p=dropout, training=True) if dropout else probs
    return probs.to(v.dtype) @ v


def _join_sinks(out0: Tensor, lse0: Tensor, sinks: Tensor) -> Tensor:
    """flash_attention's (out, lse) with one more logit per head in the denominator."""
    sink = sinks.to(torch.float32)[None, :, None].expand_as(lse0)
    lse = torch.logaddexp(lse0, sink)
    return (out0.to(torch.float32) * torch.exp(lse0 - lse)[..., None]).to(out0.dtype)


def _decode(query: Tensor, key: Tensor, value: Tensor, m: NkiMask, scale: Any) -> Any:
    """decode_attention's output [B, Hq, Sq, D] for a "decode" plan, or None when autograd
    needs a gradient (the op has no backward) or the step is too wide for it."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return None
    if query.shape[1] // key.shape[1] * query.shape[2] > PACKED_ROWS_MAX:
        return None
    if m.gather is not None:
        key, value = _gather_keys(key, m.gather), _gather_keys(value, m.gather)
    assert m.kv_lens is not None
    out, _ = torch.ops.nki.decode_attention(query, key, value, m.kv_lens, softmax_scale=scale)
    return out


def _grad_plan(m: NkiMask, sq: int) -> NkiMask:
    """The flash_attention plan of a "decode" plan (when decode_attention cannot run)."""
    if m.dense is None:
        return NkiMask("plain", causal=True)
    if sq == 1:  # the new token sees exactly the gathered keys
        return NkiMask("compact", causal=False, gather=m.gather, kv_lens=m.kv_lens)
    return NkiMask("dense", causal=False, dense=m.dense)


def nki_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The attention function of the "nki" implementation: q [B, Hq, Sq, D], k / v
    [B, Hkv, Sk, D] -> ([B, Sq, Hq, D], None), as transformers' own implementations."""
    m = attention_mask if isinstance(attention_mask, NkiMask) else None
    if isinstance(attention_mask, Tensor):
        # a custom 4-D mask reaches the attention function as given (bool or additive);
        # keys past the ones in use are cut off, as transformers' SDPA function does
        custom = (
            attention_mask[..., : key.shape[2]] if attention_mask.dim() == 4 else attention_mask
        )
        m = NkiMask("dense", causal=False, dense=custom)
    elif m is None:
        if attention_mask is not None:
            raise TypeError(
                "attention_mask: expected the 'nki' mask function's NkiMask or a mask tensor "
                f"(bool or additive, [B | 1, 1, Sq, Sk]); got {type(attention_mask).__name__}"
            )
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        m = NkiMask("plain", causal=bool(causal), window=kwargs.get("sliding_window"))
    softcap = kwargs.get("softcap")
    reason = None
    if dropout > 0.0:
        reason = f"attention dropout ({dropout})"
    elif query.shape[-1] > HEAD_DIM_MAX:
        reason = f"head_dim {query.shape[-1]} > {HEAD_DIM_MAX}"
    sinks = kwargs.get("s_aux")
    if reason is not None:
        dense = m.dense
        sq, sk = query.shape[2], key.shape[2]
        eager = sinks is not None or softcap is not None
        causal_dense = m.causal and (m.window is not None or sq != sk or eager)
        if dense is None and causal_dense:
            dense = _allowed(sq, sk, True, m.window, query.device)  # bottom-right, as ours
        if eager:
            out_e = _torch_eager(query, key, value, dense, scaling, sinks, softcap, dropout, reason)
            return out_e.transpose(1, 2), None
        fallback = _sdpa(query, key, value, dense, scaling, m.causal, reason)
        return fallback.transpose(1, 2), None
    if m.kind == "decode":
        plain = sinks is None and softcap is None  # decode_attention has neither
        decoded = _decode(query, key, value, m, scaling) if plain else None
        if decoded is not None:
            return decoded.transpose(1, 2), None
        m = _grad_plan(m, query.shape[2])
    if m.gather is not None:
        key, value = _gather_keys(key, m.gather), _gather_keys(value, m.gather)
    out: Any
    if sinks is not None and m.kind == "plain" and softcap is None:  # sink_attention: no cap
        out = sink_attention(
            query, key, value, sinks.to(torch.float32), causal=m.causal,
            softmax_scale=scaling, sliding_window=m.window,
        )  # fmt: skip
    else:
        out = flash_attention(
            query,
            key,
            value,
            causal=m.causal,
            softmax_scale=scaling,
            sliding_window=m.window,
            kv_lens=m.kv_lens,
            segment_ids=m.segment_ids,
            attn_mask=m.dense if m.kind == "dense" else None,
            softcap=softcap,
            return_lse=sinks is not None,
        )
        if sinks is not None:
            out = _join_sinks(out[0], out[1], sinks)
    if m.rows is not None:
        out = torch.where(m.rows[:, None, :, None].bool(), out, out.new_zeros(()))
    return out.transpose(1, 2), None


def register() -> None:
    """Register "nki" with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, nki_attention_forward)
    AttentionMaskInterface.register(NAME, nki_mask)


__all__ = ["NAME", "NkiMask", "fallbacks", "nki_attention_forward", "nki_mask", "plan", "register"]
