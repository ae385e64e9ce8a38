"""Modeled cost of the decode MoE kernel (`decode_mlp.moe_decode_fwd`) and of a whole
decode MoE layer around it (the router included).

`price_decode(touched, tokens, shape, target, lnc)`: one launch for `touched` experts.
Every touched expert runs the same instruction sequence and the weight stream crosses
expert boundaries, but the modeled per-expert step is not constant: it dips with the
weight buffers' rotation (DeepSeek-V3-like, T = 64, experts per program 1 -> 7: 246.7,
243.7, 246.7, 246.7, 246.7, 244.3 us), so one step extrapolates whichever phase it
happened to have (here the dip: ~0.9 % optimistic at 128 experts per program). The
extrapolation takes the mean step over WINDOW experts per program, from a base of the
same phase (mod WINDOW) as n (experts per program):

    latency(n) = latency(c0) + (n - c0) / WINDOW * (latency(c0 + WINDOW) - latency(c0)),

c0 in 2 .. 1 + WINDOW with n - c0 a multiple of WINDOW (n < 2 + 2 WINDOW: traced
exactly): exact for a step of any period dividing WINDOW, else off by the window's mean
vs the long-run mean (DeepSeek-V3-like: the mean over 2 -> 6 is 245.96 us, over 2 -> 7
245.64). Each term is interpreted trace-only with the count as a static loop
(`static_count`; the op runs a device loop with the same body). Under LNC 2 the programs
take alternate experts: the busier one has ceil(touched / 2).

`layout="hf"` prices the weights as transformers stores them (experts [E, 2I, H] /
[E, H, I], the shared expert as nn.Linear gate / up [Is, H] and down [H, Is]), read by
the kernel's DMA transposes (`decode_mlp`'s `transposed` flags): what a patched HF
model's decode runs, with no copy; "rows" (default) the row-major layout.

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

WINDOW = 4  # experts per program whose mean step is extrapolated
LAYOUTS = ("rows", "hf")  # row-major weights; transformers' (read by DMA transposes)
BASE = 2  # the smallest base (experts per program) of the extrapolation


def anchors(per: int) -> tuple[int, int | None]:
    """(c0, c0 + WINDOW) experts per program that price `per` (module docstring); the
    second is None when `per` itself is traced."""
    if per < BASE + 2 * WINDOW:  # c0 + WINDOW would be >= per: trace it instead
        return per, None
    c0 = BASE + (per - BASE) % WINDOW
    return c0, c0 + WINDOW


@functools.lru_cache(maxsize=256)
def _launch_latency(
    count: int, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    dtype: str, tgt: Target, lnc: int, shared_inter: int = 0, shared_gated: bool = False,
    layout: str = "rows", band: bool = True,
) -> tuple[float, ...]:  # fmt: skip
    """ns of one launch with `count` touched experts in all (and the shared expert of
    `shared_inter` columns, when > 0), per parameter set (`band` False: `tgt` alone);
    `layout` (module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}; got {layout!r}")
    hf = layout == "hf"
    gu = (experts, 2 * inter, hidden) if hf else (experts, hidden, 2 * inter)
    dn = (experts, hidden, inter) if hf else (experts, inter, hidden)
    specs = [
        TensorSpec((tokens, hidden), dtype),
        TensorSpec(gu, dtype),
        TensorSpec(dn, dtype),
        TensorSpec((tokens, top_k), "int32"),
        TensorSpec((tokens, top_k), "float32"),
        TensorSpec((1, experts), "int32"),
        TensorSpec((1, 1), "int32"),
    ]
    if shared_inter:
        si = shared_inter
        s_gu = TensorSpec((1, si, hidden) if hf else (1, hidden, 2 * si), dtype)
        s_dn = TensorSpec((1, hidden, si) if hf else (1, si, hidden), dtype)
        specs += [None, None, s_gu, s_dn, TensorSpec((1, hidden), dtype) if shared_gated else None]
        if hf:  # nn.Linear's gate and up: two tensors
            specs.append(TensorSpec((1, si, hidden), dtype))
    trace = trace_kernel(moe_decode_fwd, *specs, static_count=count, target=tgt, lnc=lnc,
                         transposed=(hf,) * 4)  # fmt: skip
    sets = parameter_sets(tgt) if band else [tgt]
    return tuple(estimate_trace(trace, t).latency_ns for t in sets)


@dataclass(frozen=True)
class DecodePricing:
    """Modeled latency (ns) of one decode-kernel launch, per parameter set (shipped first)."""

    latency_ns: tuple[float, ...]
    per_program: int  # touched experts of the busier program


def price_decode(
    touched: int, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    target: str | Target = "trn2", dtype: str = "bfloat16", lnc: int = 2,
    shared_inter: int = 0, shared_gated: bool = False, layout: str = "rows", band: bool = True,
) -> DecodePricing:  # fmt: skip
    """One launch for `touched` experts, with the fused shared expert when
    `shared_inter` > 0, weights in `layout` (module docstring); `band` False prices
    `target` alone (a caller that walks the parameter sets itself)."""
    tgt = get_target(target)
    per = math.ceil(touched / lnc)
    args = (tokens, hidden, inter, experts, top_k, dtype, tgt, lnc, shared_inter, shared_gated,
            layout, band)  # fmt: skip
    c0, c1 = anchors(per)
    base = _launch_latency(c0 * lnc, *args)
    if c1 is None:
        return DecodePricing(base, per)
    nxt = _launch_latency(c1 * lnc, *args)
    periods = (per - c0) / WINDOW
    lat = tuple(a + periods * (b - a) for a, b in zip(base, nxt))
    return DecodePricing(lat, per)


@functools.lru_cache(maxsize=64)
def router_latency(
    tokens: int, experts: int, top_k: int, tgt: Target, lnc: int = 2,
    scoring: str = "softmax", logits_dtype: str = "bfloat16", band: bool = True,
) -> tuple[float, ...]:  # fmt: skip
    """ns of our NKI router (moe/router.py) on [T, E] logits, renormalized top-k, per
    parameter set (`band` False: `tgt` alone)."""
    logits = TensorSpec((tokens, experts), logits_dtype)
    trace = trace_kernel(moe_router_fwd, logits, top_k, scoring, True, target=tgt, lnc=lnc)
    sets = parameter_sets(tgt) if band else [tgt]
    return tuple(estimate_trace(trace, t).latency_ns for t in sets)


@dataclass(frozen=True)
class SharedDecodeComparison:
    """A decode layer's experts with a shared expert: fused into the decode launch vs
    the decode launch of the routed experts plus the shared expert's own launches."""

    fused_us: float
    fused_band: tuple[float, float]
    unfused_us: float
    unfused_band: tuple[float, float]
    speedup: float  # unfused / fused
    speedup_band: tuple[float, float]
    shared_hbm: float  # the shared expert's weight bytes / the time the fused launch adds
    label: str  # to the routed-only one, at the logical core's HBM bandwidth


def shared_decode_comparison(
    touched: int, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
    shared_inter: int, shared_gated: bool, target: str | Target = "trn2",
    dtype: str = "bfloat16", lnc: int = 2, layout: str = "rows",
) -> SharedDecodeComparison:  # fmt: skip
    """Unfused = what `moe_gated_experts` would otherwise run for the shared expert: the
    routed experts' decode launch, then one-group `grouped_mm` launches (x S_gu, the
    activation on `expert_act`, h S_d; gated: x . g as a one-group grouped_mm with N = 1)
    and one native pass for out += gate * shared. SwiGLU, no biases. `layout` "hf":
    both launches read transformers' layouts (the routed experts and the shared
    expert's nn.Linear weights by DMA transposes); the shared expert's own launches are
    priced on row-major weights either way (what a transposing read would add to them
    is not), which favours the unfused side."""
    from ..baselines.native import price as price_native
    from ..bench.bands import widen_ratio
    from ..perfmodel import COST_MODEL_VERSION
    from .grouped_pricing import price_grouped_mm
    from .options_pricing import Options, _scale_add, price_expert_act

    tgt = get_target(target)
    base = (touched, tokens, hidden, inter, experts, top_k, tgt, dtype, lnc)
    routed = price_decode(*base, layout=layout)
    # the shared expert's time: two exactly traced launches at the same touched count
    # (the extrapolation's base), not two extrapolations -- their modeled per-expert
    # increments differ by ~1 % (the weight buffers' rotation phase), which the
    # extrapolation would multiply by the expert count
    c0 = anchors(routed.per_program)[0] * lnc
    args = (tokens, hidden, inter, experts, top_k, dtype, tgt, lnc)
    delta = [
        f - r
        for f, r in zip(
            _launch_latency(c0, *args, shared_inter, shared_gated, layout),
            _launch_latency(c0, *args, 0, False, layout),  # as price_decode's (cached)
        )
    ]
    fused = DecodePricing(
        tuple(r + d for r, d in zip(routed.latency_ns, delta)), routed.per_program
    )
    parts = [
        price_grouped_mm([tokens], hidden, 2 * shared_inter, tgt, dtype, lnc).latency_ns,
        price_expert_act(tokens, 2 * shared_inter, 1, "swiglu", False, tgt, dtype),
        price_grouped_mm([tokens], shared_inter, hidden, tgt, dtype, lnc).latency_ns,
    ]
    if shared_gated:
        parts.append(price_grouped_mm([tokens], hidden, 1, tgt, dtype, lnc).latency_ns)
    add = _scale_add(tokens, hidden, Options(shared_inter=shared_inter,
                                             shared_gated=shared_gated), dtype)  # fmt: skip
    sets = parameter_sets(tgt)
    unfused = [
        routed.latency_ns[i] + sum(p[i] for p in parts) + price_native([add], t).latency_ns
        for i, t in enumerate(sets)
    ]
    ratios = [u / f for u, f in zip(unfused, fused.latency_ns)]
    label = f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name})"
    shared_bytes = 3 * hidden * shared_inter * (2 if dtype != "float32" else 4)
    extra = delta[0]
    share = shared_bytes / (extra * lnc * tgt.hbm_bytes_per_ns) if extra > 0 else float("inf")
    f_us = [x / 1e3 for x in fused.latency_ns]
    u_us = [x / 1e3 for x in unfused]
    return SharedDecodeComparison(
        f_us[0], (min(f_us), max(f_us)), u_us[0], (min(u_us), max(u_us)),
        unfused[0] / fused.latency_ns[0], widen_ratio(min(ratios), max(ratios), tgt, label),
        share, label,
    )  # fmt: skip
