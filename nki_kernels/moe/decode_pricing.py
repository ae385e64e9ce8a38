"""Modeled cost of the decode MoE kernel (`decode_mlp.moe_decode_fwd`) and of a whole
decode MoE layer around it (the router included).

`price_decode(touched, tokens, shape, target, lnc)`: one launch for `touched` experts.
Every touched expert runs the same instruction sequence and the weight stream crosses
expert boundaries, so

    latency(n per program) = latency(c0) + (n - c0) * (latency(c0 + 1) - latency(c0)),

c0 = min(n, 2) experts per program, each term interpreted trace-only with the count as a
static loop (`static_count`; the op runs a device loop with the same body). Under LNC 2
the programs take alternate experts: the busier one has ceil(touched / 2).

`router_latency`: our NKI router (`moe_mlp`'s routing kernel, moe/router.py) on the T
tokens, so a layer is router + experts kernel (the host bookkeeping between them, a
scatter and a sort of E ints, is not priced). Bands: the range over the
cost model's parameter sets. Every figure is "modeled (cost model vN, target)", never a
measurement.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..bench.bands import parameter_sets
from ..interp import TensorSpec
from ..perfmodel import estimate_trace, trace_kernel
from ..targets import Target, get_target
from .decode_mlp import moe_decode_fwd
from .router import moe_router_fwd


@functools.lru_cache(maxsize=256)
def _launch_latency(
    count: int, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    dtype: str, tgt: Target, lnc: int,
) -> tuple[float, ...]:  # fmt: skip
    """ns of one launch with `count` touched experts in all, per parameter set."""
    specs = (
        TensorSpec((tokens, hidden), dtype),
        TensorSpec((experts, hidden, 2 * inter), dtype),
        TensorSpec((experts, inter, hidden), dtype),
        TensorSpec((tokens, top_k), "int32"),
        TensorSpec((tokens, top_k), "float32"),
        TensorSpec((1, experts), "int32"),
        TensorSpec((1, 1), "int32"),
    )
    trace = trace_kernel(moe_decode_fwd, *specs, static_count=count, target=tgt, lnc=lnc)
    return tuple(estimate_trace(trace, t).latency_ns for t in parameter_sets(tgt))


@dataclass(frozen=True)
class DecodePricing:
    """Modeled latency (ns) of one decode-kernel launch, per parameter set (shipped first)."""

    latency_ns: tuple[float, ...]
    per_program: int  # touched experts of the busier program


def price_decode(
    touched: int, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    target: str | Target = "trn2", dtype: str = "bfloat16", lnc: int = 2,
) -> DecodePricing:  # fmt: skip
    """One launch for `touched` experts (module docstring)."""
    tgt = get_target(target)
    per = math.ceil(touched / lnc)
    args = (tokens, hidden, inter, experts, top_k, dtype, tgt, lnc)
    c0 = min(per, 2)
    base = _launch_latency(c0 * lnc, *args)
    if per == c0:
        return DecodePricing(base, per)
    nxt = _launch_latency((c0 + 1) * lnc, *args)
    lat = tuple(a + (per - c0) * (b - a) for a, b in zip(base, nxt))
    return DecodePricing(lat, per)


@functools.lru_cache(maxsize=64)
def router_latency(
    tokens: int, experts: int, top_k: int, tgt: Target, lnc: int = 2,
    scoring: str = "softmax", logits_dtype: str = "bfloat16",
) -> tuple[float, ...]:  # fmt: skip
    """ns of our NKI router (moe/router.py) on [T, E] logits, renormalized top-k, per
    parameter set."""
    logits = TensorSpec((tokens, experts), logits_dtype)
    trace = trace_kernel(moe_router_fwd, logits, top_k, scoring, True, target=tgt, lnc=lnc)
    return tuple(estimate_trace(trace, t).latency_ns for t in parameter_sets(tgt))
