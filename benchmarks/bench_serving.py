"""Modeled latency of the serving kernel against the plain composition (trn2, bands).

    PYTHONPATH=. python benchmarks/bench_serving.py [--target trn2]

One Llama-3 8B attention layer (Hq 32, Hkv 8, D 128, bf16), paged cache of 16-key
blocks in vLLM's layout ("nhd") or vLLM-Neuron's ("hnd": a head's block is one run, so
the grouped gathers move 1 KiB per 4 keys), per case:

* fused: `serving_attention_fwd` writing the step's new K / V and attending, one launch;
* composition: the write alone (`cache_write_fwd`) + the attention alone (the same
  kernel without the write), two launches (latencies summed);
* decode cases also: the write + the project's decode kernel (`decode_attention_fwd`,
  its heuristic config), the closest existing kernel for those rows.

AWS's `attention_tkg` (nki-library's token-generation attention): its committed modeled
rows (`benchmarks/data/decode_aws_rows.json`, priced through `bench/peer_decode.py`'s
harness at nki-library d2ad3a57, one Llama-3 8B layer = 8 calls, s_active = 1, paged
16-key blocks) are shown for the decode row; it writes no cache. Pricing it for the
other rows (s_active = 4, prefill chunks) or AWS's segmented CTE needs a local
nki-library checkout, absent on this machine.
Every figure is modeled (cost model, target, band over the parameter sets); none is a
measurement.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from nki_kernels.attention.decode import decode_attention_fwd
from nki_kernels.attention.decode_host import DecodeConfig, DecodeProblem, kernel_args
from nki_kernels.bench.bands import parameter_sets, replayed_traces
from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import COST_MODEL_VERSION, estimate
from nki_kernels.serving.cache_write import cache_write_fwd
from nki_kernels.serving.host import key_step
from nki_kernels.serving.segmented import serving_attention_fwd

HQ, HKV, D, BS = 32, 8, 128, 16
CASES = {  # name: (sequences, cached keys each, new tokens each, cache dtype, layout)
    "decode 8 x 1, 2K cached, vLLM layout (nhd)": (8, 2048, 1, "bfloat16", "nhd"),
    "decode 8 x 1, 2K cached, vLLM-Neuron layout (hnd)": (8, 2048, 1, "bfloat16", "hnd"),
    "decode 8 x 1, 2K cached, hnd, fp8 e4m3 cache": (8, 2048, 1, "float8_e4m3fn", "hnd"),
    "speculative 8 x 4 drafts, 2K cached, hnd": (8, 2048, 4, "bfloat16", "hnd"),
    "chunked prefill 1 x 256 after 1K prefix, hnd": (1, 1024, 256, "bfloat16", "hnd"),
}


def _specs(seqs: int, ctx: int, new: int, cache_dt: str, layout: str) -> dict[str, object]:
    group = HQ // HKV
    tq = min(128 // group, new)
    items = seqs * -(-new // tq)
    kv_tile = key_step(ctx + new)
    steps = -(-(ctx + new) // kv_tile)
    grouped = kv_tile == 512 and BS % 4 == 0  # as serving.host.step_key_tiles
    blocks = seqs * -(-(ctx + new) // BS) + 1
    t_tok = seqs * new
    return {
        "q_t": TensorSpec((items, HKV, D, group * tq), "bfloat16"),
        "new": TensorSpec((t_tok, HKV * D), "bfloat16"),
        "cache": TensorSpec(
            (blocks, BS, HKV, D) if layout == "nhd" else (blocks, HKV, BS, D), cache_dt
        ),
        "wrows": TensorSpec((t_tok, 1), "int32"),
        "krows": TensorSpec((items, steps, 128, 1 if grouped else kv_tile // 128), "int32"),
        "kmask": TensorSpec((items, steps, 128, 4), "uint8") if grouped else None,
        "info": TensorSpec((items, HKV, 128, 4), "float32"),
        "scales": TensorSpec((HKV, 4), "float32"),
        "steps": steps,
        "kv_tile": kv_tile,
        "fp8": 448.0 if cache_dt.startswith("float8") else 0.0,
    }


def _us(kernel, *args, target) -> float:  # type: ignore[no-untyped-def]
    return estimate(kernel, *args, target=target).latency_ns / 1e3


def price(case: str, target) -> dict[str, float]:  # type: ignore[no-untyped-def]
    seqs, ctx, new, cdt, layout = CASES[case]
    s = _specs(seqs, ctx, new, cdt, layout)
    attend = (s["q_t"], None, None, s["cache"], s["cache"], None, s["krows"], s["kmask"], s["info"],
              s["scales"], layout, s["steps"], s["kv_tile"], s["fp8"])  # fmt: skip
    fused = list(attend)
    fused[1], fused[2], fused[5] = s["new"], s["new"], s["wrows"]
    row = {
        "fused": _us(serving_attention_fwd, *fused, target=target),
        "write": _us(
            cache_write_fwd,
            s["new"],
            s["new"],
            s["cache"],
            s["cache"],
            s["wrows"],
            s["scales"],
            layout,
            s["fp8"],
            target=target,
        ),
        "attend": _us(serving_attention_fwd, *attend, target=target),
    }
    if new <= 4 and cdt == "bfloat16":
        prob = DecodeProblem(seqs, HQ, HKV, new, ctx + new, D, "bfloat16", "paged")
        cfg = DecodeConfig.heuristic(replace(prob, batch=1), target)
        row["decode"] = _us(decode_attention_fwd, *kernel_args(prob, cfg, BS), target=target)
    return row


AWS_ROWS = Path(__file__).resolve().parent / "data" / "decode_aws_rows.json"


def aws_tkg(target: str, batch: int, cache: int) -> str:
    """AWS attention_tkg's committed modeled row (paged), as 'latency [band]', or '-'."""
    for r in json.loads(AWS_ROWS.read_text())["rows"]:
        if (r["target"], r["batch"], r["cache"], r["paged"]) == (target, batch, cache, True):
            lo, hi = r["band_us"]
            return f"{r['latency_us']:.1f} [{lo:.1f}, {hi:.1f}]"
    return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn2")
    args = ap.parse_args()
    sets = parameter_sets(args.target)
    print(f"modeled (cost model {COST_MODEL_VERSION}, {args.target}; band over {len(sets)} "
          "parameter sets); one Llama-3 8B layer, bf16 queries, 16-key blocks")  # fmt: skip
    print("| case | fused write + attend (us) | write + attend, 2 launches (us) "
          "| write + decode kernel (us) | AWS attention_tkg, no write (us) "
          "| fused / composition |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for case in CASES:
        with replayed_traces():
            runs = [price(case, t) for t in sets]
        fused = _band([r["fused"] for r in runs])
        comp = _band([r["write"] + r["attend"] for r in runs])
        dec = _band([r["write"] + r["decode"] for r in runs]) if "decode" in runs[0] else "-"
        ratio = [r["fused"] / (r["write"] + r["attend"]) for r in runs]
        seqs, ctx, new, cdt, _ = CASES[case]
        aws = aws_tkg(args.target, seqs, ctx) if new == 1 and cdt == "bfloat16" else "-"
        print(f"| {case} | {fused} | {comp} | {dec} | {aws} | "
              f"x{ratio[0]:.2f} [{min(ratio):.2f}, {max(ratio):.2f}] |")  # fmt: skip


def _band(v: list[float]) -> str:
    """The shipped set's figure and [the range over every set]."""
    return f"{v[0]:.1f} [{min(v):.1f}, {max(v):.1f}]"


if __name__ == "__main__":
    main()
