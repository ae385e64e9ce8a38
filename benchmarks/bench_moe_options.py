"""MoE expert options benchmark: GPT-OSS-like (expert biases + the clamped SwiGLU),
Qwen3-MoE-like (+ a Qwen2-MoE-style sigmoid-gated shared expert) and DeepSeek-V3-like
(+ its ungated shared expert) layers on
`moe_gated_experts` vs TorchNeuron's native `_grouped_mm` composition with the same
options as fused elementwise passes (`moe/options_pricing.py`).

Run: `python benchmarks/bench_moe_options.py [--targets trn2,trn3]` (a markdown table;
~15 min). Per physical core at LNC 2 (T = 4096 in all, 2048 per core), bf16. Every figure
is "modeled (cost model vN, target)" with the band over the cost model's parameter sets;
none is a measurement.
"""

from __future__ import annotations

import argparse
import time

from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import DEEPSEEK_V3_LIKE_MOE, GPT_OSS_LIKE_MOE, QWEN3_MOE_LIKE_MOE
from nki_kernels.moe.options_pricing import Options, fused_shared_us, options_comparison

ROWS = (
    (GPT_OSS_LIKE_MOE,
     Options("gpt_oss", biases=True), "biases + clamped SwiGLU"),
    (QWEN3_MOE_LIKE_MOE,
     Options("swiglu", shared_inter=3072, shared_gated=True), "sigmoid-gated shared expert (4 I)"),
    (DEEPSEEK_V3_LIKE_MOE,
     Options("swiglu", shared_inter=2048), "ungated shared expert (I)"),
)  # fmt: skip
TOKENS, LNC = 4096, 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn2", help="comma-separated targets")
    args = ap.parse_args()
    print("| target | model | options | routing | native layer (us) | ours (us) "
          "| speedup (band) | native option work (us) | ours (us) "
          "| ours, shared expert stacked into the routed launches (us) |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    part = TOKENS // LNC
    for target in args.targets.split(","):
        for s, o, what in ROWS:
            for routing in ("uniform", "skewed"):
                t0 = time.time()
                counts = expert_counts(routing, part, s.num_experts, s.top_k)
                r = options_comparison(part, s.hidden, s.intermediate, s.num_experts, counts,
                                       o, target)  # fmt: skip
                lo, hi = r.speedup_band
                stacked = "-"
                if o.shared_inter:
                    us, _ = fused_shared_us(part, s.hidden, s.intermediate, s.num_experts,
                                            counts, o, target)  # fmt: skip
                    stacked = f"{us:,.1f}"
                print(
                    f"| {target} | {s.model} | {what} | {routing} | {r.native_us:,.1f} | "
                    f"{r.ours_us:,.1f} | {r.speedup:.3f}x ({lo:.2f}-{hi:.2f}) | "
                    f"{r.native_option_us:,.1f} | {r.ours_option_us:,.1f} | {stacked} |",
                    flush=True,
                )
                print(f"<!-- {time.time() - t0:.0f} s; {r.label} -->", flush=True)


if __name__ == "__main__":
    main()
