"""Decode-sized MoE (T = 1 / 8 / 64 tokens) through the grouped_mm kernel: modeled time of
the two grouped GEMMs and the share of HBM bandwidth spent on the touched experts' weights.

Run: `python benchmarks/bench_moe_decode.py` (prints a markdown table; ~2 min).

These are the two launches of the decode mode of `moe_mlp` / `moe_experts` (dropless calls
of T <= 64, `ops/moe_decode.py`): `torch.ops.nki.grouped_mm` at decode sizes (each touched
expert one block of one 128-row sub-tile, its weights streamed once in wide units;
untouched experts cost nothing), at LNC 2 (the two programs take alternate blocks) on
trn2, bf16, uniform routing (T * k assignments spread over the experts). HBM % = touched
experts' weight bytes (gate/up and down) / (latency x the logical core's bandwidth, 2 x
trn2's per-core HBM figure). Every figure is "modeled (cost model vN, trn2)", never a
measurement; the router and the mode's torch steps (gather, activation, combine) are not
included.
"""

from __future__ import annotations

import time

from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import (
    DEEPSEEK_V3_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
    MIXTRAL_8X7B_MOE,
    QWEN3_MOE_LIKE_MOE,
)
from nki_kernels.moe.grouped_pricing import price_grouped_mm
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target

SHAPES = (
    MIXTRAL_8X7B_MOE,
    DEEPSEEK_V3_LIKE_MOE,
    QWEN3_MOE_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
)
LNC = 2


def main() -> None:
    tgt = get_target("trn2")
    bw = LNC * tgt.hbm_bytes_per_ns  # bytes per ns of one logical core
    print(f"modeled (cost model {COST_MODEL_VERSION}, trn2), LNC {LNC}, bf16")
    print("| model | T | touched experts | weight MB | GEMMs (us) | HBM % (band) |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in SHAPES:
        for t in (1, 8, 64):
            t0 = time.time()
            counts = expert_counts("uniform", t, s.num_experts, s.top_k)
            touched = sum(1 for c in counts if c)
            h, i = s.hidden, s.intermediate
            nbytes = touched * 3 * h * i * 2
            gu = price_grouped_mm(counts, h, 2 * i, tgt, lnc=LNC)
            dn = price_grouped_mm(counts, i, h, tgt, lnc=LNC)
            lats = [a + b for a, b in zip(gu.latency_ns, dn.latency_ns)]
            pct = [100.0 * nbytes / (lat * bw) for lat in lats]
            print(
                f"| {s.model} | {t} | {touched} | {nbytes / 1e6:,.1f} | {lats[0] / 1e3:,.1f} | "
                f"{pct[0]:.1f} ({min(pct):.1f}-{max(pct):.1f}) |",
                flush=True,
            )
            print(f"<!-- {s.model} T={t}: {time.time() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
