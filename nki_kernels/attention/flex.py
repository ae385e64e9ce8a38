"""FlexAttention-style mask and score functions on the flash-attention kernels.

    block_mask = create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)   # host, vectorized
    out = flex_attention(q, k, v, score_mod=alibi(slopes), block_mask=block_mask)

Same call and semantics as `torch.nn.attention.flex_attention`: `mask_mod(b, h, q_idx,
kv_idx) -> bool` says which (query, key) pairs are allowed; `score_mod(score, b, h,
q_idx, kv_idx)` rewrites the scaled score before the softmax. Indices are top-left (query
i and key j are positions i and j, whatever Sq and Sk). Rows with no allowed key give 0
and lse = -inf, as torch's.

How each part reaches the kernels (`host.py` does the rest):

- `create_block_mask` evaluates `mask_mod` once on broadcast index grids ([B|1, 1, 1, 1]
  x [1, H|1, 1, 1] x [1, 1, Sq, 1] x [1, 1, 1, Sk]; `torch.vmap` if the function does not
  broadcast) into a bool [B|1, H|1, Sq, Sk] map, and classifies its 128 x 128 tiles
  (SKIP / FULL / PARTIAL, `masks.classify_dense`).
- The op receives the map as `attn_mask`. When every row is one key interval shared by
  all heads (causal, sliding window, prefix-LM, contiguous documents and their
  intersections), the host turns it into per-row bounds and the kernels mask PARTIAL
  tiles with `range_select`, loading nothing; otherwise PARTIAL tiles load their uint8
  mask tile.
- A `score_mod` that adds a term independent of the score (ALiBi, relative biases) is
  evaluated on the host into an additive mask, checked at the call's real scores:
  score_mod(s) - s must not depend on s there (a clamp that would bite is refused).
  `softcap(cap)` (cap * tanh(score / cap), optionally followed by an additive term)
  runs in the kernels: tanh on ScalarE, its derivative in the backward.
  Other score_mods raise a ValueError naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..runtime.host_array import host_numpy
from . import masks

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class BlockMask:
    """A mask function evaluated at one shape: the bool map and its tile classes."""

    allowed: Tensor  # bool [B | 1, H | 1, Sq, Sk]
    mask_mod: MaskMod | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.allowed.shape)

    def tile_classes(self) -> np.ndarray:
        """SKIP / PARTIAL / FULL per (batch, 128-query tile, 128-key tile)."""
        return masks.classify_dense(host_numpy(self.allowed))

    def sparsity(self) -> float:
        """Fraction of tiles skipped."""
        return 1.0 - masks.allowed_fraction(self.tile_classes())


def _grids(b: int, h: int, sq: int, sk: int, device: Any) -> tuple[Tensor, ...]:
    ar = lambda n: torch.arange(n, device=device)  # noqa: E731
    return (
        ar(b).view(b, 1, 1, 1),
        ar(h).view(1, h, 1, 1),
        ar(sq).view(1, 1, sq, 1),
        ar(sk).view(1, 1, 1, sk),
    )


def _evaluate(
    fn: Callable[..., Tensor], b: int, h: int, sq: int, sk: int, device: Any, *pre: Any
) -> Tensor:
    """fn(*pre, b, h, q_idx, kv_idx) on broadcast grids; vmap when it does not broadcast."""
    return _evaluate_on(fn, _grids(b, h, sq, sk, device), device, *pre)


def _evaluate_on(
    fn: Callable[..., Tensor], grids: tuple[Tensor, ...], device: Any, *pre: Any
) -> Tensor:
    shape = tuple(g.numel() for g in grids)
    try:
        out = fn(*pre, *grids)
        out = torch.as_tensor(out, device=device)
        torch.broadcast_shapes(out.shape, shape)
        return out
    except Exception:  # a function written for scalar indices: vectorize it
        flat = [g.reshape(-1) for g in grids]
        # a score block of the grid's shape is mapped with the indices; a scalar is shared
        pre_dims = tuple(0 if isinstance(p, Tensor) and p.dim() == 4 else None for p in pre)
        f = fn
        for dim in range(3, -1, -1):
            in_dims = tuple(0 if i == dim else None for i in range(4))
            f = torch.vmap(f, in_dims=pre_dims + in_dims)
        return f(*pre, *flat)


def create_block_mask(
    mask_mod: MaskMod,
    B: int | None,
    H: int | None,
    Q_LEN: int,
    KV_LEN: int,
    device: str | torch.device = "cpu",
) -> BlockMask:
    """`mask_mod` evaluated for every (b, h, q_idx, kv_idx) (None for B / H: broadcast
    over them), as torch's create_block_mask; the result feeds `flex_attention`."""
    for arg, n in (("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{arg}: expected an int >= 1; got {n!r}")
    b, h = B or 1, H or 1
    out = _evaluate(mask_mod, b, h, Q_LEN, KV_LEN, device)
    if out.dtype != torch.bool:
        raise TypeError(f"mask_mod: expected a bool result; got {out.dtype}")
    bb = b if out.dim() == 4 and out.shape[0] != 1 else 1
    hh = h if out.dim() >= 3 and out.shape[-3] != 1 else 1
    allowed = torch.broadcast_to(out, (b, h, Q_LEN, KV_LEN))[:bb, :hh].contiguous()
    return BlockMask(allowed, mask_mod)


# ---- mask functions -------------------------------------------------------------------------
def causal_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """Key j <= query i (top-left, as flex_attention's examples)."""
    return q_idx >= kv_idx


def sliding_window_mask(window: int) -> MaskMod:
    """Causal, and the `window` most recent keys (the query's own position included)."""
    if window < 1:
        raise ValueError(f"window: expected an int >= 1; got {window}")

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return mod


def prefix_lm_mask(prefix: int) -> MaskMod:
    """Bidirectional over the first `prefix` keys, causal after them."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx < prefix) | (q_idx >= kv_idx)

    return mod


def document_mask(document_ids: Tensor) -> MaskMod:
    """Attention inside the query's document: `document_ids` [S] or [B, S]."""
    docs = document_ids if document_ids.dim() == 2 else document_ids.unsqueeze(0)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        bb = b if docs.shape[0] > 1 else torch.zeros_like(b)
        return docs[bb, q_idx] == docs[bb, kv_idx]

    return mod


def and_masks(*mods: MaskMod) -> MaskMod:
    """Allowed where every mask allows."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out

    return mod


def or_masks(*mods: MaskMod) -> MaskMod:
    """Allowed where any mask allows."""

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out | m(b, h, q_idx, kv_idx)
        return out

    return mod


# ---- score functions ------------------------------------------------------------------------
def alibi(slopes: Tensor) -> ScoreMod:
    """score + slopes[h] * (kv_idx - q_idx) (ALiBi; `slopes` [H])."""

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        w = slopes.to(device=score.device, dtype=score.dtype)  # the call may be on a device
        return score + w[h] * (kv_idx - q_idx).to(score.dtype)

    return mod


def alibi_slopes(heads: int) -> Tensor:
    """The ALiBi paper's geometric slopes 2^(-8 (h + 1) / H) (H a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)])


@dataclass(frozen=True)
class SoftCap:
    """score_mod cap * tanh(score / cap), then `then` (an additive score_mod) if given."""

    cap: float
    then: ScoreMod | None = None

    def __call__(
        self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
    ) -> Tensor:
        capped = self.cap * torch.tanh(score / self.cap)
        return capped if self.then is None else self.then(capped, b, h, q_idx, kv_idx)


def softcap(cap: float, then: ScoreMod | None = None) -> SoftCap:
    """Logit soft-capping (Gemma 2, Grok): cap * tanh(score / cap), run in the kernels."""
    if not (isinstance(cap, (int, float)) and cap > 0):
        raise ValueError(f"cap: expected a number > 0; got {cap!r}")
    return SoftCap(float(cap), then)


_NOT_ADDITIVE = (
    "score_mod: expected score + f(b, h, q_idx, kv_idx) (an additive term) or "
    "nki_kernels.attention.flex.softcap(cap, then=...); got a function whose output minus "
    "the score depends on the score"
)


# The score_mod check holds one block of real scores at a time (plus score_mod's output
# and the comparison, a few times this): a whole [B, Hq, Sq, Sk] fp32 tensor is 8 GiB at
# Hq 32, S 8K. Blocks are (batches, heads, query rows) boxes over all keys.
CHECK_CHUNK_BYTES = 64 << 20


def check_boxes(b: int, h: int, sq: int, sk: int) -> list[tuple[slice, slice, slice]]:
    """(batch, head, query-row) slices tiling [B, H, Sq], each <= CHECK_CHUNK_BYTES of
    fp32 scores (one query row at least)."""
    rows = max(1, CHECK_CHUNK_BYTES // (4 * sk))
    if rows >= h * sq:
        n = rows // (h * sq)
        return [(slice(i, min(i + n, b)), slice(0, h), slice(0, sq)) for i in range(0, b, n)]
    if rows >= sq:
        n = rows // sq
        return [
            (slice(i, i + 1), slice(j, min(j + n, h)), slice(0, sq))
            for i in range(b)
            for j in range(0, h, n)
        ]
    return [
        (slice(i, i + 1), slice(j, j + 1), slice(r, min(r + rows, sq)))
        for i in range(b)
        for j in range(h)
        for r in range(0, sq, rows)
    ]


def additive_bias(
    score_mod: ScoreMod,
    b: int,
    h: int,
    sq: int,
    sk: int,
    device: Any,
    query: Tensor | None = None,
    key: Tensor | None = None,
    scale: float | None = None,
    cap: float | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """score_mod(s) - s as an fp32 [B|1, H|1, Sq, Sk] bias f, checked (given query and
    key) to be the same at the call's real scores: score_mod(scores) == scores + f at
    every allowed position (the kernels add f to whatever score they compute, so a clamp
    or any other score-dependent part would be silently dropped). The scores are built
    and checked one `check_boxes` block at a time. ValueError otherwise (a RuntimeError
    from the compiled graph under torch.compile)."""
    zero = torch.zeros((), dtype=torch.float32, device=device)
    f0 = _evaluate(score_mod, b, h, sq, sk, device, zero).float()
    f0 = f0.reshape((1,) * (4 - f0.dim()) + tuple(f0.shape))  # a mask is 4-D
    compiling = torch.compiler.is_compiling()
    if not compiling:
        probe = torch.tensor(1.7, dtype=torch.float32, device=device)
        f1 = _evaluate(score_mod, b, h, sq, sk, device, probe).float() - probe
        if not torch.allclose(f0, f1, rtol=1e-5, atol=1e-5):
            raise ValueError(_NOT_ADDITIVE)
    if query is None or key is None:
        return f0
    full = (b, h, sq, sk)
    f0_all = f0.expand(full)  # views: a box of them is sliced, never the whole materialised
    allowed_all = None if allowed is None else torch.broadcast_to(allowed, full)
    all_ok = torch.ones((), dtype=torch.bool, device=device)
    for box in check_boxes(b, h, sq, sk):
        scores = real_scores(query, key, scale, cap, box)
        grids = _box_grids(box, sk, device)
        got = _evaluate_on(score_mod, grids, device, scores).float()
        f = f0_all[box]
        # fp32 rounding of score + f: a few ulps of the larger of the two
        ok = (got - scores - f).abs() <= 1e-5 * (1.0 + scores.abs() + f.abs())
        if allowed_all is not None:
            ok = ok | ~allowed_all[box]
        if compiling:  # no data at trace time: the graph checks it when it runs
            all_ok = all_ok & ok.all()
        elif not bool(ok.all()):
            local = [int(i) for i in (~ok).nonzero()[0]]
            s = float(scores.expand_as(ok)[tuple(local)])
            at = [
                local[0] + box[0].start,
                local[1] + box[1].start,
                local[2] + box[2].start,
                local[3],
            ]
            raise ValueError(f"{_NOT_ADDITIVE} (at [b, h, q, k] = {at}, score {s:.4g})")
    if compiling:
        torch._assert_async(all_ok, _NOT_ADDITIVE)
    return f0


def _box_grids(box: tuple[slice, slice, slice], sk: int, device: Any) -> tuple[Tensor, ...]:
    ar = lambda s: torch.arange(s.start, s.stop, device=device)  # noqa: E731
    bs, hs, qs = box
    return (
        ar(bs).view(-1, 1, 1, 1),
        ar(hs).view(1, -1, 1, 1),
        ar(qs).view(1, 1, -1, 1),
        torch.arange(sk, device=device).view(1, 1, 1, sk),
    )


def real_scores(
    query: Tensor,
    key: Tensor,
    scale: float | None,
    cap: float | None,
    box: tuple[slice, slice, slice] | None = None,
) -> Tensor:
    """fp32 [B, Hq, Sq, Sk] (or the `check_boxes` block `box` of it): the scores
    score_mod sees (scaled, soft-capped first)."""
    bs, hs, qs = box if box is not None else (slice(None), slice(None), slice(None))
    qf = query.detach()[bs, hs, qs].float()
    hq, hk = query.shape[1], key.shape[1]
    heads = torch.arange(hq, device=key.device)[hs] // (hq // hk)  # each query head's kv head
    kf = key.detach()[bs].index_select(1, heads).float()
    s = torch.einsum("bhqd,bhkd->bhqk", qf, kf)
    s = s * (1.0 / math.sqrt(qf.shape[-1]) if scale is None else float(scale))
    return s if cap is None else cap * torch.tanh(s / cap)


__all__ = [
    "BlockMask",
    "SoftCap",
    "additive_bias",
    "alibi",
    "alibi_slopes",
    "and_masks",
    "causal_mask",
    "check_boxes",
    "create_block_mask",
    "document_mask",
    "or_masks",
    "prefix_lm_mask",
    "real_scores",
    "sliding_window_mask",
    "softcap",
]
