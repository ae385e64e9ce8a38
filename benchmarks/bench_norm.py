"""Fused norms: modeled latency of each NKI kernel and its share of the HBM-bandwidth bound.

Run: `python benchmarks/bench_norm.py [--quick] [--json rows.json] [--check] [--markdown]
[--no-bands]`.

Prices every norm kernel (forward, backward, and the statistics kernel the ops' backward
uses to recompute rstd / mean) with the cost model on trn2, one NeuronCore, bf16, for
Llama-sized shapes: hidden 4096 and 8192, 2K to 32K tokens (`--quick`: 4K and 16K). The
config is the one the op would use (config store, else the heuristic default).

"% of bound" = the HBM-bandwidth bound / the modeled latency, where the bound is the
time to move the kernel's essential bytes (each input read once, each output written
once: e.g. rms_norm fwd reads x and w and writes y and rstd) at the target's HBM
bandwidth. Every latency is "modeled (cost model vN, trn2)", never a measurement, with
its band over the cost model's parameter sets unless `--no-bands`.
`--check` exits 1 when issue 4's goal is missed: rms_norm forward at [16384, 4096] bf16
on trn2 >= 85 % of the bound. The lead's `make bench` can call `run()` / `table()`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from nki_kernels.norm.bench import QUICK_TOKENS, check, markdown_table, run, table

# the README's shapes ([tokens, hidden])
README_SHAPES = [(16384, 4096), (2048, 4096), (16384, 8192)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS} only")
    p.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    p.add_argument("--json", metavar="PATH", help="also write the rows")
    p.add_argument("--check", action="store_true", help="exit 1 if issue 4's goal is missed")
    p.add_argument(
        "--no-bands", action="store_true", help="skip the bands (about 6x faster pricing)"
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="price the README's shapes only and print its markdown table",
    )
    args = p.parse_args(argv)
    tokens = tuple(sorted({n for n, _ in README_SHAPES})) if args.markdown else None
    rows = run(quick=args.quick, target=args.target, bands=not args.no_bands, tokens=tokens)
    print(markdown_table(rows, README_SHAPES) if args.markdown else table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    if args.check:
        missed = check(rows)
        for m in missed:
            print("MISSED:", m)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
