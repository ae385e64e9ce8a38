"""MoE expert backward at LNC 1 vs LNC 2: modeled latency of one launch (trace-only).

Run: `python benchmarks/bench_moe_bwd_lnc.py [--blocks N] [--target trn2] [--json PATH]`.

At LNC 2 the two programs of `moe_mlp_bwd` split the blocks of phase A (recompute,
dgrad; alternate blocks), then the hidden columns of the weight gradients, then the
combine's token tiles: see `nki_kernels/moe/blockwise_mlp_bwd.py`. This prices the
kernel with `--blocks` used blocks (all static) at the heuristic config, at LNC 1 and
LNC 2, with `nki_kernels.moe.pricing.price_blocks` (exact traces up to a few blocks,
extrapolated beyond). Every figure is "modeled (cost model vN, target)"; none is a
measurement. The cost model prices an LNC 2 launch as its slower program.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nki_kernels.model_shapes import MOE_SHAPES
from nki_kernels.moe.config import MoEMLPBwdConfig, MoEProblem
from nki_kernels.moe.pricing import price_blocks
from nki_kernels.perfmodel import COST_MODEL_VERSION, modeled_label
from nki_kernels.targets import get_target


def row(shape: Any, tokens: int, blocks: int, target: str) -> dict[str, Any]:
    """LNC 1 and LNC 2 latency of the backward with `blocks` used blocks (modeled)."""
    p = MoEProblem(tokens, shape.hidden, shape.intermediate, shape.num_experts, shape.top_k,
                   "bfloat16")  # fmt: skip
    cfg = MoEMLPBwdConfig.heuristic(p, get_target(target))
    out: dict[str, Any] = {
        "model": shape.model,
        "tokens": tokens,
        "blocks": blocks,
        "target": target,
        "config": cfg.to_dict(),
        "label": modeled_label(target, COST_MODEL_VERSION),
    }
    for lnc in (1, 2):
        priced = price_blocks("bwd", p, cfg, blocks, get_target(target), True, lnc)
        out[f"lnc{lnc}_us"] = priced.latency_ns / 1e3
    out["speedup"] = out["lnc1_us"] / out["lnc2_us"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2, help="used blocks priced (default 2)")
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    rows = []
    print(f"moe_mlp_bwd, {modeled_label(args.target, COST_MODEL_VERSION)}; not a measurement")
    print("| model | T | blocks | LNC 1 (us) | LNC 2 (us) | LNC 1 / LNC 2 |")
    print("|---|---|---|---|---|---|")
    for shape in MOE_SHAPES:
        t0 = time.perf_counter()
        r = row(shape, args.tokens, args.blocks, args.target)
        rows.append(r)
        print(f"| {r['model']} | {r['tokens']} | {r['blocks']} | {r['lnc1_us']:,.1f} | "
              f"{r['lnc2_us']:,.1f} | {r['speedup']:.2f}x |  ({time.perf_counter() - t0:.0f} s)",
              flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
