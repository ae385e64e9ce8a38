"""MoE layer backward against TorchNeuron's `_grouped_mm` backward, per core, with bands.

Run: `python benchmarks/bench_moe_bwd_native.py [--tokens 2048] [--only MODEL,...]
[--routing uniform,skewed] [--forward] [--json PATH] [--no-bands] [--full]`
(`--no-bands`: the base parameter set only; `--full`: no extrapolation, every plan traced
in full): Qwen3-MoE-like, the 64-expert
shape and GPT-OSS-like take 2-4 min of CPU each (both routings); Mixtral and
DeepSeek-V3-like over 15 min each (their traces of 4, 6 and 8 blocks re-scheduled under
every parameter set).

Ours = the op's backward as `moe.pricing.layer_row` prices it at LNC 1: router
recompute + `moe_mlp_bwd` (phase A reading the gate / up the training forward saved,
weight gradients, combine) + router backward. `--forward` also prices the forward's
expert kernel at inference (nothing saved) and in training (gate / up saved), at the
base parameters only (no band): the save's cost.
Native = autograd's backward of the dropless `_grouped_mm` MoE
(`ledger/native_moe.grouped_mm_bwd`: per 128-aligned expert group the dH, dW_down, dX,
dW_gate_up matmuls, the SwiGLU derivative pass, gathers and scatters, then the router's
softmax backward). `--tokens` is the per-core token count: 2048 = T 4096 at LNC 2 priced
as two cores of 2048 tokens at LNC 1, the ledger's convention. Routing: 'uniform'
(exactly balanced), 'skewed' (every token's first choice is expert 0).

Bands: each side's latency over the cost model's parameter sets (`perfmodel.band`: the
kernel traces are made once and re-scheduled per set, the backward traced in full or
extrapolated per set exactly as `moe.pricing.price_blocks` does), and the speedup's band with
`bench.bands.ratio_band` (the same set on both sides, widened by two figures'
structural error). Every figure is "modeled (cost model vN, trn2)", none a measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nki_kernels.baselines import native
from nki_kernels.bench.bands import ratio_band
from nki_kernels.bench.compare import expert_counts
from nki_kernels.ledger import native_moe
from nki_kernels.model_shapes import (
    DEEPSEEK_V3_LIKE_MOE,
    FINE_GRAINED_MOE,
    GPT_OSS_LIKE_MOE,
    MIXTRAL_8X7B_MOE,
    QWEN3_MOE_LIKE_MOE,
    MoEShape,
)
from nki_kernels.moe import pricing
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd
from nki_kernels.moe.config import MoEMLPBwdConfig, MoEMLPConfig, MoEProblem
from nki_kernels.perfmodel import COST_MODEL_VERSION, modeled_label
from nki_kernels.perfmodel.api import estimate_trace, trace_kernel
from nki_kernels.perfmodel.band import parameter_sets
from nki_kernels.targets import get_target

SHAPES = (
    MIXTRAL_8X7B_MOE,
    FINE_GRAINED_MOE,
    DEEPSEEK_V3_LIKE_MOE,
    QWEN3_MOE_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
)


def rows(
    shape: MoEShape,
    tokens: int,
    target: str = "trn2",
    routings: tuple[str, ...] = ("uniform", "skewed"),
    forward: bool = False,
    bands: bool = True,
    full: bool = False,
) -> list[dict[str, Any]]:
    """The rows of one shape (`routings`; `forward`: also the forward's save cost;
    `bands`: False prices the base parameter set only; `full`: every plan traced in full,
    never extrapolated)."""
    tgt = get_target(target)
    sets = [tgt, *parameter_sets(tgt)] if bands else [tgt]
    p = MoEProblem(tokens, shape.hidden, shape.intermediate, shape.num_experts, shape.top_k,
                   "bfloat16")  # fmt: skip
    cfg = MoEMLPBwdConfig.heuristic(p, tgt)
    traces: dict[int, Any] = {}
    out = []
    for kind in routings:
        t0 = time.perf_counter()
        ids = pricing.routing_ids(kind, tokens, shape.num_experts, shape.top_k)
        blocks = pricing.used_blocks(ids, shape.num_experts, cfg.block_size)

        def trace(n: int) -> Any:
            if n not in traces:
                specs = pricing._bwd_specs(p, n, cfg.block_size)
                fields = cfg.to_dict().values()
                traces[n] = trace_kernel(moe_mlp_bwd, *specs, n, True, *fields, target=tgt)
            return traces[n]

        n0 = pricing.REPRESENTATIVE_BLOCKS["bwd"]
        count = len(trace(n0).instrs) if blocks > n0 + pricing.BWD_WINDOW and not full else None
        ns = [blocks] if full else pricing.bwd_trace_blocks(blocks, count)
        for n in ns:
            trace(n)
        counts = expert_counts(kind, tokens, shape.num_experts, shape.top_k)
        steps = native_moe.grouped_mm_bwd(
            tokens, shape.hidden, shape.intermediate, shape.num_experts, "bfloat16", counts
        )
        ours, theirs = [], []
        for t in sets:
            mlp = pricing.bwd_extrapolate(
                [estimate_trace(traces[n], t).latency_ns for n in ns], blocks
            )
            routers = (
                pricing.price_router(p, t).latency_ns + pricing.price_router_bwd(p, t).latency_ns
            )
            ours.append((mlp + routers) / 1e6)
            theirs.append(native.price(steps, t).latency_ns / 1e6)
        row: dict[str, Any] = {}
        if forward:
            row = _forward_cost(p, ids, shape, cfg, tgt)
        out.append({
            "label": modeled_label(tgt.name, COST_MODEL_VERSION),
            "model": shape.model,
            "tokens": tokens,
            "routing": kind,
            "bwd_config": cfg.to_dict(),
            "blocks": blocks,
            "ours_ms": ours[0],
            "ours_band_ms": [min(ours[1:]), max(ours[1:])] if bands else None,
            "native_ms": theirs[0],
            "native_band_ms": [min(theirs[1:]), max(theirs[1:])] if bands else None,
            "speedup": theirs[0] / ours[0],
            "speedup_band": list(ratio_band(ours[1:], theirs[1:], tgt)) if bands else None,
            "traced_in_full": len(ns) == 1,
            "seconds": round(time.perf_counter() - t0),
            **row,
        })  # fmt: skip
    return out


def _forward_cost(
    p: MoEProblem, ids: Any, shape: MoEShape, bcfg: MoEMLPBwdConfig, tgt: Any
) -> dict[str, Any]:
    """The forward expert kernel at inference and as training runs it (gate / up saved
    for this backward's plan), base parameters only: ms and the save's share."""
    cfg = MoEMLPConfig.heuristic(p, tgt)
    kinds = pricing.used_kinds(ids, shape.num_experts, cfg.block_size)
    save = pricing.save_plan(ids, shape.num_experts, (cfg.block_size, bcfg.block_size))
    infer = pricing.price_fwd_kinds(p, cfg, kinds, tgt).latency_ns / 1e6
    train = pricing.price_fwd_kinds(p, cfg, kinds, tgt, save=save).latency_ns / 1e6
    return {"fwd_infer_ms": infer, "fwd_train_ms": train, "save_holes": save[0]}


def _band(band: list[float] | None, fmt: str = ".1f") -> str:
    return "" if band is None else f" ({band[0]:{fmt}}-{band[1]:{fmt}})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per core (default 2048)")
    ap.add_argument("--only", help="comma-separated model names (default: all five)")
    ap.add_argument("--routing", default="uniform,skewed", help="comma-separated routings")
    ap.add_argument("--forward", action="store_true", help="also the forward's save cost")
    ap.add_argument("--json", help="append the rows to this file (JSON lines)")
    ap.add_argument("--no-bands", action="store_true", help="base parameter set only")
    ap.add_argument("--full", action="store_true", help="trace every plan in full")
    args = ap.parse_args()
    routings = tuple(args.routing.split(","))
    only = set(args.only.split(",")) if args.only else None
    print(f"MoE backward, {modeled_label('trn2', COST_MODEL_VERSION)}; not a measurement")
    print("| model | routing | blocks | ours ms (band) | native ms (band) | speedup (band) |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in SHAPES:
        if only is not None and shape.model not in only:
            continue
        kw = {"routings": routings, "forward": args.forward}
        for r in rows(shape, args.tokens, bands=not args.no_bands, full=args.full, **kw):
            print(
                f"| {r['model']} | {r['routing']} | {r['blocks']} of "
                f"{r['bwd_config']['block_size']} | {r['ours_ms']:.1f}{_band(r['ours_band_ms'])}"
                f" | {r['native_ms']:.1f}{_band(r['native_band_ms'])} | {r['speedup']:.2f}x"
                f"{_band(r['speedup_band'], '.2f')} |",
                flush=True,
            )
            if args.forward:
                print(
                    f"  forward expert kernel: inference {r['fwd_infer_ms']:.2f} ms, training "
                    f"(gate / up saved) {r['fwd_train_ms']:.2f} ms",
                    flush=True,
                )
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
