"""Decode-sized MoE with a shared expert (T = 1 / 8 / 64): the shared expert fused into the
decode MoE kernel's launch (`moe_gated_decode`, what `moe_gated_experts` runs for T <= 64
without gradients) vs the routed experts' decode launch plus the shared expert's own
launches (one-group `grouped_mm`s and `expert_act`, the sigmoid gate's logits a
one-group grouped_mm with N = 1, a native pass adding it in): `moe/decode_pricing.py`'s
`shared_decode_comparison`.

Run: `python benchmarks/bench_moe_decode_shared.py [--targets trn2,trn3] [--layouts
rows,hf]` (a markdown table; a few minutes). Layout "rows": row-major weights; "hf": the
weights as transformers stores them (experts [E, 2I, H] / [E, H, I], the shared expert's
nn.Linear gate / up [Is, H] and down [H, Is]), read by the kernel's DMA transposes in
both launches -- what a patched HF model's decode runs (the shared expert's own launches
stay priced on row-major weights, which favours the unfused side). LNC 2, bf16, SwiGLU,
uniform routing. Shared HBM % = the shared expert's weight bytes over the time it adds
to the routed-only launch, at the logical core's bandwidth (marked `ceiling` above the
best published DMA utilization, as in bench_moe_decode.py). Every figure is "modeled
(cost model vN, target)"; latency bands are the range over the cost model's parameter
sets, the speedup band that range widened by the structural error of a ratio of two
modeled figures; none is a measurement.
"""

from __future__ import annotations

import argparse

from nki_kernels.bench.bands import ceiling_label
from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import DEEPSEEK_V3_LIKE_MOE, QWEN3_MOE_LIKE_MOE
from nki_kernels.moe.decode_pricing import shared_decode_comparison

ROWS = (
    (DEEPSEEK_V3_LIKE_MOE, 2048, False, "ungated shared expert (I)"),
    (QWEN3_MOE_LIKE_MOE, 3072, True, "sigmoid-gated shared expert (4 I)"),
)
TOKENS, LNC = (1, 8, 64), 2
OP = "moe decode"  # a share above the best published DMA utilization is a ceiling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn2", help="comma-separated targets")
    ap.add_argument("--layouts", default="rows", help="comma-separated: rows, hf")
    args = ap.parse_args()
    print("| target | layout | model | shared expert | T | touched | fused (us, band) "
          "| unfused (us, band) | fused speedup (band) | shared HBM % |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    jobs = [
        (target, layout, row, t)
        for target in args.targets.split(",")
        for layout in args.layouts.split(",")
        for row in ROWS
        for t in TOKENS
    ]
    for target, layout, (s, si, gated, what), t in jobs:
        touched = sum(1 for c in expert_counts("uniform", t, s.num_experts, s.top_k) if c)
        r = shared_decode_comparison(touched, t, s.hidden, s.intermediate, s.num_experts,
                                     s.top_k, si, gated, target, lnc=LNC,
                                     layout=layout)  # fmt: skip
        share = ceiling_label(f"{100 * r.shared_hbm:.1f}", OP, hbm_fraction=r.shared_hbm)
        print(
            f"| {target} | {layout} | {s.model} | {what} | {t} | {touched} | "
            f"{r.fused_us:,.1f} ({r.fused_band[0]:,.1f}-{r.fused_band[1]:,.1f}) | "
            f"{r.unfused_us:,.1f} ({r.unfused_band[0]:,.1f}-{r.unfused_band[1]:,.1f}) | "
            f"{r.speedup:.3f}x ({r.speedup_band[0]:.2f}-{r.speedup_band[1]:.2f}) | {share} |",
            flush=True,
        )
    print(f"\nAll figures {r.label.split(',')[0]}, target) -- not measurements.")


if __name__ == "__main__":
    main()
