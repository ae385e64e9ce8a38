"""The comparison behind `make bench`: every kernel family against native lowering.

For each case the NKI kernel and the native-lowering composition (`baselines.native`)
are priced by the same cost model on the same target, so each line of the table is a
like-for-like modeled comparison. Nothing here is a measurement: every row carries
"modeled (cost model vN, target)".

Cases come in two sizes: the default set (a few minutes on a laptop-class CPU) and
`full=True`, the whole matrix of the issues' benchmark shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..baselines import native
from ..model_shapes import FINE_GRAINED_MOE, LLAMA3_8B_ATTN, MIXTRAL_8X7B_MOE, MoEShape
from ..perfmodel import modeled_label
from ..targets import get_target
from .rows import BenchRow

_DT = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def _native_row(
    family: str, op: str, case: str, target: str, steps: list[native.Step], useful_flops: float
) -> BenchRow:
    est = native.price(steps, target)
    peak = get_target(target).tensor_peak_flops_per_ns
    hbm = get_target(target).hbm_bytes_per_ns
    return BenchRow(
        family=family,
        op=op,
        case=case,
        target=target,
        impl="native",
        latency_us=est.latency_ns / 1e3,
        provenance=est.label,
        mfu=useful_flops / (est.latency_ns * peak) if useful_flops else None,
        hbm_fraction=est.hbm_bytes / hbm / est.latency_ns,
        bound_by="",
        extra={"steps": [[name, ns / 1e3] for name, ns in est.steps]},
    )


# ---- norms ------------------------------------------------------------------------------
_NORM_NATIVE = {
    ("rms_norm", "fwd"): native.rms_norm_fwd,
    ("rms_norm", "bwd"): native.rms_norm_bwd,
    ("add_rms_norm", "fwd"): native.add_rms_norm_fwd,
    ("layer_norm", "fwd"): native.layer_norm_fwd,
    ("layer_norm", "bwd"): native.layer_norm_bwd,
}


def norm_rows(
    tokens: Iterable[int], hiddens: Iterable[int], targets: Iterable[str]
) -> list[BenchRow]:
    """Fused norms vs the reduction + element-wise composition, bf16, one NeuronCore.

    The ops' backward is the backward kernel, plus the statistics kernel (recomputing
    rstd / mean from x) when the backward's config does not compute them itself; every
    kernel launched is counted. The native backward reuses the forward's saved
    statistics (no recompute), which favours native.
    """
    from ..norm import bench as nb

    rows = []
    for target in targets:
        for h in hiddens:
            for n in tokens:
                for (op, kind), build in _NORM_NATIVE.items():
                    parts = nb.op_parts(op, kind, n, h, target)
                    latency = sum(p.latency_us for p in parts)
                    bound = parts[0].bound_us
                    case = f"[{n}, {h}] bf16"
                    name = f"{op} {kind}"
                    rows.append(
                        BenchRow(
                            family="norm",
                            op=name,
                            case=case,
                            target=parts[0].target,
                            impl="nki",
                            latency_us=latency,
                            provenance=parts[0].label,
                            hbm_fraction=bound / latency,
                            bound_by=parts[0].busiest,
                            extra={"kernels": [[p.kernel, p.latency_us] for p in parts]},
                        )
                    )
                    rows.append(
                        _native_row(
                            "norm", name, case, parts[0].target, build(n, h, "bfloat16"), 0.0
                        )
                    )
    return rows


# ---- attention -----------------------------------------------------------------------
def attention_rows(seqs: Iterable[int], targets: Iterable[str], backward: bool) -> list[BenchRow]:
    """Flash attention (Llama-3 8B heads, B = 1, bf16) vs S = QK^T, softmax, PV steps."""
    from ..attention import bench as attn

    shape = LLAMA3_8B_ATTN
    rows = []
    for target in targets:
        for seq in seqs:
            for causal in (False, True):
                for op in ("fwd", "bwd") if backward else ("fwd",):
                    r = attn.price(op, seq, target, causal, shape=shape)
                    name = f"flash_attention {op}" + (" causal" if causal else "")
                    case = (
                        f"B=1 H={shape.num_heads}/{shape.num_kv_heads} S={seq} "
                        f"D={shape.head_dim} bf16"
                    )
                    rows.append(
                        BenchRow(
                            family="attention",
                            op=name,
                            case=case,
                            target=r.target,
                            impl="nki",
                            latency_us=r.latency_us,
                            provenance=r.label,
                            mfu=r.mfu,
                            bound_by=r.busiest,
                            extra={"pricing": r.pricing, "config": r.config},
                        )
                    )
                    build = native.attention_fwd if op == "fwd" else native.attention_bwd
                    steps = build(1, shape.num_heads, seq, seq, shape.head_dim, "bfloat16")
                    flops = attn.useful_flops(
                        op, seq, seq, shape.head_dim, shape.num_heads, 1, causal
                    )
                    rows.append(_native_row("attention", name, case, r.target, steps, flops))
    return rows


# ---- MoE --------------------------------------------------------------------------------
def moe_rows(
    shapes: Iterable[MoEShape],
    tokens: Iterable[int],
    targets: Iterable[str],
    routings: Iterable[str],
) -> list[BenchRow]:
    """Blockwise MoE forward vs the capacity-padded per-expert composition.

    Native capacity: GShard's 1.25 x the balanced share for uniform routing; under skewed
    routing a static-shape composition that drops no token needs capacity T per expert.
    """
    from ..moe.pricing import layer_row

    rows = []
    for target in targets:
        for shape in shapes:
            for t in tokens:
                for routing in routings:
                    r = layer_row(shape, t, routing, target)
                    name = f"moe_mlp fwd {routing}"
                    case = (
                        f"{shape.model} T={t} H={shape.hidden} I={shape.intermediate} "
                        f"E={shape.num_experts} top-{shape.top_k} bf16"
                    )
                    rows.append(
                        BenchRow(
                            family="moe",
                            op=name,
                            case=case,
                            target=r["target"],
                            impl="nki",
                            latency_us=r["latency_ms"] * 1e3,
                            provenance=r["label"],
                            mfu=r["mfu_routed_pct"] / 100.0,
                            bound_by=r["busiest_engine"],
                            extra={"blocks": r["blocks"], "config": r["config"]},
                        )
                    )
                    cf = 1.25 if routing == "uniform" else shape.num_experts / shape.top_k
                    steps = native.moe_fwd(
                        t,
                        shape.hidden,
                        shape.intermediate,
                        shape.num_experts,
                        shape.top_k,
                        "bfloat16",
                        capacity_factor=cf,
                    )
                    flops = 2.0 * t * shape.top_k * 3 * shape.hidden * shape.intermediate
                    rows.append(_native_row("moe", name, case, r["target"], steps, flops))
    return rows


@dataclass(frozen=True)
class Suite:
    """One family's part of the comparison: a name and a function producing its rows."""

    name: str
    rows: Callable[[bool], list[BenchRow]]


def _attention_suite(full: bool) -> list[BenchRow]:
    seqs = (2048, 8192, 32768) if full else (2048, 8192)
    return attention_rows(seqs, ("trn2", "trn3") if full else ("trn2",), backward=True)


def _moe_suite(full: bool) -> list[BenchRow]:
    tokens = (512, 4096, 16384) if full else (4096,)
    routings = ("uniform", "skewed")
    targets = ("trn2", "trn3") if full else ("trn2",)
    return moe_rows((MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE), tokens, targets, routings)


def _norm_suite(full: bool) -> list[BenchRow]:
    tokens = (2048, 8192, 32768) if full else (16384,)
    targets = ("trn2", "trn3") if full else ("trn2",)
    return norm_rows(tokens, (4096, 8192), targets)


SUITES: dict[str, Suite] = {
    "norm": Suite("norm", _norm_suite),
    "attention": Suite("attention", _attention_suite),
    "moe": Suite("moe", _moe_suite),
}


def label_note(target: str) -> str:
    return f"All figures {modeled_label(target)}; none is a hardware measurement."


__all__ = ["SUITES", "Suite", "attention_rows", "label_note", "moe_rows", "norm_rows"]
