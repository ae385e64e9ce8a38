"""The fused MoE layer forward (router + `moe_mlp_fwd` + combine) reading the experts'
weights in the parameters' layouts (transformers' [E, 2I, H] / [E, H, I], TorchTitan's
w1 / w3 / w2: DMA-transposing loads, `moe/param_layout.py`) against the row-major
[E, H, 2I] / [E, I, H] launch, and the per-call copy the in-place read removes.

Run: `python benchmarks/bench_moe_param_layout.py [--only mixtral-8x7b] [--no-bands]
[--json rows.json]` (one model per run keeps it under 10 minutes on this machine).

T = 4096 tokens, uniform routing, bf16, LNC 2, trn2, the heuristic config, priced as
`bench_moe_fused.py` prices its rows (`pricing.price_fwd_kinds`, per-size extrapolation;
`transposed` selects the layout) plus our NKI router. Copy = the row-major copy of every
expert's gate/up/down weights the former path made on each layer call (read and
written: 2 x 3 x E x H x I x 2 bytes) at the logical core's HBM bandwidth -- a roofline
bound, not a cost-model figure. Every latency is "modeled (cost model vN, target)";
"sets" = the range over the cost model's parameter sets (`bench.bands`).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nki_kernels.bench.bands import parameter_sets, replayed_traces
from nki_kernels.model_shapes import FINE_GRAINED_MOE, MIXTRAL_8X7B_MOE, MoEShape
from nki_kernels.moe.config import MoEMLPConfig, MoEProblem
from nki_kernels.moe.pricing import price_fwd_kinds, price_router, routing_ids, used_kinds
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target

SHAPES = (MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE)
TOKENS, LNC = 4096, 2
LAYOUTS = {"row-major": (False, False), "parameters'": (True, True)}


def copy_bound_us(shape: MoEShape, target: str) -> float:
    """The former per-call weight copy (read + write of gate/up/down, bf16) at the
    logical core's HBM bandwidth (LNC x the per-core share), in us."""
    moved = 2 * 3 * shape.num_experts * shape.hidden * shape.intermediate * 2
    return moved / (LNC * get_target(target).hbm_bytes_per_ns) / 1e3


def layout_row(shape: MoEShape, target: str, bands: bool = True) -> dict[str, Any]:
    """The layer forward per layout (us, per parameter set) and the copy bound."""
    tgt = get_target(target)
    e, k = shape.num_experts, shape.top_k
    p = MoEProblem(TOKENS, shape.hidden, shape.intermediate, e, k, "bfloat16")
    cfg = MoEMLPConfig.heuristic(p, tgt)
    kinds = used_kinds(routing_ids("uniform", TOKENS, e, k), e, cfg.block_size)
    layer: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with replayed_traces():  # each set re-schedules the first set's traces
        for t in parameter_sets(tgt) if bands else [tgt]:
            router = price_router(p, t, lnc=LNC).latency_ns
            for name, transposed in LAYOUTS.items():
                mlp = price_fwd_kinds(p, cfg, kinds, t, lnc=LNC, transposed=transposed)
                layer[name].append((mlp.latency_ns + router) / 1e3)
    ratios = [b / a for a, b in zip(layer["row-major"], layer["parameters'"])]
    return {
        "label": f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name}, LNC {LNC})",
        "model": shape.model,
        "tokens": TOKENS,
        "config": cfg.to_dict(),
        "row_major_us": layer["row-major"][0],
        "param_layout_us": layer["parameters'"][0],
        "ratio": ratios[0],
        "ratio_sets": [min(ratios), max(ratios)],
        "row_major_sets_us": [min(layer["row-major"]), max(layer["row-major"])],
        "param_layout_sets_us": [min(layer["parameters'"]), max(layer["parameters'"])],
        "copy_bound_us": copy_bound_us(shape, target),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--no-bands", action="store_true", help="the shipped parameter set only")
    ap.add_argument("--json", help="also write (append) the rows here")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if not args.only or s.model in args.only.split(",")]
    print(
        "| model | row-major (us) | parameters' layout (us) | ratio (sets) "
        "| former copy, roofline bound (us) |"
    )
    print("|---|---:|---:|---:|---:|")
    rows = []
    if args.json:
        try:
            with open(args.json) as f:
                rows = [r for r in json.load(f) if r["model"] not in {s.model for s in shapes}]
        except FileNotFoundError:
            pass
    for s in shapes:
        t0 = time.time()
        r = layout_row(s, args.target, bands=not args.no_bands)
        rows.append(r)
        lo, hi = r["ratio_sets"]
        print(
            f"| {s.model} | {r['row_major_us']:,.1f} | {r['param_layout_us']:,.1f} | "
            f"{r['ratio']:.3f}x ({lo:.3f}-{hi:.3f}) | {r['copy_bound_us']:,.0f} |",
            flush=True,
        )
        print(f"<!-- {time.time() - t0:.0f} s; {r['label']} -->", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
