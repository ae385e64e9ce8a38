"""Fused MoE forward (router + `moe_mlp_fwd` with variable-size blocks + combine) at LNC 2
against TorchNeuron's `aten::_grouped_mm` MoE composition, on five layer shapes.

Run: `python benchmarks/bench_moe_fused.py [--quick] [--target trn2] [--json rows.json]
[--only MODEL,...] [--routing uniform|skewed] [--no-bands] [--sets START:STOP]`
(prints a markdown table; ~3 min of CPU per row on a quiet machine).

Ours: one `kernel[2]` launch on the whole batch (per logical core), T = 4096, bf16, the
heuristic config, the forward's sized block plan (`moe/grouping.py`: each expert's rows in
near-equal blocks of whole 128-row sub-tiles), priced by per-size extrapolation
(`moe/pricing.py::price_fwd_kinds`), plus our NKI router. Native: TorchNeuron's
`_grouped_mm` composition (`baselines/moe_native.py` `grouped_mm_fwd`: router, gathers,
x W_gate_up, silu * up, h W_down, combine; 128-row groups) on one physical core's half
of the tokens. Routing "uniform" = exactly balanced, "skewed" = every token's first choice
is expert 0. Every figure is "modeled (cost model vN, target)"; none is a measurement.
Bands: "sets" = the speedup's range over the cost model's parameter sets (the same set on
both sides); "v3 band" = that range widened by the structural error of two modeled
figures (`bench.bands.ratio_band`), the README's band convention.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nki_kernels.baselines import moe_native
from nki_kernels.baselines.native import price as price_native
from nki_kernels.bench.bands import parameter_sets, ratio_band, replayed_traces
from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import MOE_MODEL_SHAPES, MoEShape
from nki_kernels.moe.config import MoEMLPConfig, MoEProblem
from nki_kernels.moe.pricing import price_fwd_kinds, price_router, routing_ids, used_kinds
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target

SHAPES = MOE_MODEL_SHAPES
TOKENS, LNC = 4096, 2


def fused_row(
    shape: MoEShape, routing: str, target: str, bands: bool = True, sets: slice = slice(None)
) -> dict[str, Any]:
    """One row: our fused layer vs the native composition, per parameter set (`bands`;
    else the shipped set only: "sets" is then that one ratio); `sets`: those parameter
    sets only (a piece of a long row: its per-set figures are in the row, and the pieces'
    ratios together give the band, `bench.bands.widen_ratio`)."""
    tgt = get_target(target)
    e, k = shape.num_experts, shape.top_k
    p = MoEProblem(TOKENS, shape.hidden, shape.intermediate, e, k, "bfloat16")
    cfg = MoEMLPConfig.heuristic(p, tgt)
    kinds = used_kinds(routing_ids(routing, TOKENS, e, k), e, cfg.block_size)
    part = TOKENS // LNC
    steps = moe_native.grouped_mm_fwd(
        part, shape.hidden, shape.intermediate, e, "bfloat16", expert_counts(routing, part, e, k)
    )
    ours, native, mlp0 = [], [], None
    with replayed_traces():  # each set re-schedules the first set's traces
        for t in parameter_sets(tgt)[sets] if bands else [tgt]:
            mlp = price_fwd_kinds(p, cfg, kinds, t, lnc=LNC)
            ours.append(mlp.latency_ns + price_router(p, t, lnc=LNC).latency_ns)
            native.append(price_native(steps, t).latency_ns)
            mlp0 = mlp0 or mlp
    assert mlp0 is not None
    ratios = [n / o for o, n in zip(ours, native)]
    return {
        "label": f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name}, LNC {LNC})",
        "model": shape.model,
        "routing": routing,
        "config": cfg.to_dict(),
        "block_rows": {str(128 * (len(kinds) - j)): c for j, c in enumerate(kinds) if c},
        "ours_us": ours[0] / 1e3,
        "native_us": native[0] / 1e3,
        "speedup": ratios[0],
        "speedup_sets": [min(ratios), max(ratios)],
        "speedup_band": list(ratio_band(ours, native, tgt)),
        "sets_us": {"ours": [o / 1e3 for o in ours], "native": [n / 1e3 for n in native]},
        "extrapolation_check": mlp0.extrapolation_check,
        "busiest_engine": mlp0.busiest,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Mixtral only")
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument(
        "--no-bands",
        action="store_true",
        help="shipped parameter set only (each set re-schedules every trace: ~10x the time)",
    )
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--sets", help="START:STOP, those parameter sets only (a piece of a row)")
    ap.add_argument(
        "--routing",
        choices=("uniform", "skewed"),
        help="one routing only (rows are independent: price long tables in pieces)",
    )
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.only:
        shapes = tuple(s for s in shapes if s.model in args.only.split(","))
    print(
        "| model | routing | blocks (rows: count) | ours (us) | native `_grouped_mm` (us) "
        "| speedup | sets | v3 band |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for s in shapes:
        for routing in (args.routing,) if args.routing else ("uniform", "skewed"):
            t0 = time.time()
            sets = slice(*(int(x) for x in args.sets.split(":"))) if args.sets else slice(None)
            r = fused_row(s, routing, args.target, bands=not args.no_bands, sets=sets)
            rows.append(r)
            blocks = ", ".join(f"{n}: {c}" for n, c in r["block_rows"].items())
            (slo, shi), (blo, bhi) = r["speedup_sets"], r["speedup_band"]
            print(
                f"| {s.model} | {routing} | {blocks} | {r['ours_us']:,.1f} | "
                f"{r['native_us']:,.1f} | {r['speedup']:.3f}x | {slo:.3f}-{shi:.3f} | "
                f"{blo:.2f}-{bhi:.2f} |",
                flush=True,
            )
            print(f"<!-- {time.time() - t0:.0f} s; {r['label']} -->", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
