"""Masked attention and decode: modeled latency against the alternatives (trn2).

Run: `python benchmarks/bench_attention_masks.py [--quick] [--json rows.json]`.

Masks: document + causal, sliding window 1024, random block-sparse 50 %, at S = 2048 and
8192 (forward, Llama-3 8B attention, B = 1): our kernel with its block map, the same
kernel without skipping, and the S x S decomposition TorchNeuron runs for SDPA with a
mask tensor. Decode: Llama-3 8B, Sq = 1, batch 1 / 8 / 64, cache 2 K / 32 K / 128 K,
contiguous and paged, against the S x S decomposition at Sq = 1. Every figure is
"modeled (cost model vN, trn2)", never a measurement (`--quick`: S = 2048, caches 2 K and
32 K).
"""

from __future__ import annotations

import argparse
import json

from nki_kernels.attention.bench_masks import decode_rows, mask_rows, rows_as_dicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    mrows = mask_rows((2048,) if a.quick else (2048, 8192))
    drows = decode_rows(caches=(2048, 32768) if a.quick else (2048, 32768, 131072))
    print(f"{'mask':18s} {'S':>5s} {'method':22s} {'latency us':>11s} {'tiles %':>7s}")
    for r in mrows:
        print(
            f"{r.mask:18s} {r.seq:5d} {r.method:22s} {r.latency_us:11.1f} "
            f"{100 * r.tiles_computed:7.1f}"
        )
    print(
        f"\n{'method':30s} {'B':>3s} {'cache':>7s} {'paged':>5s} {'latency us':>11s} {'MBU %':>6s}"
    )
    for d in drows:
        print(
            f"{d.method:30s} {d.batch:3d} {d.cache:7d} {d.paged!s:>5s} {d.latency_us:11.1f} "
            f"{100 * d.mbu:6.1f}"
        )
    labels = sorted({r.label for r in [*mrows, *drows]})
    print(f"\nAll figures {', '.join(labels)}.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"masks": rows_as_dicts(mrows), "decode": rows_as_dicts(drows)}, f, indent=1)


if __name__ == "__main__":
    main()
