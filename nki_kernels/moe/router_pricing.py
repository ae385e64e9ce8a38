"""Modeled cost of the NKI routing kernel (`router_options.py`) with each 2026 model's
options, forward and backward, on that model's expert count and top-k.

One launch per phase, kernel[lnc] over all T tokens (LNC 2: each core takes alternate
128-token tiles), fp32 logits (routers compute in fp32: transformers' DeepSeek-V3 and
Qwen3-MoE routers cast to fp32). The softmax-only NKI router of `moe_mlp` (`router.py`)
is priced beside it on the same [T, E] where it applies (E <= 128, k <= 8, softmax
scores with renormalization on or off). Figures: "modeled (cost model vN, target)",
band = range over the cost model's parameter sets widened by its structural error
(`perfmodel.band`); never a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..interp import TensorSpec
from ..model_shapes import DEEPSEEK_V3_LIKE_MOE, GPT_OSS_LIKE_MOE, QWEN3_MOE_LIKE_MOE, MoEShape
from ..perfmodel import COST_MODEL_VERSION, estimate_trace, trace_kernel
from ..perfmodel.band import band
from ..targets import get_target
from .router import moe_router_fwd
from .router_options import moe_route_options_bwd, moe_route_options_fwd
from .routing import ROUTERS, Router

# (shape, the model's router settings, selection-only bias)
ROUTER_ROWS: tuple[tuple[MoEShape, Router, bool], ...] = (
    (DEEPSEEK_V3_LIKE_MOE, ROUTERS["deepseek-v3"], True),
    (QWEN3_MOE_LIKE_MOE, ROUTERS["qwen3-moe"], False),
    (GPT_OSS_LIKE_MOE, ROUTERS["gpt-oss"], False),
)


@dataclass(frozen=True)
class RouterPrice:
    """One row: modeled us (band) of the forward and the backward launch."""

    model: str
    target: str
    tokens: int
    lnc: int
    fwd_us: float
    fwd_band: tuple[float, float]
    bwd_us: float
    bwd_band: tuple[float, float]
    fwd_busiest: str
    softmax_router_fwd_us: float | None  # router.py on the same [T, E], where it applies
    label: str


def _busiest(est: Any) -> str:
    eng = max(est.active_pct, key=lambda k: est.active_pct[k])
    return f"{eng} {est.active_pct[eng]:.0f}%"


def price_router_row(
    shape: MoEShape, router: Router, biased: bool, tokens: int, target: str, lnc: int = 2
) -> RouterPrice:
    """The model's routing on [tokens, E] fp32 logits, forward and backward (see module)."""
    tgt = get_target(target)
    e, k = shape.num_experts, router.top_k
    logits = TensorSpec((tokens, e), "float32")
    bias = TensorSpec((e,), "float32") if biased else None
    fwd = trace_kernel(
        moe_route_options_fwd, logits, bias, k, router.scoring, router.softmax_after_topk,
        router.n_group or 0, router.topk_group or 0, router.renormalize, router.scaling,
        target=tgt, lnc=lnc,
    )  # fmt: skip
    ids = TensorSpec((tokens, k), "int32")
    dw = TensorSpec((tokens, k), "float32")
    bwd = trace_kernel(
        moe_route_options_bwd, logits, ids, dw, router.scoring, router.softmax_after_topk,
        router.renormalize, router.scaling, target=tgt, lnc=lnc,
    )  # fmt: skip
    f_est, b_est = estimate_trace(fwd, tgt), estimate_trace(bwd, tgt)
    softmax_us = None
    plain = router.scoring == "softmax" and not router.softmax_after_topk and not biased
    if plain and router.n_group is None and e <= 128 and k <= 8 and router.scaling == 1.0:
        old = trace_kernel(moe_router_fwd, logits, k, "softmax", router.renormalize,
                           target=tgt, lnc=lnc)  # fmt: skip
        softmax_us = estimate_trace(old, tgt).latency_ns / 1e3
    fb, bb = band(fwd, tgt), band(bwd, tgt)
    return RouterPrice(
        model=shape.model,
        target=tgt.name,
        tokens=tokens,
        lnc=lnc,
        fwd_us=f_est.latency_ns / 1e3,
        fwd_band=(fb[0] / 1e3, fb[1] / 1e3),
        bwd_us=b_est.latency_ns / 1e3,
        bwd_band=(bb[0] / 1e3, bb[1] / 1e3),
        fwd_busiest=_busiest(f_est),
        softmax_router_fwd_us=softmax_us,
        label=f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name})",
    )


def router_rows(targets: tuple[str, ...] = ("trn2",), tokens: int = 4096) -> list[RouterPrice]:
    """Every model's row on every target."""
    return [
        price_router_row(shape, r, biased, tokens, t)
        for t in targets
        for shape, r, biased in ROUTER_ROWS
    ]
