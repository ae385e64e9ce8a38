"""Flash attention: modeled latency, MFU and busiest engine on trn2 and trn3.

Run: `python benchmarks/bench_attention.py [--quick] [--json rows.json] [--check]
[--markdown] [--no-bands]`.

Prices the NKI forward and backward kernels with the cost model for Llama-3 8B
attention (B = 1, 32 query heads, 8 key/value heads, D = 128, bf16) at S = 2048, 8192,
32768, causal and not (`--quick`: 2048 and 8192). Every figure is "modeled (cost model
vN, target)", never a measurement, with its band over the cost model's parameter sets
(`perfmodel.band`) unless `--no-bands`. MFU counts only the FLOPs of allowed (query, key)
pairs. `--check` exits 1 when a goal is missed (modeled, trn2, bf16; issue 5: forward
>= 65 % at S = 8192 non-causal, causal forward >= 55 %, backward >= 45 %; backward
follow-up: >= 60 % at S = 2048 non-causal, causal >= 45 % at 2048 and >= 62 % at 8192;
pricing B = 1, H = 32, S = 8192 in < 60 s). The lead's `make bench` can call `run()`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from nki_kernels.attention.bench import (
    DEFAULT_SEQS,
    Row,
    attention_rows,
    format_table,
    markdown_table,
    price,
    rows_as_dicts,
)

# (op, causal, seq): MFU goal on trn2
GOALS = {
    ("fwd", False, 8192): 0.65,
    ("fwd", True, 8192): 0.55,
    ("bwd", False, 8192): 0.45,
    ("bwd", True, 8192): 0.62,
    ("bwd", False, 2048): 0.60,
    ("bwd", True, 2048): 0.45,
}
PRICING_LIMIT_S = 60.0


def run(quick: bool = False, bands: bool = False) -> list[Row]:
    """All benchmark rows (prints nothing); `bands`: each latency with its band."""
    seqs = DEFAULT_SEQS[:2] if quick else DEFAULT_SEQS
    return attention_rows(seqs=seqs, bands=bands)


def check(rows: list[Row]) -> list[str]:
    """Missed goals (empty when every goal is met)."""
    missed = []
    for r in rows:
        goal = GOALS.get((r.op, r.causal, r.seq))
        if r.target != "trn2" or goal is None:
            continue
        if r.mfu < goal:
            mfu, want = 100 * r.mfu, 100 * goal
            missed.append(
                f"{r.op} causal={r.causal} S={r.seq} trn2: MFU {mfu:.1f} % < {want:.0f} %"
            )
    t0 = time.perf_counter()
    price("fwd", 8192, "trn2", False, force="full")
    took = time.perf_counter() - t0
    if took > PRICING_LIMIT_S:
        missed.append(
            f"pricing B=1, H=32, S=8192 forward took {took:.0f} s > {PRICING_LIMIT_S:.0f} s"
        )
    return missed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="S = 2048 and 8192 only")
    p.add_argument("--json", metavar="PATH", help="also write the rows (with provenance)")
    p.add_argument("--check", action="store_true", help="exit 1 if an issue-5 goal is missed")
    p.add_argument(
        "--no-bands", action="store_true", help="skip the bands (about 6x faster pricing)"
    )
    p.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    args = p.parse_args(argv)
    rows = run(quick=args.quick, bands=not args.no_bands)
    print(markdown_table(rows) if args.markdown else format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_as_dicts(rows), f, indent=1)
    if args.check:
        missed = check(rows)
        for m in missed:
            print("MISSED:", m)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
