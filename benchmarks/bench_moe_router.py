"""MoE routing and row-gather benchmark: the NKI routing kernel (`moe/router_options.py`) with the
DeepSeek-V3-like (sigmoid, selection-only bias, 8 groups keep 4, renormalized, x 2.5),
Qwen3-MoE-like (softmax, renormalized) and GPT-OSS-like (softmax over the top-k logits)
options on each model's [T, E] router logits (fp32), forward and backward
(`moe/router_pricing.py`); then `moe_gated_experts`' dispatch and combine row gathers
(`moe/gather_pricing.py`) on one physical core's share (T / 2 tokens, bf16 rows), with
their fraction of HBM bandwidth (MBU).

Run: `python benchmarks/bench_moe_router.py [--targets trn2,trn3] [--tokens 4096]` (a
markdown table; seconds). One launch per phase, kernel[2] over all T tokens (LNC 2: T / 2
per physical core). Every figure is "modeled (cost model vN, target)" with the band over
the cost model's parameter sets widened by its structural error; none is a measurement.
"""

from __future__ import annotations

import argparse

from nki_kernels.moe.gather_pricing import price_dispatch_combine
from nki_kernels.moe.router_pricing import ROUTER_ROWS, router_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn2", help="comma-separated targets")
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    print("| target | model | T | E / k | forward (us, band) | forward busiest "
          "| backward (us, band) | softmax-only router.py forward (us) |")  # fmt: skip
    print("|---|---|---:|---|---:|---|---:|---:|")
    ek = {s.model: f"{s.num_experts} / {r.top_k}" for s, r, _ in ROUTER_ROWS}
    for r in router_rows(tuple(args.targets.split(",")), args.tokens):
        old = "-" if r.softmax_router_fwd_us is None else f"{r.softmax_router_fwd_us:,.1f}"
        print(
            f"| {r.target} | {r.model} | {r.tokens} | {ek[r.model]} | {r.fwd_us:,.1f} "
            f"({r.fwd_band[0]:,.1f}-{r.fwd_band[1]:,.1f}) | {r.fwd_busiest} | {r.bwd_us:,.1f} "
            f"({r.bwd_band[0]:,.1f}-{r.bwd_band[1]:,.1f}) | {old} |",
            flush=True,
        )
    print(f"\n{r.label.rsplit(',', 1)[0]}, per target); not measurements.\n")
    print("| target | model | tokens per core | H / k | dispatch (us, band) | MBU "
          "| combine (us, band) | MBU |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for target in args.targets.split(","):
        for s, router, _ in ROUTER_ROWS:
            part = args.tokens // 2
            d, c = price_dispatch_combine(part, s.hidden, router.top_k, target)
            print(
                f"| {target} | {s.model} | {part} | {s.hidden} / {router.top_k} | {d.us:,.1f} "
                f"({d.us_band[0]:,.1f}-{d.us_band[1]:,.1f}) | {d.mbu:.0%} | {c.us:,.1f} "
                f"({c.us_band[0]:,.1f}-{c.us_band[1]:,.1f}) | {c.mbu:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
