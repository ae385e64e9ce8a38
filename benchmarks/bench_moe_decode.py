"""Decode-sized MoE (T = 1 / 8 / 64 tokens) through the decode MoE kernel: modeled time of
the experts launch and of the whole layer (our NKI router + the experts launch), the
share of HBM bandwidth spent on the touched experts' weights, and AWS's `moe_tkg`.

Run: `python benchmarks/bench_moe_decode.py [--nki-library PATH] [--models m1,m2]`
(prints markdown tables; with a checkout it also prices nki-library's moe_tkg and writes
`benchmarks/data/moe_decode_rows.json`).

The experts launch is the decode mode of `moe_mlp` / `moe_experts` (dropless calls of T
<= 64, `ops/moe_decode.py`): `moe/decode_mlp.py`'s kernel, every touched expert's
weights streamed once as the matmuls' stationary operand, SwiGLU, the routing select and
the weighted fp32 combine on chip, at LNC 2 (the two programs take alternate touched
experts) on trn2, bf16, uniform routing (T * k assignments spread over the experts). HBM
% = touched experts' weight bytes (gate/up and down) / (latency x the logical core's
bandwidth, 2 x trn2's per-core HBM figure); its band is the range over the cost model's
parameter sets. "HF layout" prices the same launch on the weights as transformers stores
them ([E, 2I, H] / [E, H, I], read where they lie by the kernel's DMA transposes: what a
patched HF model's decode runs, no copy). The layer adds our router kernel (softmax,
renormalized top-k) on the T tokens. AWS's moe_tkg (`bench/peer_moe_decode.py`:
selective mode everywhere, all-expert mode where every expert is touched) runs the same
experts computation from the same routing; ours / moe_tkg is a ratio of two modeled
figures, its band the range over the parameter sets widened by the cost model's
structural error of two figures (`bench.bands.ratio_band`). Every figure is "modeled
(cost model vN, trn2)", never a measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from nki_kernels.bench.bands import ceiling_label, ratio_band
from nki_kernels.bench.compare import expert_counts
from nki_kernels.model_shapes import (
    DEEPSEEK_V3_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
    MIXTRAL_8X7B_MOE,
    QWEN3_MOE_LIKE_MOE,
    MoEShape,
)
from nki_kernels.moe.decode_pricing import price_decode, router_latency
from nki_kernels.perfmodel import COST_MODEL_VERSION
from nki_kernels.targets import get_target

# per-rank expert slices from moe_tkg's own tests (nki-library @ d2ad3a57,
# test_moe_tkg.py's model rows: "qwen3_235b" H 4096, I 192, 8 local experts; "gptoss_120b"
# H 3072, I 384, 8 local experts), with the models' top-k over the local experts
QWEN3_235B_RANK = MoEShape(
    "qwen3-235b per rank", hidden=4096, intermediate=192, num_experts=8, top_k=8
)
GPT_OSS_120B_RANK = MoEShape(
    "gpt-oss-120b per rank", hidden=3072, intermediate=384, num_experts=8, top_k=4
)
SHAPES = (
    MIXTRAL_8X7B_MOE,
    DEEPSEEK_V3_LIKE_MOE,
    QWEN3_MOE_LIKE_MOE,
    GPT_OSS_LIKE_MOE,
    QWEN3_235B_RANK,
    GPT_OSS_120B_RANK,
)
LNC = 2
OP = "moe decode"
TOKENS = (1, 8, 64)
DATA = Path(__file__).parent / "data" / "moe_decode_rows.json"


def _pct(nbytes: float, lats: tuple[float, ...], bw: float) -> str:
    """'shipped (lo-hi)' HBM %, marked a ceiling above the best published DMA utilization."""
    pct = [100.0 * nbytes / (lat * bw) for lat in lats]
    text = ceiling_label(f"{pct[0]:.1f}", OP, hbm_fraction=pct[0] / 100.0)
    return f"{text} ({min(pct):.1f}-{max(pct):.1f})"


def ours_rows(models: list[str], routing: str = "uniform") -> list[dict]:
    tgt = get_target("trn2")
    rows = []
    for s in SHAPES:
        if models and s.model not in models:
            continue
        for t in TOKENS:
            counts = expert_counts(routing, t, s.num_experts, s.top_k)
            touched = sum(1 for c in counts if c)
            h, i = s.hidden, s.intermediate
            kern = price_decode(touched, t, h, i, s.num_experts, s.top_k, tgt, lnc=LNC)
            hf = price_decode(touched, t, h, i, s.num_experts, s.top_k, tgt, lnc=LNC,
                              layout="hf")  # fmt: skip
            rout = router_latency(t, s.num_experts, s.top_k, tgt, LNC)
            rows.append(
                {
                    "model": s.model,
                    "tokens": t,
                    "touched": touched,
                    "weight_bytes": touched * 3 * h * i * 2,
                    "kernel_ns": list(kern.latency_ns),
                    "kernel_hf_ns": list(hf.latency_ns),
                    "router_ns": list(rout),
                }
            )
    return rows


def aws_columns(rows: list[dict], checkout: str, log: bool = True) -> None:
    from nki_kernels.bench.peer import checkout_commit
    from nki_kernels.bench.peer_moe_decode import price_moe_tkg

    shapes = {s.model: s for s in SHAPES}
    commit = checkout_commit(Path(checkout))
    for r in rows:
        t0 = time.time()
        s = shapes[r["model"]]
        sel = price_moe_tkg(checkout, s, r["tokens"], "trn2", LNC)
        r["moe_tkg"] = {"commit": commit, "selective": _tkg(sel)}
        if r["touched"] == s.num_experts:
            full = price_moe_tkg(checkout, s, r["tokens"], "trn2", LNC, all_expert=True)
            r["moe_tkg"]["all_expert"] = _tkg(full)
        if log:
            print(
                f"<!-- moe_tkg {r['model']} T={r['tokens']}: {time.time() - t0:.0f} s -->",
                flush=True,
            )


def _reason(error: str) -> str:
    """The kernel's own validation message, without the wrapper text around it."""
    msg = error.split("Kernel validation exception: ")[-1].split(" - Please")[0]
    if msg.startswith("MemoryPlanError: "):  # our interpreter's SBUF plan: the tile and sizes
        msg = msg.split(", even with")[0].replace("MemoryPlanError: ", "")
        msg = msg.split(" from ")[0] + " (" + msg.split(" needs ")[-1] + ")"
    return msg


def _tkg(p) -> dict:  # type: ignore[no-untyped-def]
    return {"samples_us": list(p.samples_us), "method": p.method, "error": p.error}


def print_tables(rows: list[dict]) -> None:
    tgt = get_target("trn2")
    bw = LNC * tgt.hbm_bytes_per_ns  # bytes per ns of one logical core
    print(f"modeled (cost model {COST_MODEL_VERSION}, trn2), LNC {LNC}, bf16")
    print(
        "| model | T | touched experts | weight MB | experts kernel (us) | HBM % (band) "
        "| router (us) | layer (us) | layer HBM % (band) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        kern, rout = tuple(r["kernel_ns"]), tuple(r["router_ns"])
        layer = tuple(a + b for a, b in zip(kern, rout))
        nb = r["weight_bytes"]
        print(
            f"| {r['model']} | {r['tokens']} | {r['touched']} | {nb / 1e6:,.1f} | "
            f"{kern[0] / 1e3:,.1f} | {_pct(nb, kern, bw)} | "
            f"{rout[0] / 1e3:,.1f} | {layer[0] / 1e3:,.1f} | {_pct(nb, layer, bw)} |"
        )
    if any("kernel_hf_ns" in r for r in rows):
        print()
        print("| model | T | experts kernel (us) | HF layout (us, band) | HF layout HBM % (band) "
              "| HF / row-major (band) |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            if "kernel_hf_ns" not in r:
                continue
            kern, hf = tuple(r["kernel_ns"]), tuple(r["kernel_hf_ns"])
            ratio = [b / a for a, b in zip(kern, hf)]
            print(
                f"| {r['model']} | {r['tokens']} | {kern[0] / 1e3:,.1f} | {hf[0] / 1e3:,.1f} "
                f"({min(hf) / 1e3:,.1f}-{max(hf) / 1e3:,.1f}) | {_pct(r['weight_bytes'], hf, bw)} "
                f"| {ratio[0]:.3f}x ({min(ratio):.3f}-{max(ratio):.3f}) |"
            )
    if not any("moe_tkg" in r for r in rows):
        return
    print()
    print(
        "| model | T | ours (us) | moe_tkg selective (us) | moe_tkg all-expert (us) "
        "| moe_tkg HBM % (band) | moe_tkg / ours (band) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r.get("moe_tkg")
        if m is None:
            continue
        ours = [x / 1e3 for x in r["kernel_ns"]]
        cells, best = [], None
        for mode in ("selective", "all_expert"):
            p = m.get(mode)
            if p is None:
                cells.append("-")
            elif p["error"]:
                cells.append(f"does not run: {_reason(p['error'])}")
            else:
                note = "" if p["method"] == "exact" else " (extrap.)"
                cells.append(f"{p['samples_us'][0]:,.1f}{note}")
                if best is None or p["samples_us"][0] < best[0]:
                    best = p["samples_us"]
        if best is None:
            head = f"| {r['model']} | {r['tokens']} | {ours[0]:,.1f}"
            print(f"{head} | {cells[0]} | {cells[1]} | - | - |")
            continue
        pct = _pct(r["weight_bytes"], tuple(x * 1e3 for x in best), bw)
        lo, hi = ratio_band(ours, best, tgt)
        print(
            f"| {r['model']} | {r['tokens']} | {ours[0]:,.1f} | {cells[0]} | {cells[1]} | "
            f"{pct} | {best[0] / ours[0]:.2f}x ({lo:.2f}-{hi:.2f}) |"
        )


def _save(rows: list[dict]) -> None:
    """Merge `rows` into DATA (a row replaces the stored one of its model and T)."""
    kept = json.loads(DATA.read_text())["rows"] if DATA.exists() else []
    new = {(r["model"], r["tokens"]) for r in rows}
    kept = [r for r in kept if (r["model"], r["tokens"]) not in new] + rows
    order = {s.model: j for j, s in enumerate(SHAPES)}
    kept.sort(key=lambda r: (order[r["model"]], r["tokens"]))
    label = f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    DATA.write_text(json.dumps({"provenance": label, "lnc": LNC, "rows": kept}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nki-library", default=None, help="an aws-neuron/nki-library checkout")
    ap.add_argument("--models", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--from-data", action="store_true", help=f"print the tables of {DATA.name}")
    ap.add_argument("--skewed", action="store_true", help="our kernel under skewed routing")
    a = ap.parse_args()
    if a.skewed:  # fewer touched experts: the fixed cost weighs more (not stored)
        print("skewed routing (moe.pricing.routing_ids)")
        print_tables(ours_rows([m.strip() for m in a.models.split(",") if m.strip()], "skewed"))
        return
    if a.from_data:
        print_tables(json.loads(DATA.read_text())["rows"])
        return
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    rows = ours_rows(models)
    if a.nki_library:
        aws_columns(rows, a.nki_library)
    elif DATA.exists():  # ours re-priced: keep the stored moe_tkg figures
        stored = {(r["model"], r["tokens"]): r for r in json.loads(DATA.read_text())["rows"]}
        for r in rows:
            old = stored.get((r["model"], r["tokens"]), {})
            if "moe_tkg" in old:
                r["moe_tkg"] = old["moe_tkg"]
    _save(rows)
    print_tables(rows)


if __name__ == "__main__":
    main()
