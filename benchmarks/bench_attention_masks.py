"""Masked attention and decode: modeled latency with bands against the alternatives (trn2).

Run: `python benchmarks/bench_attention_masks.py [--quick] [--json rows.json]
[--nki-library PATH] [--aws-data FILE] [--only masks|decode]`.

Masks: document + causal, sliding window 1024, ALiBi + causal, random block-sparse 50 %,
at S = 2048 and 8192 (forward, Llama-3 8B attention, B = 1): our kernel with its block
map, the same kernel without skipping (our dense path), and the S x S decomposition
TorchNeuron runs for SDPA with a mask tensor. Decode: Llama-3 8B, Sq = 1, batch 1 / 8 /
64, cache 2 K / 32 K / 128 K, contiguous and paged: ours, nki-library's attention_tkg
(through `nki_kernels.bench.peer_decode`; `--nki-library` re-prices it from a local
checkout and rewrites `--aws-data`, default benchmarks/data/decode_aws_rows.json,
otherwise the committed rows are shown) and the S x S decomposition at Sq = 1. Every
figure is "modeled (cost model vN, trn2)" with its band, never a measurement
(`--quick`: S = 2048, caches 2 K and 32 K).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nki_kernels.attention.bench_masks import (
    AWS_TKG,
    DecodeRow,
    aws_decode_rows,
    decode_rows,
    mask_rows,
    rows_as_dicts,
)
from nki_kernels.bench.peer import checkout_commit
from nki_kernels.perfmodel import COST_MODEL_VERSION

AWS_DATA = Path(__file__).resolve().parent / "data" / "decode_aws_rows.json"


def _aws(a: argparse.Namespace, caches: tuple[int, ...]) -> list[DecodeRow]:
    path = Path(a.aws_data)
    if a.nki_library:
        rows = []
        for cache in caches:
            for paged in (False, True):
                rows += aws_decode_rows(a.nki_library, (1, 8, 64), cache, paged, "trn2")
        head = {
            "cost_model": COST_MODEL_VERSION,
            "nki_library_commit": checkout_commit(Path(a.nki_library)),
            "harness": "nki_kernels.bench.peer_decode.tkg_harness",
        }
        path.write_text(json.dumps({**head, "rows": rows_as_dicts(rows)}, indent=1) + "\n")
        return rows
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    out = []
    for r in data["rows"]:
        if r["cache"] in caches:
            r["band_us"] = tuple(r["band_us"])
            out.append(DecodeRow(**r))
    return out


def _band(lo: float, hi: float) -> str:
    return f"({lo:,.1f}-{hi:,.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--nki-library", default=None, help="aws-neuron/nki-library checkout")
    ap.add_argument("--aws-data", default=str(AWS_DATA))
    ap.add_argument("--only", choices=("masks", "decode"), default=None)
    a = ap.parse_args()
    caches = (2048, 32768) if a.quick else (2048, 32768, 131072)
    mrows = [] if a.only == "decode" else mask_rows((2048,) if a.quick else (2048, 8192))
    drows = [] if a.only == "masks" else decode_rows(caches=caches) + _aws(a, caches)
    print(f"{'mask':18s} {'S':>5s} {'method':28s} {'latency us (band)':>30s} {'tiles %':>7s}")
    for r in mrows:
        print(
            f"{r.mask:18s} {r.seq:5d} {r.method:28s} {r.latency_us:12,.1f} "
            f"{_band(*r.band_us):>17s} {100 * r.tiles_computed:7.1f}"
        )
    print(
        f"\n{'method':30s} {'B':>3s} {'cache':>7s} {'paged':>5s} {'latency us (band)':>30s} "
        f"{'MBU %':>6s}"
    )
    for d in sorted(drows, key=lambda d: (d.cache, d.paged, d.batch, d.method)):
        lat = f"{d.latency_us:12,.1f} {_band(*d.band_us):>17s}"
        extra = f"  [{d.note}]" if d.method == AWS_TKG and d.note else ""
        print(
            f"{d.method:30s} {d.batch:3d} {d.cache:7d} {d.paged!s:>5s} {lat:>30s} "
            f"{100 * d.mbu:6.1f}{extra}"
        )
    labels = sorted({r.label for r in [*mrows, *drows]})
    print(f"\nAll figures {', '.join(labels)}; bands over the cost model's parameter sets.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"masks": rows_as_dicts(mrows), "decode": rows_as_dicts(drows)}, f, indent=1)


if __name__ == "__main__":
    main()
