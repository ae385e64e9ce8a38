"""Peer rows for decode MoE: nki-library's `moe_tkg` priced like our decode kernel.

AWS's `core/moe/moe_tkg/moe_tkg.py::moe_tkg` (nki-library @ d2ad3a57) is imported
unmodified from a local checkout (`nki_kernels.conformance.loader`), traced by our
interpreter and priced by the same cost model (`bench.peer.price_call`). Configuration
(read from its signature and docstring): hidden [T, H] bf16, gate/up weights
[E, H, 2, I] (the same bytes as our [E, H, 2I]: gate columns then up), down [E, I, H],
affinities [T, E] fp32, expert_index [T, K] int32, SiLU, `POST_SCALE` affinities
(out += affinity * expert(x), as ours), launched as kernel[lnc]. Two modes:

- selective (`is_all_expert=False`), its top-K mode: for each token, for each of its K
  experts, that expert's weights streamed once (T * K expert streams; a repeated expert
  is streamed again). Limits: T <= 128. At LNC 2 it splits the tokens over the cores
  when T > 1 and H * I < 3072 * 1536, else each expert's H columns.
- all-expert (`is_all_expert=True`, a [1, 1] rank id, `mask_unselected_experts`): every
  local expert on every token, affinities of unselected experts masked to 0. It streams
  all E experts, so it is priced only where every expert is touched (the same bytes as
  ours).

Selective launches with more than `EXACT_PAIRS` (token, expert) pairs are priced by
linear extrapolation in T from launches at T = 8 and T = 16 (its token loop repeats one
body per token and core; below T = 8 its cost per token still varies with T, so the
anchors start there; checked against exact launches in the benchmark notes);
all-expert launches with more than `EXACT_EXPERTS` experts by linear extrapolation in E
from E = 4 and E = 8 local experts (its expert loop repeats one body per expert: linear
from E = 4 to 32). The method is recorded with each figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..interp import TensorSpec
from ..model_shapes import MoEShape
from .peer import PeerCall, PeerResult, price_call

TKG_MODULE = "nkilib.core.moe.moe_tkg.moe_tkg"
EXACT_PAIRS = 128  # selective launches up to this many (token, expert) streams run exactly
EXACT_EXPERTS = 8  # all-expert launches up to this many experts run exactly
TOKEN_ANCHORS = (8, 16)  # the exact selective launches a longer one is extrapolated from
BF16, F32, I32 = "bfloat16", "float32", "int32"


def _post_scale(mod: Any) -> dict[str, Any]:
    return {"expert_affinities_scaling_mode": mod.ExpertAffinityScaleMode.POST_SCALE}


def moe_tkg_call(
    shape: MoEShape, tokens: int, lnc: int, all_expert: bool, experts: int = 0
) -> PeerCall:
    """One moe_tkg launch on `tokens` tokens (`experts`: local experts, default all)."""
    h, i, k = shape.hidden, shape.intermediate, shape.top_k
    e = experts or shape.num_experts
    tensors: tuple[Any, ...] = (
        TensorSpec((tokens, h), BF16),
        TensorSpec((e, h, 2, i), BF16),
        TensorSpec((e, i, h), BF16),
        TensorSpec((tokens, e), F32),
        TensorSpec((tokens, k), I32),
    )
    if all_expert:
        return PeerCall(
            f"moe_tkg all-expert (E_L = {e})",
            TKG_MODULE,
            "moe_tkg",
            (*tensors, True, TensorSpec((1, 1), I32)),
            {"mask_unselected_experts": True},
            lnc=lnc,
            object_args=_post_scale,
        )
    return PeerCall(
        "moe_tkg selective",
        TKG_MODULE,
        "moe_tkg",
        (*tensors, False),
        lnc=lnc,
        object_args=_post_scale,
    )


@dataclass(frozen=True)
class TkgPrice:
    """moe_tkg's modeled latency (us) per cost-model parameter set (shipped first), how it
    was obtained, or why it could not be priced."""

    samples_us: tuple[float, ...]
    method: str
    error: str = ""

    @property
    def latency_us(self) -> float | None:
        return self.samples_us[0] if self.samples_us else None


def _samples(r: PeerResult) -> tuple[float, ...]:
    if r.latency_us is None:
        return ()
    return r.samples_us or (r.latency_us,)


def _line(a: PeerResult, b: PeerResult, xa: int, xb: int, x: int) -> tuple[float, ...]:
    sa, sb = _samples(a), _samples(b)
    return tuple(p + (x - xa) * (q - p) / (xb - xa) for p, q in zip(sa, sb))


def price_moe_tkg(
    checkout: str | Path, shape: MoEShape, tokens: int, target: str = "trn2", lnc: int = 2,
    all_expert: bool = False,
) -> TkgPrice:  # fmt: skip
    """moe_tkg at one decode row (module docstring)."""
    root = Path(checkout)
    if tokens > 128 and not all_expert:
        return TkgPrice((), "", "selective moe_tkg takes T <= 128")
    if all_expert:
        e = shape.num_experts
        if e <= EXACT_EXPERTS:
            r = price_call(root, moe_tkg_call(shape, tokens, lnc, True), target)
            return TkgPrice(_samples(r), "exact", r.error)
        a = price_call(root, moe_tkg_call(shape, tokens, lnc, True, 4), target)
        b = price_call(root, moe_tkg_call(shape, tokens, lnc, True, 8), target)
        err = a.error or b.error
        return TkgPrice(() if err else _line(a, b, 4, 8, e), "extrapolated in E from 4, 8", err)
    if tokens * shape.top_k <= EXACT_PAIRS or tokens <= TOKEN_ANCHORS[1]:
        r = price_call(root, moe_tkg_call(shape, tokens, lnc, False), target)
        return TkgPrice(_samples(r), "exact", r.error)
    ta, tb = TOKEN_ANCHORS
    a = price_call(root, moe_tkg_call(shape, ta, lnc, False), target)
    b = price_call(root, moe_tkg_call(shape, tb, lnc, False), target)
    err = a.error or b.error
    how = f"extrapolated in T from {ta}, {tb}"
    return TkgPrice(() if err else _line(a, b, ta, tb, tokens), how, err)
