"""Modeled cost of an MoE layer with the expert options (biases, GPT-OSS's clamped
SwiGLU, GeGLU, a shared expert) on `moe_gated_experts` vs the native composition.

Per physical core (LNC 2: half the tokens each), bf16:

- native: TorchNeuron's `aten::_grouped_mm` composition (`baselines.moe_native.
  grouped_mm_fwd`: router, the two grouped GEMMs on 128-row groups, the activation) with
  the row gather and the combine as ONE launch each over all routed rows (an
  index_select and an index_add_; moe_native prices them per group) and the option's
  elementwise work priced as ONE fused pass per group (the compiler fusing the whole
  chain: both favourable to native): gate / up bias as
  a per-column vector and the clamped SwiGLU's ops in the activation pass, the down bias
  in the combine pass; a shared expert as dense matmuls over all T tokens plus one fused
  activation pass (and, gated, a [T, H] x [H, 1] matmul and a sigmoid-scale pass);
- ours: what `moe_gated_experts` runs: the router priced as native's step, the row
  gather into expert order and the weighted combine as one launch each of the NKI
  `moe_dispatch` / `moe_combine` kernels (`gather_pricing`; they replace native's
  per-group gathers, combine passes and scatters), the GEMMs on our grouped_mm kernel
  (`grouped_pricing.price_grouped_mm`), the activation and each bias as our `expert_act`
  kernel over all routed rows (the down bias is a pass of its own), the shared expert as
  one-group grouped_mm launches with its expert_act, its gate a one-group grouped_mm
  with N = 1; the torch ops the layer runs on [T, H] between its launches as native
  steps (`ours_glue_steps`: the shared output's fp32 cast, gate scale and add, the
  combine's fp32 output cast to the layer's dtype).

Bands: the range over the cost model's parameter sets. Every figure is "modeled (cost
model vN, target)", never a measurement.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ..baselines import moe_native, steps
from ..baselines.native import F32, Step
from ..baselines.native import price as price_native
from ..bench.bands import parameter_sets, widen_ratio
from ..interp import TensorSpec
from ..perfmodel import COST_MODEL_VERSION, estimate_trace, trace_kernel
from ..targets import Target, get_target
from .expert_act import expert_act_fwd
from .gather_pricing import dispatch_combine_traces
from .grouped_pricing import GEMM_STEPS, price_grouped_mm

# the fused chain's passes over a [rows, I] tile (ScalarE, VectorE): representative counts
ACT_PASSES = {
    "swiglu": (1, 1),  # silu(g) ; * u
    "geglu": (1, 1),  # gelu(g) ; * u
    "gpt_oss": (1, 5),  # sigmoid(alpha g) ; + biases, min, clamp, + 1 / *, *
}


@dataclass(frozen=True)
class Options:
    """The expert options of one priced layer."""

    activation: str = "swiglu"
    biases: bool = False
    shared_inter: int = 0  # shared expert's intermediate size (0: none)
    shared_gated: bool = False


@dataclass(frozen=True)
class OptionsComparison:
    native_us: float
    ours_us: float
    speedup: float
    speedup_band: tuple[float, float]
    native_option_us: float  # the option's elementwise work (activation, biases, shared)
    ours_option_us: float
    label: str


def _t(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(shape, dtype)


def native_steps(
    tokens: int, hidden: int, inter: int, experts: int, counts: Sequence[int], o: Options,
    dtype: str = "bfloat16",
) -> list[Step]:  # fmt: skip
    """The native composition with the options (module docstring)."""
    out = []
    sc, vc = ACT_PASSES[o.activation]
    for st in moe_native.grouped_mm_fwd(tokens, hidden, inter, experts, dtype, counts):
        if _is_gather_or_combine(st.name):
            continue  # one launch each over all routed rows, below
        if st.name == "silu(g) * u":
            rows = st.args[0].shape[0]
            bias = _t((inter,), dtype) if o.biases else None
            args = (_t((rows, inter), dtype), _t((rows, inter), dtype), None, bias, sc, vc, dtype)
            st = Step(f"{o.activation} (+ biases)", steps.stream_rows, args, st.repeat)
        out.append(st)
    out += _native_gathers(tokens, hidden, int(sum(counts)), o, dtype)
    if o.shared_inter:
        out += _native_shared(tokens, hidden, o, dtype)
    return out


def _native_gathers(tokens: int, hidden: int, rows: int, o: Options, dtype: str) -> list[Step]:
    """The row gather into expert order and the combine (gather the tokens' out rows, add
    w * y, scatter them back) as ONE launch each over all `rows` routed rows (unpadded):
    `baselines.moe_native` prices them per expert group, which a composition written
    with one index_select / index_add_ does not pay (favourable to native)."""
    idx = _t((rows, 1), "int32")
    x = _t((tokens, hidden), dtype)
    y = _t((rows, hidden), dtype)
    w = _t((rows, 1), F32)
    if o.biases:  # the down bias fused into the combine pass
        combine = Step("out += w * (y + b_down)", steps.stream_rows,
                       (y, y, w, _t((hidden,), dtype), 0, 1, dtype))  # fmt: skip
    else:
        combine = Step("out += w * y", steps.stream_rows, (y, y, w, None, 0, 0, dtype))
    return [
        Step("gather token rows", steps.gather_rows, (x, idx)),
        Step("gather out rows", steps.gather_rows, (x, idx)),
        combine,
        Step("scatter out rows", steps.gather_rows, (y, idx)),
    ]


def _native_shared(tokens: int, hidden: int, o: Options, dtype: str) -> list[Step]:
    i = o.shared_inter
    sc, vc = ACT_PASSES[o.activation]
    xt = _t((hidden, tokens), dtype)
    out = [
        Step("shared x W_gate_up", steps.matmul_step, (xt, _t((hidden, 2 * i), dtype), dtype)),
        Step("shared act", steps.stream_rows,
             (_t((tokens, i), dtype), _t((tokens, i), dtype), None, None, sc, vc, dtype)),
        Step("shared h W_down", steps.matmul_step,
             (_t((i, tokens), dtype), _t((i, hidden), dtype), dtype)),
    ]  # fmt: skip
    if o.shared_gated:
        out.append(Step("shared gate x w", steps.matmul_step, (xt, _t((hidden, 1), dtype), dtype)))
    out.append(_scale_add(tokens, hidden, o, dtype))
    return out


def _scale_add(tokens: int, hidden: int, o: Options, dtype: str) -> Step:
    """out += sigmoid(gate) * shared (ungated: out += shared): one pass over [T, H]."""
    x = _t((tokens, hidden), dtype)
    gate = _t((tokens, 1), F32) if o.shared_gated else None
    return Step("out += g * shared", steps.stream_rows, (x, x, gate, None, 1, 1, dtype))


@functools.lru_cache(maxsize=64)
def price_expert_act(
    rows: int, width: int, groups: int, activation: str, bias: bool, tgt: Target,
    dtype: str = "bfloat16",
) -> tuple[float, ...]:  # fmt: skip
    """ns of one `expert_act_fwd` launch over `rows` x `width` inputs, per parameter set."""
    specs = [_t((rows, width), dtype), _t((groups, width), dtype) if bias else None]
    specs.append(_t((rows, 1), "int32"))
    trace = trace_kernel(expert_act_fwd, *specs, activation, activation == "gpt_oss",
                         1.702, 7.0, target=tgt)  # fmt: skip
    return tuple(estimate_trace(trace, t).latency_ns for t in parameter_sets(tgt))


OPTION_LAUNCHES = ("act", "down bias", "shared act")  # our launches of the option's work


def _ours_extra(
    tokens: int, hidden: int, inter: int, counts: Sequence[int], o: Options, tgt: Target,
    dtype: str,
) -> dict[str, tuple[float, ...]]:  # fmt: skip
    """Per parameter set, the ns of each launch of ours that replaces native steps."""
    m, g = int(sum(counts)), len(counts)
    parts = {
        "gate_up": price_grouped_mm(counts, hidden, 2 * inter, tgt, dtype).latency_ns,
        "down": price_grouped_mm(counts, inter, hidden, tgt, dtype).latency_ns,
        "act": price_expert_act(m, 2 * inter, g, o.activation, o.biases, tgt, dtype),
    }
    if o.biases:
        parts["down bias"] = price_expert_act(m, hidden, g, "none", True, tgt, dtype)
    if o.shared_inter:
        i = o.shared_inter
        parts["shared gate_up"] = price_grouped_mm([tokens], hidden, 2 * i, tgt, dtype).latency_ns
        parts["shared down"] = price_grouped_mm([tokens], i, hidden, tgt, dtype).latency_ns
        parts["shared act"] = price_expert_act(tokens, 2 * i, 1, o.activation, False, tgt, dtype)
        if o.shared_gated:
            parts["shared gate"] = price_grouped_mm([tokens], hidden, 1, tgt, dtype).latency_ns
    return parts


def _is_gather_or_combine(name: str) -> bool:
    """Native's per-group row gathers, combine passes and scatters (ours: one NKI launch
    each for the dispatch and the combine)."""
    return name.startswith(("gather ", "scatter ", "out += w * "))


@functools.lru_cache(maxsize=64)
def price_dispatch_combine_sets(
    tokens: int, hidden: int, top_k: int, tgt: Target, dtype: str = "bfloat16"
) -> tuple[float, ...]:
    """ns of our dispatch + combine launches (`gather_pricing`), per parameter set."""
    traces = dispatch_combine_traces(tokens, hidden, top_k, tgt, dtype)
    return tuple(sum(estimate_trace(tr, t).latency_ns for tr in traces)
                 for t in parameter_sets(tgt))  # fmt: skip


def ours_glue_steps(tokens: int, hidden: int, o: Options, dtype: str) -> list[Step]:
    """The torch ops `moe_gated_experts` runs on [T, H] outside its NKI launches (native
    steps under TorchNeuron): with a shared expert, its output cast to fp32, (gated)
    scaled by sigmoid(logit) and added to the combine's fp32 output; then that output
    cast to the layer's dtype."""
    f, x = _t((tokens, hidden), F32), _t((tokens, hidden), dtype)
    out = []
    if o.shared_inter:
        out.append(Step("shared.to(fp32)", steps.stream_rows, (x, None, None, None, 0, 1, F32)))
        if o.shared_gated:
            gate = _t((tokens, 1), F32)
            out.append(Step("sigmoid(logit) * shared", steps.stream_rows,
                            (f, None, gate, None, 1, 1, F32)))  # fmt: skip
        out.append(Step("out + shared", steps.stream_rows, (f, f, None, None, 0, 1, F32)))
    out.append(Step("out.to(dtype)", steps.stream_rows, (f, None, None, None, 0, 1, dtype)))
    return out


REPLACED = {"x W_gate_up", "h W_down", "shared x W_gate_up", "shared h W_down", "shared act",
            "shared gate x w", "out += w * (y + b_down)", "out += g * shared"}  # fmt: skip


def options_comparison(
    tokens: int, hidden: int, inter: int, experts: int, counts: Sequence[int], o: Options,
    target: str = "trn2", dtype: str = "bfloat16",
) -> OptionsComparison:  # fmt: skip
    """One physical core's share (`tokens`, `counts`) of the layer forward."""
    tgt = get_target(target)
    nat_steps = native_steps(tokens, hidden, inter, experts, counts, o, dtype)
    extra = _ours_extra(tokens, hidden, inter, counts, o, tgt, dtype)
    top_k = int(sum(counts)) // tokens
    moved = price_dispatch_combine_sets(tokens, hidden, top_k, tgt, dtype)
    glue = ours_glue_steps(tokens, hidden, o, dtype)
    ratios, shipped = [], (0.0, 0.0, 0.0, 0.0)
    for idx, t in enumerate(parameter_sets(tgt)):
        nat = price_native(nat_steps, t)
        replaced = sum(
            ns for name, ns in nat.steps
            if name in REPLACED or name in GEMM_STEPS or _is_gather_or_combine(name)
            or name.startswith(o.activation)
        )  # fmt: skip
        ours_glue = price_native(glue, t)
        ours = nat.latency_ns - replaced + moved[idx] + sum(p[idx] for p in extra.values())
        ours += ours_glue.latency_ns
        ratios.append(nat.latency_ns / ours)
        if idx == 0:
            opt_names = {"shared act", "out += g * shared", "out += w * (y + b_down)"}
            nat_opt = sum(ns for name, ns in nat.steps
                          if name in opt_names or name.startswith(o.activation))  # fmt: skip
            ours_opt = sum(extra[n][idx] for n in OPTION_LAUNCHES if n in extra)
            ours_opt += sum(ns for name, ns in ours_glue.steps if name != "out.to(dtype)")
            shipped = (nat.latency_ns, ours, nat_opt, ours_opt)
    label = f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name})"
    nat_ns, ours_ns, nat_opt_ns, ours_opt_ns = shipped
    band = widen_ratio(min(ratios), max(ratios), tgt, label)
    return OptionsComparison(
        nat_ns / 1e3, ours_ns / 1e3, nat_ns / ours_ns, band,
        nat_opt_ns / 1e3, ours_opt_ns / 1e3, label,
    )  # fmt: skip


def fused_shared_us(
    tokens: int, hidden: int, inter: int, experts: int, counts: Sequence[int], o: Options,
    target: str = "trn2", dtype: str = "bfloat16",
) -> tuple[float, tuple[float, float]]:  # fmt: skip
    """Our layer (us, shipped set; band) with the shared expert in the routed launches:
    stacked as shared_inter / inter more experts of width I (a SwiGLU / GeGLU expert is a
    sum over slices of its intermediate dim), each routed every token (weight 1 or the
    sigmoid gate, whose [T, 1] logits are a one-group grouped_mm); the router native's
    step, the dispatch and combine our NKI launches for the k + n columns."""
    if not o.shared_inter or o.shared_inter % inter or o.biases:
        raise ValueError("fused_shared_us: a bias-free shared expert of a multiple of I")
    tgt = get_target(target)
    n = o.shared_inter // inter
    counts_f = [*counts, *([tokens] * n)]
    steps_f = moe_native.grouped_mm_fwd(tokens, hidden, inter, experts + n, dtype, counts_f)
    kept = [s for s in steps_f if s.name not in GEMM_STEPS and s.name != "silu(g) * u"
            and not _is_gather_or_combine(s.name)]  # fmt: skip
    top_k = int(sum(counts)) // tokens
    ours = [
        price_dispatch_combine_sets(tokens, hidden, top_k + n, tgt, dtype),
        price_grouped_mm(counts_f, hidden, 2 * inter, tgt, dtype).latency_ns,
        price_grouped_mm(counts_f, inter, hidden, tgt, dtype).latency_ns,
        price_expert_act(int(sum(counts_f)), 2 * inter, experts + n, o.activation, False, tgt,
                         dtype),
    ]  # fmt: skip
    if o.shared_gated:
        ours.append(price_grouped_mm([tokens], hidden, 1, tgt, dtype).latency_ns)
    kept += ours_glue_steps(tokens, hidden, Options(), dtype)  # the combine's fp32 cast
    totals = [
        price_native(kept, t).latency_ns + sum(p[idx] for p in ours)
        for idx, t in enumerate(parameter_sets(tgt))
    ]
    return totals[0] / 1e3, (min(totals) / 1e3, max(totals) / 1e3)
