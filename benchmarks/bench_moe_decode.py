"""Decode-sized MoE (T = 1 / 8 / 64 tokens) through the decode MoE kernel: modeled time of
the experts launch and of the whole layer (our NKI router + the experts launch), and the
share of HBM bandwidth spent on the touched experts' weights.

Run: `python benchmarks/bench_moe_decode.py [model ...]` (prints a markdown table).

The experts launch is the decode mode of `moe_mlp` / `moe_experts` (dropless calls of
T <= 64, `ops/moe_decode.py`): `moe/decode_mlp.py`'s kernel, every touched expert's
weights streamed once as the matmuls' stationary operand, SwiGLU, the routing select and
the weighted fp32 combine on chip, at LNC 2 (the two programs take alternate touched
experts) on trn2, bf16, uniform routing (T * k assignments spread over the experts).
HBM % = touched experts' weight bytes (gate/up and down) / (latency x the logical core's
bandwidth, 2 x trn2's per-core HBM figure). The layer adds our router kernel (softmax,
renormalized top-k) on the T tokens. Every figure is "modeled (cost model vN, trn2)",
never a measurement; the band is the range over the cost model's parameter sets.
"""

from __future__ import annotations

import sys
import time

from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import (
    DEEPSEEK_V3_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
    MIXTRAL_8X7B_MOE,
    QWEN3_MOE_LIKE_MOE,
)
from nki_kernels.moe.decode_pricing import price_decode, router_latency
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target

SHAPES = (
    MIXTRAL_8X7B_MOE,
    DEEPSEEK_V3_LIKE_MOE,
    QWEN3_MOE_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
)
LNC = 2


def _pct(nbytes: float, lats: tuple[float, ...], bw: float) -> tuple[float, float, float]:
    pct = [100.0 * nbytes / (lat * bw) for lat in lats]
    return pct[0], min(pct), max(pct)


def main(models: list[str]) -> None:
    tgt = get_target("trn2")
    bw = LNC * tgt.hbm_bytes_per_ns  # bytes per ns of one logical core
    print(f"modeled (cost model {COST_MODEL_VERSION}, trn2), LNC {LNC}, bf16")
    print(
        "| model | T | touched experts | weight MB | experts kernel (us) | HBM % (band) "
        "| router (us) | layer (us) | layer HBM % (band) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in SHAPES:
        if models and s.model not in models:
            continue
        for t in (1, 8, 64):
            t0 = time.time()
            counts = expert_counts("uniform", t, s.num_experts, s.top_k)
            touched = sum(1 for c in counts if c)
            h, i = s.hidden, s.intermediate
            nbytes = touched * 3 * h * i * 2
            kern = price_decode(touched, t, h, i, s.num_experts, s.top_k, tgt, lnc=LNC)
            rout = router_latency(t, s.num_experts, s.top_k, tgt, LNC)
            layer = tuple(a + b for a, b in zip(kern.latency_ns, rout))
            k0, klo, khi = _pct(nbytes, kern.latency_ns, bw)
            l0, llo, lhi = _pct(nbytes, layer, bw)
            print(
                f"| {s.model} | {t} | {touched} | {nbytes / 1e6:,.1f} | "
                f"{kern.latency_ns[0] / 1e3:,.1f} | {k0:.1f} ({klo:.1f}-{khi:.1f}) | "
                f"{rout[0] / 1e3:,.1f} | {layer[0] / 1e3:,.1f} | {l0:.1f} ({llo:.1f}-{lhi:.1f}) |",
                flush=True,
            )
            print(f"<!-- {s.model} T={t}: {time.time() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
