"""grouped_mm benchmark: an MoE layer forward through `aten::_grouped_mm` on TorchNeuron
vs the same composition with the two grouped GEMMs on `torch.ops.nki.grouped_mm`.

Run: `python benchmarks/bench_grouped_mm.py [--quick]` (prints a markdown table; ~5 min).

What is compared (per physical core at LNC 2: half the tokens each, T = 4096 in all, bf16,
trn2): `baselines.moe_native.grouped_mm_fwd` -- TorchNeuron's `_grouped_mm` MoE
composition (router, gathers, x W_gate_up, silu * up, h W_down, combine; 128-row groups)
-- against the same steps with the two GEMMs priced as one launch each of our grouped_mm
kernel (what TorchTitan's `_grouped_mm(A, B_t, offs)` seam swaps; `moe/grouped_pricing.py`).
Routing "uniform" = exactly balanced, "skewed" = every token's first choice is expert 0.
Every figure is "modeled (cost model vN, trn2)" with the band over the cost model's
parameter sets; none is a measurement.
"""

from __future__ import annotations

import argparse
import time

from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import MOE_MODEL_SHAPES
from nki_kernels.moe.grouped_pricing import moe_layer_comparison

SHAPES = MOE_MODEL_SHAPES
TOKENS, LNC = 4096, 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Mixtral only")
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    print("| model | routing | native `_grouped_mm` layer (us) | with our grouped_mm (us) "
          "| speedup (band) | native GEMMs (us) | our GEMMs (us) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    part = TOKENS // LNC
    for s in shapes:
        for routing in ("uniform", "skewed"):
            t0 = time.time()
            counts = expert_counts(routing, part, s.num_experts, s.top_k)
            r = moe_layer_comparison(part, s.hidden, s.intermediate, s.num_experts, counts, "trn2")
            lo, hi = r.speedup_band
            print(
                f"| {s.model} | {routing} | {r.native_us:,.1f} | {r.ours_us:,.1f} | "
                f"{r.speedup:.3f}x ({lo:.3f}-{hi:.3f}) | {r.native_gemm_us:,.1f} | "
                f"{r.ours_gemm_us:,.1f} |",
                flush=True,
            )
            print(f"<!-- {s.model} {routing}: {time.time() - t0:.0f} s; {r.label} -->", flush=True)


if __name__ == "__main__":
    main()
